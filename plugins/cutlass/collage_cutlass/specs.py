"""What a CUTLASS operator group computes, as one CUTLASS 3 GEMM problem and the kind of kernel that runs it, or why none can.

Relax's ``matmul`` is row-major: ``out[b, i, j] = sum_k lhs[b, i, k] * rhs[b, k, j]``. CUTLASS 3 takes
``D (M x N) = A (M x K) . B (N x K)ᵀ`` over a batch mode L, each operand with one unit stride: A is
the left operand (K-major as it lies, M-major through a ``permute_dims``), B the right one seen as
``N x K`` (N-major as a ``K x N`` weight lies, K-major for ``x @ Wᵀ``), D the row-major output.
Batches merge into M or into one strided batch where strides allow (:mod:`collage_core.kit.strided_products`);
one more batch level is looped over on the host. The epilogue (scale as alpha, a bias per output
column, a residual as C with beta 1, then ReLU, erf or tanh GELU, or SiLU) runs in float32 and
rounds once to the output's type. The operands are bfloat16 or float16, accumulating into float32;
the output is float32, or 16 bits where the group casts the product (as TVM's mixed-precision pass
writes it). Float32 operands are taken only by a TF32 problem (``tf32``, the ``_tf32`` patterns of
``--precision tf32``): the tensor cores round them to TF32, and the output is float32.

Hopper's TMA loads need every stride but the unit one to be a multiple of 16 bytes; a problem
whose strides are not is refused here, and what CUTLASS itself cannot run is found when tuning
(``can_implement``). ``runtime/gemm_runner.h`` reads the words; keep the two in step.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from tvm import relax

from collage_core.kit import (
    FLOAT32, Axis, Group, Refused, StridedOperand, as_dtype, batch_loops, expect_plain_out_dtype, read_epilogue,
    shape_of, strided_operand, tvm_compat, uniform_operand_dtype,
)
from collage_core.kit import float_word, spec_text as as_text  # noqa: F401 (the plugin's spec encoding)
from collage_cutlass import conv_specs
from collage_cutlass.kernels import BYTES, OPERAND_ALIGNMENT_BYTES, OPERAND_DTYPES, KernelKind, expect_kernel_operands

SPEC_VERSION = 1
FUSED = ("cast", "scale", "bias", "residual", "relu", "gelu_erf", "gelu_tanh", "silu")
MAX_OUTER_BATCH = 64  # batches looped on the host beyond CUTLASS's one strided batch


@attrs.frozen
class KernelSpec:
    """The kind of kernel, the spec words (version first) and the operands in kernel order."""

    kind: KernelKind
    words: tuple[int, ...]
    operands: tuple = attrs.field(eq=False)

    def array(self) -> np.ndarray:
        return np.array(self.words, dtype=np.int64)

    def problem(self) -> list[int]:
        """``[M, N, K, batch, outer batch]``: the sizes tuning records."""
        return [int(word) for word in (*self.words[8:12], self.words[18])]

    def describe_problem(self) -> str:
        m, n, k, *_ = self.problem()
        return f"{self.kind.describe()} product (M={m}, N={n}, K={k})"


def _aligned(what: str, strides, dtype: str) -> None:
    elements = OPERAND_ALIGNMENT_BYTES // BYTES[dtype]
    for stride in strides:
        if stride % elements:
            raise Refused(f"{what} has a stride of {stride} elements; Hopper's TMA needs a multiple of {elements} ({dtype})")


def _left(lhs: StridedOperand, rows: Axis) -> tuple[bool, int]:
    """Whether A (M x K) is K-major, and its leading stride."""
    row_stride, k_stride = rows.strides[0], lhs.strides[-1]
    if k_stride == 1:
        return True, row_stride
    if row_stride == 1:
        return False, k_stride
    raise Refused("a left operand contiguous along neither M nor K")


def _right(rhs: StridedOperand) -> tuple[bool, int]:
    """Whether B (seen as N x K) is K-major, and its leading stride."""
    k_stride, n_stride = rhs.strides[-2], rhs.strides[-1]
    if n_stride == 1:
        return False, k_stride
    if k_stride == 1:
        return True, n_stride
    raise Refused("a right operand contiguous along neither K nor N")


def _k_major_weight(rhs: StridedOperand) -> StridedOperand:
    """A TF32 right operand that lies N-major, beside a K-major left one, as a K-major constant transposed once.

    For that layout CUTLASS's TF32 builder swaps the operands (``is_swapAB``), and on an H200 those
    kernels computed dense layers and products wrong (the GPU tests), while K-major right operands
    and an M-major left one ran right. A constant weight is transposed here, at build time; a
    product of two activations in that layout is refused.
    """
    weight = tvm_compat.constant_array(rhs.source)
    if weight is None or weight.ndim != 2:
        raise Refused("TF32 with a K-major left operand and an N-major right one that is not a constant matrix: "
                      "CUTLASS swaps such operands and computed them wrong on an H200")
    transposed = np.ascontiguousarray(weight.T)  # N x K, contiguous along K
    k, n = weight.shape
    return StridedOperand(relax.const(transposed, FLOAT32), (k, n), (1, k))


def recognize(group: Group, tf32: bool = False):
    """The CUTLASS problem computing ``group`` (on TF32 tensor cores when ``tf32``), or :class:`Refused`
    saying why there is none: a :class:`KernelSpec`, or for a convolution a :class:`~collage_cutlass.conv_specs.ConvSpec`."""
    matmul = group.single_anchor(("relax.matmul", "relax.nn.conv2d"), (*OPERAND_DTYPES, FLOAT32))
    if tvm_compat.op_name(matmul) == "relax.nn.conv2d":
        return conv_specs.recognize_conv(group, matmul, tf32)
    expect_plain_out_dtype(matmul)
    consumed = {group.producer(arg) for arg in matmul.args} - {None}
    if set(group.calls[: group.calls.index(matmul)]) != consumed:
        raise Refused("the group holds operators before the matmul that the kernel does not absorb")
    lhs, rhs = (strided_operand(group, arg, (*OPERAND_DTYPES, FLOAT32)) for arg in matmul.args)
    operand_dtype = uniform_operand_dtype(matmul, (lhs.source, rhs.source), (*OPERAND_DTYPES, FLOAT32))
    if tf32 and lhs.strides[-1] == 1 and rhs.strides[-1] == 1:
        rhs = _k_major_weight(rhs)
    expect_kernel_operands(operand_dtype, tf32)
    out_shape = shape_of(matmul)
    epilogue = read_epilogue(group, matmul, out_shape[-1], 1, FUSED, reshapes=True)
    if math.prod(epilogue.output_shape) != math.prod(out_shape):
        raise Refused("the group's output is not the product's elements")
    inner, outer, rows = batch_loops(lhs, rhs, out_shape, MAX_OUTER_BATCH)
    if inner.size > 1 and 0 in inner.strides[:2]:
        raise Refused("an operand shared by every batch that does not fold into the rows")
    m, n, k = rows.size, rhs.dims[-1], lhs.dims[-1]
    a_k_major, lead_a = _left(lhs, rows)
    b_k_major, lead_b = _right(rhs)
    lead_d = n
    _aligned("the left operand", (lead_a, inner.strides[0], outer.strides[0]), operand_dtype)
    _aligned("the right operand", (lead_b, inner.strides[1], outer.strides[1]), operand_dtype)
    _aligned("the output", (lead_d, inner.strides[2], outer.strides[2]), epilogue.out_dtype)
    kind = KernelKind(operand_dtype, epilogue.out_dtype, a_k_major, b_k_major, epilogue.bias is not None,
                      epilogue.residual is not None, epilogue.activation)
    operands = [lhs.source, rhs.source]
    if epilogue.bias is not None:  # in the output's type: the Relax program's own bias after its cast
        operands.append(relax.const(as_dtype(epilogue.bias, epilogue.out_dtype), epilogue.out_dtype))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        SPEC_VERSION, *kind.words(), m, n, k, inner.size, lead_a, inner.strides[0], lead_b, inner.strides[1],
        lead_d, inner.strides[2], outer.size, outer.strides[0], outer.strides[1], outer.strides[2],
        float_word(epilogue.scale),
    )
    return KernelSpec(kind, words, tuple(operands))
