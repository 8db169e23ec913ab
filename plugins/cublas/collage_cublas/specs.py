"""What a cuBLAS operator group computes, as one cuBLASLt problem in column-major terms, or why it cannot.

Relax's ``matmul`` is row-major: ``out[b, i, j] = sum_k lhs[b, i, k] * rhs[b, k, j]``. cuBLASLt is
column-major, so the problem is handed over transposed: ``D (N x M) = op(a) (N x K) . op(b) (K x M)``
with ``a`` the right operand and ``b`` the left, and ``D`` is then the row-major output as it
lies in memory. Each operand is read in place through strides: a ``permute_dims`` in the group
(attention's Kᵀ, the head split of Q, K and V) becomes a transpose flag, a leading dimension and
batch strides. Batch dimensions that cannot be merged into one strided batch are looped over
(at most one such outer loop). A constant operand (a weight) whose rows are not 16 bytes apart is read
from its transpose where that one's rows are, or else from a copy padded with zeros to that width: cuBLASLt's
fast kernels need them aligned; an output whose rows are not
(GPT-2's logits) may be written to a padded buffer and copied into place, which the runtime's tuning decides; a
K-major weight is then stored with zero rows to the padded width, so that the padded product is all aligned. The
epilogue (scale as alpha, bias, residual as C with beta 1,
ReLU or tanh GELU) is cuBLASLt's; erf GELU is refused (cuBLASLt's GELU is the tanh form). The
operands are float32, or bfloat16 or float16 accumulating into a float32 result; with 16-bit operands
the group may cast that result to 16 bits first (as TVM's mixed-precision pass does), and D, the bias and
the residual are then of that type (the epilogue still computes in float32). A TF32 problem (``tf32``,
the ``_tf32`` patterns of ``--precision tf32``) takes float32 operands only and has cuBLASLt round them
to TF32 on the tensor cores (``CUBLAS_COMPUTE_32F_FAST_TF32``). A float32 dense product read as ``bf16x6`` (the
``_bf16x6`` patterns, see :mod:`collage_core.kit.bf16_split`) is handed over as the bfloat16 product it equals to
float32's accuracy: the left operand's three terms laid six deep along K by Relax operators before the call, the
weight's stacked to match at build time, accumulating into the float32 result with the same epilogue.

One recognizer serves the pattern checks and the lowering; ``runtime/collage_cublas.cc``
reads the words; keep the two in step.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from tvm import relax

from collage_core.kit import (
    FLOAT32, Group, Refused, StridedOperand, as_dtype, batch_loops, bf16_split, expect_plain_out_dtype, plain_strides,
    read_epilogue, shape_of, strided_operand, tvm_compat, uniform_operand_dtype,
)
from collage_core.kit import float_word, spec_text as as_text  # noqa: F401 (the plugin's spec encoding)

SPEC_VERSION = 7
# The last two words: what the two matrix operands are (16-bit ones accumulate into a float32 result, as
# `collage optimize --precision bf16|fp16` writes them), and what the output and residual are (float32,
# or the 16-bit type of a cast the group applies to the product). The bias is of the output's type (a
# 16-bit bias is the one the Relax program adds after its cast, so nothing is rounded anew).
OPERAND_TYPES = {FLOAT32: 0, "bfloat16": 1, "float16": 2}
OPERAND_DTYPES = tuple(OPERAND_TYPES)
TF32_OPERANDS = 3  # float32 operands rounded to TF32: an operand type only
DTYPE_OF_TYPE = {code: dtype for dtype, code in OPERAND_TYPES.items()}  # a spec word back to its dtype
NO_ACTIVATION, RELU, GELU_TANH = 0, 1, 2
ACTIVATION_CODES = {None: NO_ACTIVATION, "relu": RELU, "gelu_tanh": GELU_TANH}
FUSED = ("cast", "widen", "scale", "bias", "residual", "relu", "gelu_tanh")
MAX_OUTER_BATCH = 64  # batches looped on the host beyond cuBLASLt's one strided batch
# Bytes apart that the columns of a constant matrix operand are stored, padded with zeros where its rows are of
# another length: cuBLASLt's fast kernels (TMA on sm_90, vector loads before it) need every leading dimension a
# multiple of 16 bytes. GPT-2's language-model head (a 768 x 50257 weight: the vocabulary is odd) ran as an sm75
# kernel at alignment 1, 623 us of a 2.9 ms call on an H100 at bf16.
ALIGNMENT_BYTES = 16
OUTPUT_BYTES = {FLOAT32: 4, "bfloat16": 2, "float16": 2}
# A padded weight's rows, and so a padded output's row length, are a multiple of this many elements: 16 bytes apart
# was not enough for sm_90's kernels (GPT-2's head at bf16: 50260 rows took an sm_80 kernel at alignment 2, 500 us on
# an H200; 50272 rows sm_90's nvjet kernel, 136 us). The runtime pads an output whose weight is not padded alike.
PADDED_MULTIPLE = 16


@attrs.frozen
class KernelSpec:
    """The spec words (version first, no algorithm yet) and the operands in kernel order; ``before``: what the
    lowering computes from an operand (by its index) before the call (``packed_call_function``'s ``before``)."""

    words: tuple[int, ...]
    operands: tuple = attrs.field(eq=False)
    before: dict = attrs.field(factory=dict, eq=False)

    def array(self, algorithm: tuple[int, ...] = ()) -> np.ndarray:
        """The spec as the runtime reads it, with the chosen algorithm's words if there is one (how the output is
        written: 0 in place, 1 through a padded buffer and cudaMemcpy2DAsync, 2 through a padded buffer and
        cublasLtMatrixTransform; then cuBLASLt's algorithm: what ``collage_cublas.tune`` returns)."""
        tail = (1, *algorithm) if algorithm else (0,)
        return np.array((*self.words, *tail), dtype=np.int64)


def _column_major(rows: int, cols: int, row_stride: int, col_stride: int) -> tuple[int, int, int, int]:
    """cuBLAS's (op, stored rows, stored cols, ld) for a matrix whose element (i, j) lies at i*row_stride + j*col_stride."""
    if row_stride == 1 or rows == 1:
        return 0, rows, cols, max(col_stride, rows)
    if col_stride == 1 or cols == 1:
        return 1, cols, rows, max(row_stride, cols)
    raise Refused("an operand that is contiguous along neither matrix axis")


def aligned_constant(operand: StridedOperand) -> StridedOperand:
    """``operand`` read from a copy whose rows are 16 bytes apart (ALIGNMENT_BYTES), when it is a two-dimensional
    constant whose rows are not: its transpose where that one's rows are (a weight of K x N is then stored N x K,
    K-major, the layout PyTorch's ``nn.Linear`` hands cuBLAS, and nothing is padded), or else a copy padded with
    zeros to that width (the padding is never read); anything else as it is."""
    stored = tvm_compat.constant_array(operand.source)
    if stored is None or stored.ndim != 2 or stored.shape[1] <= 1 or stored.shape[1] * stored.itemsize % ALIGNMENT_BYTES == 0:
        return operand
    rows, cols = stored.shape
    if rows > 1 and rows * stored.itemsize % ALIGNMENT_BYTES == 0:
        # Element (i, j) moves from i*cols + j to j*rows + i: the row stride becomes 1, the column stride `rows`.
        strides = tuple({cols: 1, 1: rows}[stride] for stride in operand.strides)
        return StridedOperand(relax.const(np.ascontiguousarray(stored.T), str(stored.dtype)), operand.dims, strides)
    padded_cols = -(-cols * stored.itemsize // ALIGNMENT_BYTES) * ALIGNMENT_BYTES // stored.itemsize
    padded = np.zeros((rows, padded_cols), dtype=stored.dtype)
    padded[:, :cols] = stored
    strides = tuple(padded_cols if stride == cols else stride for stride in operand.strides)
    return StridedOperand(relax.const(padded, str(stored.dtype)), operand.dims, strides)


def padded_for_output(rhs: StridedOperand, loops, out_shape, epilogue) -> tuple[StridedOperand, int]:
    """``rhs`` stored with zero rows up to the next multiple of PADDED_MULTIPLE, and that many rows, where the runtime
    may write the output padded (its rows are not ALIGNMENT_BYTES apart, nothing is added to it, no batch) and ``rhs``
    is a weight stored K-major (N x K, as :func:`aligned_constant` leaves GPT-2's language-model head): the padded
    routes then compute the zero rows too, into rows that many elements apart, and cuBLASLt's fast kernels take the
    product (see the runtime). ``loops``: the product's :func:`batch_loops`. Else ``rhs`` and 0."""
    n, k = out_shape[-1], rhs.dims[-2]
    itemsize = OUTPUT_BYTES[epilogue.out_dtype]
    if epilogue.bias is not None or epilogue.residual is not None or n * itemsize % ALIGNMENT_BYTES == 0:
        return rhs, 0
    inner, outer, _ = loops
    stored = tvm_compat.constant_array(rhs.source)
    if inner.size != 1 or outer.size != 1 or stored is None or stored.shape != (n, k) or tuple(rhs.strides) != (1, k):
        return rhs, 0
    rows = -(-n // PADDED_MULTIPLE) * PADDED_MULTIPLE
    padded = np.zeros((rows, k), dtype=stored.dtype)
    padded[:n] = stored
    return StridedOperand(relax.const(padded, str(stored.dtype)), rhs.dims, rhs.strides), rows


def _as_bf16x6(lhs: StridedOperand, rhs: StridedOperand, split: bool) -> tuple[StridedOperand, StridedOperand]:
    """The bfloat16 product, six times as deep, equal to float32 ``lhs . rhs`` (:mod:`collage_core.kit.bf16_split`):
    ``lhs`` (an activation) as the lowering will lay its terms along K (read as it lies), ``rhs`` (a constant weight)
    split now when ``split`` (the lowering; a pattern's check needs only the words, not the copy)."""
    weight = tvm_compat.constant_array(rhs.source)
    if weight is None or weight.ndim != 2 or tuple(rhs.strides) != tuple(plain_strides(rhs.dims)):
        raise Refused("bf16x6 splits a constant weight read as it is stored")
    if tvm_compat.is_constant(lhs.source):
        raise Refused("bf16x6 lays an activation's terms along K, not a constant's")
    if tuple(lhs.strides) != tuple(plain_strides(lhs.dims)):
        raise Refused("bf16x6 lays the left operand's terms along K: it reads the operand as it lies, not through a transpose")
    deep = (*lhs.dims[:-1], lhs.dims[-1] * bf16_split.DEPTH)
    stacked_shape = (weight.shape[0] * bf16_split.DEPTH, weight.shape[1])
    source = relax.const(bf16_split.stacked_constant(weight, axis=0), "bfloat16") if split else rhs.source
    return (
        StridedOperand(lhs.source, deep, tuple(plain_strides(deep))),
        StridedOperand(source, stacked_shape, tuple(plain_strides(stacked_shape))),
    )


def _problem_words(lhs: StridedOperand, rhs: StridedOperand, loops) -> tuple[int, ...]:
    inner, outer, rows = loops
    m, k = rows.size, lhs.dims[-1]
    n = rhs.dims[-1]
    # a = rhs: op(a) is N x K with (j, k) at k*rhs_k + j*rhs_n; b = lhs: op(b) is K x M with (k, i) at i*lhs_m + k*lhs_k.
    a = _column_major(n, k, rhs.strides[-1], rhs.strides[-2])
    b = _column_major(k, m, lhs.strides[-1], rows.strides[0])
    return (
        n, m, k,
        *a, inner.strides[1], outer.strides[1],
        *b, inner.strides[0], outer.strides[0],
        n, inner.size, outer.size, inner.strides[2], outer.strides[2],
    )


def recognize(group: Group, tf32: bool = False, aligned: bool = False, bf16x6: bool = False) -> KernelSpec:
    """The cuBLASLt problem computing ``group`` (with TF32 tensor cores when ``tf32``; as six bfloat16 products
    when ``bf16x6``, the weight split only with ``aligned``), or :class:`Refused` saying why there is none. With ``aligned`` (the lowering), constant operands are read from copies padded to
    ALIGNMENT_BYTES (:func:`aligned_constant`); a pattern's check need not pay for the copy."""
    matmul = group.single_anchor(("relax.matmul",), OPERAND_DTYPES)
    expect_plain_out_dtype(matmul)
    consumed = {group.producer(arg) for arg in matmul.args} - {None}
    if set(group.calls[: group.calls.index(matmul)]) != consumed:
        raise Refused("the group holds operators before the matmul that the kernel does not absorb")
    lhs, rhs = (strided_operand(group, arg, OPERAND_DTYPES) for arg in matmul.args)
    operand_type = OPERAND_TYPES[uniform_operand_dtype(matmul, (lhs.source, rhs.source), OPERAND_DTYPES)]
    before = {}
    if bf16x6:
        if operand_type != OPERAND_TYPES[FLOAT32]:
            raise Refused("bf16x6 splits float32 operands")
        lhs, rhs = _as_bf16x6(lhs, rhs, split=aligned)
        operand_type, before = OPERAND_TYPES["bfloat16"], {1: bf16_split.stacked_terms}  # operand 1 is the left one
    if aligned:
        lhs, rhs = aligned_constant(lhs), aligned_constant(rhs)
    if tf32:
        if operand_type != OPERAND_TYPES[FLOAT32]:
            raise Refused("a TF32 kernel takes float32 operands")
        operand_type = TF32_OPERANDS
    out_shape = shape_of(matmul)
    epilogue = read_epilogue(group, matmul, out_shape[-1], 1, FUSED, reshapes=True)
    if bf16x6 and epilogue.out_dtype != FLOAT32:
        raise Refused(f"bf16x6 writes a float32 result, not {epilogue.out_dtype}")
    if math.prod(epilogue.output_shape) != math.prod(out_shape):
        raise Refused("the group's output is not the product's elements")
    loops = batch_loops(lhs, rhs, out_shape, MAX_OUTER_BATCH)  # padding the weight's rows changes no stride
    padded_rows = 0
    if aligned:
        rhs, padded_rows = padded_for_output(rhs, loops, out_shape, epilogue)
    operands = [rhs.source, lhs.source]
    if epilogue.bias is not None:  # in D's type: cuBLASLt takes no float32 bias for a 16-bit D
        operands.append(relax.const(as_dtype(epilogue.bias, epilogue.out_dtype), epilogue.out_dtype))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        SPEC_VERSION, *_problem_words(lhs, rhs, loops), padded_rows, ACTIVATION_CODES[epilogue.activation],
        int(epilogue.bias is not None), int(epilogue.residual is not None), float_word(epilogue.scale), operand_type,
        OPERAND_TYPES[epilogue.out_dtype],
    )
    return KernelSpec(words, tuple(operands), before)
