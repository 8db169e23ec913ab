"""What a cuDNN operator group computes, as the words of one cuDNN operation graph, or why cuDNN cannot.

Two anchors: a 2-d convolution (NCHW with OIHW weights, or channel-last: NHWC with OHWI weights, as
``collage optimize --layout nhwc`` writes them; any padding, stride, dilation and groups)
and a matrix product (each operand read in place through its strides, so ``permute_dims``
transposes and head splits cost nothing; batch dimensions merged into one). And one fused
operation: attention at 16 bits, ``softmax(scale * q @ k^T [+ causal mask]) @ v`` as the exporters
spell it (casts, a scale on the scores or on q and k, an additive causal mask, a NaN guard after the
softmax), run by cuDNN's flash-attention engine (its SDPA node), which keeps the scores in float32
where the converted Relax program rounds them to 16 bits. After the anchor,
cuDNN's pointwise nodes fuse a per-channel bias, a residual add and one activation: ReLU,
erf GELU (``GELU_FWD``), tanh GELU (``GELU_APPROX_TANH_FWD``) or SiLU (``SWISH_FWD``), each the
function the Relax program spells out. With 16-bit operands the group may first cast the anchor's
float32 result to 16 bits (as TVM's mixed-precision pass does); the graph then writes y in that type.
One recognizer serves the pattern checks and the
lowering; ``runtime/collage_cudnn.cc`` reads the words; keep the two in step.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from tvm import relax

from collage_core.kit import (
    FLOAT32, Group, Refused, StridedOperand, expect_plain_out_dtype, external, float_word, fused_groups, ints, padding4,
    plain_strides, read_epilogue, shape_of, strided_operand, tvm_compat, uniform_operand_dtype, viewed_operand, written_view,
)
from collage_core.kit import spec_text as as_text  # noqa: F401 (the plugin's spec encoding)

SPEC_VERSION = 6
# The words after the activation: what x and w are (16-bit ones accumulate into a float32 result, as
# `collage optimize --precision bf16|fp16` writes them), then what y and the residual are: float32, or
# the 16-bit type of a cast the group applies to the anchor's result (the pointwise nodes still compute
# in float32). The bias is float32.
OPERAND_TYPES = {FLOAT32: 0, "bfloat16": 1, "float16": 2}
OPERAND_DTYPES = tuple(OPERAND_TYPES)
DTYPE_OF_TYPE = {code: dtype for dtype, code in OPERAND_TYPES.items()}  # a spec word back to its dtype
TF32_OPERANDS = 3  # float32 operands that tensor-core engines may round to TF32: an operand type only
CONV2D, MATMUL, ATTENTION = 1, 2, 3
SIXTEEN_BIT_DTYPES = ("bfloat16", "float16")  # cuDNN's fused attention reads and writes 16 bits
MASK_CODES = {None: 0, "causal": 1}
MASKED_AT_MOST = -1e4  # an additive mask entry at or below this hides its score: exp underflows to 0 in float32
MAX_HEAD_SIZE = 128  # q's and v's last dimension: a multiple of 8, at most this (cuDNN 9's flash-attention engine)
ALIGNED_ELEMENTS = 8  # 16 bytes of a 16-bit tensor: each of attention's offsets and outer strides a multiple of it
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu_erf": 2, "gelu_tanh": 3, "silu": 4}
FUSED = ("cast", "bias", "residual", "relu", "gelu_erf", "gelu_tanh", "silu")
ANCHORS = ("relax.nn.conv2d", "relax.matmul")
CHANNEL_FIRST, CHANNEL_LAST = (0, 1, 2, 3), (0, 3, 1, 2)  # the axes of NCHW (OIHW) and of NHWC (OHWI) in NCHW's order
CONV_LAYOUTS = {("NCHW", "OIHW", "NCHW"): CHANNEL_FIRST, ("NHWC", "OHWI", "NHWC"): CHANNEL_LAST}


@attrs.frozen
class KernelSpec:
    """The spec words (version first, no plan choice yet) and the operands in kernel order."""

    words: tuple[int, ...]
    operands: tuple = attrs.field(eq=False)

    def array(self, plan: tuple[int, ...] = ()) -> np.ndarray:
        """The spec as the runtime reads it, with the chosen plan's engine and knobs if there is one."""
        tail = (1, *plan) if plan else (0,)
        return np.array((*self.words, *tail), dtype=np.int64)


def _conv2d(group: Group, conv) -> KernelSpec:
    attributes = conv.attrs
    layouts = (str(attributes.data_layout), str(attributes.kernel_layout), str(attributes.out_layout))
    if layouts not in CONV_LAYOUTS:
        raise Refused(f"conv2d layouts {layouts[0]}/{layouts[1]} -> {layouts[2]} (NCHW/OIHW or NHWC/OHWI, out as in)")
    expect_plain_out_dtype(conv)
    if group.calls[0] is not conv:
        raise Refused("the group holds operators before the convolution")
    data, weights = conv.args
    external(group, data, OPERAND_DTYPES)
    operand_type = OPERAND_TYPES[uniform_operand_dtype(conv, (data, weights), OPERAND_DTYPES)]
    if not tvm_compat.is_constant(weights):
        raise Refused("conv2d weights that are not constants")
    # cuDNN takes every tensor's dims in NCHW (KCRS) order; a channel-last tensor is the same dims with its strides.
    order = CONV_LAYOUTS[layouts]
    (x_dims, x_strides), (w_dims, w_strides), (y_dims, y_strides) = (
        _logical(shape_of(value), order) for value in (data, weights, conv)
    )
    groups = int(attributes.groups)
    if x_dims[1] % groups or w_dims[0] % groups or w_dims[1] * groups != x_dims[1]:
        raise Refused(f"conv2d with {groups} groups over {x_dims[1]} input channels")
    epilogue = read_epilogue(group, conv, w_dims[0], 3 if order == CHANNEL_FIRST else 1, FUSED)
    top, left, bottom, right = padding4(attributes.padding)
    words = (
        SPEC_VERSION, CONV2D, 4, *x_dims, *x_strides, *w_dims, *w_strides, *y_dims, *y_strides,
        top, left, bottom, right, *ints(attributes.strides), *ints(attributes.dilation),
    )
    return _with_epilogue(words, [data, weights], epilogue, operand_type)


def _logical(shape, order: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A packed tensor of ``shape`` as cuDNN reads it: its dims taken in ``order`` (NCHW's), each with its stride."""
    strides = plain_strides(shape)
    return tuple(shape[axis] for axis in order), tuple(strides[axis] for axis in order)


def _mergeable(dims, strides, outer: int, inner: int) -> bool:
    return strides[outer] == strides[inner] * dims[inner]


def _as_rank3(lhs: StridedOperand, rhs: StridedOperand, out_shape) -> tuple[tuple, tuple, tuple, tuple, tuple]:
    """x dims and strides, w dims and strides, y dims: one batch dimension, as cuDNN's matmul takes it."""
    if len(lhs.dims) < 2 or len(rhs.dims) < 2:
        raise Refused("matmul of a vector")
    m, k, n = lhs.dims[-2], lhs.dims[-1], rhs.dims[-1]
    if len(rhs.dims) == 2:  # a dense layer: the weights are shared by every row, so batches fold into M
        rows, row_stride = m, lhs.strides[-2]
        for axis in reversed(range(len(lhs.dims) - 2)):
            if lhs.dims[axis] == 1:
                continue
            if lhs.strides[axis] != row_stride * rows:
                raise Refused("a dense layer whose input rows are not evenly spaced")
            rows *= lhs.dims[axis]
        x = ((1, rows, k), (rows * row_stride, row_stride, lhs.strides[-1]))
        w = ((1, k, n), (k * n, rhs.strides[-2], rhs.strides[-1]))
        return (*x, *w, (1, rows, n))
    if len(lhs.dims) != len(rhs.dims) or lhs.dims[:-2] != rhs.dims[:-2]:
        raise Refused("matmul batch dimensions that broadcast")
    axes = [axis for axis in range(len(lhs.dims) - 2) if lhs.dims[axis] > 1]
    batch = math.prod(lhs.dims[axis] for axis in axes)
    for outer, inner in zip(axes, axes[1:]):
        if not (_mergeable(lhs.dims, lhs.strides, outer, inner) and _mergeable(rhs.dims, rhs.strides, outer, inner)):
            raise Refused("batch dimensions that do not merge into one (cuDNN's matmul takes one)")
    lhs_batch = lhs.strides[axes[-1]] if axes else m * k
    rhs_batch = rhs.strides[axes[-1]] if axes else k * n
    x = ((batch, m, k), (lhs_batch, lhs.strides[-2], lhs.strides[-1]))
    w = ((batch, k, n), (rhs_batch, rhs.strides[-2], rhs.strides[-1]))
    return (*x, *w, (batch, m, n))


def _matmul(group: Group, matmul) -> KernelSpec:
    expect_plain_out_dtype(matmul)
    consumed = {group.producer(arg) for arg in matmul.args} - {None}
    if set(group.calls[: group.calls.index(matmul)]) != consumed:
        raise Refused("the group holds operators before the matmul that the kernel does not absorb")
    lhs, rhs = (strided_operand(group, arg, OPERAND_DTYPES) for arg in matmul.args)
    operand_type = OPERAND_TYPES[uniform_operand_dtype(matmul, (lhs.source, rhs.source), OPERAND_DTYPES)]
    out_shape = shape_of(matmul)
    x_dims, x_strides, w_dims, w_strides, y_dims = _as_rank3(lhs, rhs, out_shape)
    epilogue = read_epilogue(group, matmul, out_shape[-1], 1, FUSED)
    words = (SPEC_VERSION, MATMUL, 3, *x_dims, *x_strides, *w_dims, *w_strides, *y_dims, *plain_strides(y_dims))
    return _with_epilogue(words, [lhs.source, rhs.source], epilogue, operand_type)


def _with_epilogue(words: tuple, operands: list, epilogue, operand_type: int) -> KernelSpec:
    if epilogue.bias is not None:
        operands.append(relax.const(epilogue.bias, FLOAT32))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    tail = (int(epilogue.bias is not None), int(epilogue.residual is not None), ACTIVATION_CODES[epilogue.activation],
            operand_type, OPERAND_TYPES[epilogue.out_dtype])
    return KernelSpec((*words, *tail), tuple(operands))


class _Walk:
    """The group's calls read backwards from its output, each taken once; what is left untaken is refused."""

    def __init__(self, group: Group):
        self.group, self.taken = group, []

    def call(self, expr, *ops):
        """The group's call producing ``expr`` if it is one of ``ops`` (taken), else None."""
        call = self.group.producer(expr)
        if call is None or tvm_compat.op_name(call) not in ops:
            return None
        self.taken.append(call)
        return call

    def operand(self, expr) -> StridedOperand:
        """``expr`` read in place through the group's views (transposes, head splits, a part of a stacked q, k, v)."""
        operand, views = viewed_operand(self.group, expr, SIXTEEN_BIT_DTYPES)
        self.taken += views
        return operand

    def written_view(self, expr) -> tuple[object, tuple[int, ...]]:
        """What ``expr`` (the group's output) is a view of, through reshapes and transposes (taken), and the strides
        the kernel writes it with so that ``expr`` comes out packed."""
        value, strides, views = written_view(self.group, expr)
        self.taken += views
        return value, strides

    def scaled(self, expr) -> tuple[object, float]:
        """``expr`` less a multiplication by a scalar constant (taken), and that scalar (1 without one)."""
        call = self.call(expr, "relax.multiply")
        return (expr, 1.0) if call is None else _by_scalar(call)


def _by_scalar(call) -> tuple[object, float]:
    """A multiplication's (or division's) other operand and the scalar constant it multiplies that by."""
    operands = [call.args] if tvm_compat.op_name(call) == "relax.divide" else [call.args, tuple(reversed(call.args))]
    for value, other in operands:
        factor = fused_groups.scalar(other) if tvm_compat.is_constant(other) else None
        if factor:
            return value, (1.0 / factor if tvm_compat.op_name(call) == "relax.divide" else factor)
    raise Refused(f"a {tvm_compat.op_name(call)} that is not by a nonzero scalar constant")


def _causal(mask: np.ndarray, rows: int, columns: int) -> bool:
    """Whether an additive ``mask`` hides exactly the scores above the diagonal (a causal mask), the same for every
    batch and head (GPT-2's export at batch 8 folds its mask to 8 equal planes)."""
    if mask.ndim < 2 or mask.shape[-2:] != (rows, columns):
        return False
    planes = mask.reshape(-1, rows, columns)
    if not np.array_equal(planes, np.broadcast_to(planes[:1], planes.shape)):
        return False
    plane = planes[0].astype(np.float64)
    above = np.triu(np.ones((rows, columns), dtype=bool), k=1)
    return bool(np.all(plane[~above] == 0) and np.all(plane[above] <= MASKED_AT_MOST))


def _attention(group: Group) -> KernelSpec:
    if len(group.outputs) != 1:
        raise Refused("an intermediate result of the group is used outside it")
    walk = _Walk(group)
    output, o_strides = walk.written_view(group.outputs[0])
    cast = walk.call(output, "relax.astype")
    second = walk.call(cast.args[0] if cast is not None else output, "relax.matmul")
    if second is None:
        raise Refused("attention that does not end in a product with v")
    if cast is None:
        raise Refused("attention with a float32 result (cuDNN's fused attention writes 16 bits)")
    probabilities, values = second.args
    while (step := walk.call(probabilities, "relax.astype", "relax.where")) is not None:
        if tvm_compat.op_name(step) == "relax.astype":
            probabilities = step.args[0]
            continue
        # where(isnan(p), 0, p): a row whose every score is masked; a causal mask leaves none
        condition, zero, probabilities = step.args
        isnan = walk.call(condition, "relax.isnan")
        if isnan is None or not isnan.args[0].same_as(probabilities) or fused_groups.scalar(zero) != 0.0:
            raise Refused("a where after the softmax that is not a NaN guard")
    softmax = walk.call(probabilities, "relax.nn.softmax")
    if softmax is None:
        raise Refused("attention without a softmax before the product with v")
    rank = len(shape_of(softmax))
    if int(softmax.attrs.axis) not in (-1, rank - 1):
        raise Refused(f"a softmax over axis {int(softmax.attrs.axis)} (attention normalizes the last)")
    scores, scale, mask = softmax.args[0], 1.0, None
    while (step := walk.call(scores, "relax.astype", "relax.multiply", "relax.divide", "relax.add")) is not None:
        name = tvm_compat.op_name(step)
        if name == "relax.astype":
            scores = step.args[0]
        elif name in ("relax.multiply", "relax.divide"):
            scores, factor = _by_scalar(step)
            scale *= factor
        else:
            constant = next((arg for arg in step.args if tvm_compat.is_constant(arg)), None)
            added, dims = (None if constant is None else tvm_compat.constant_array(constant)), shape_of(step)
            masked = None if constant is None else next(arg for arg in step.args if not arg.same_as(constant))
            if masked is not None and tuple(shape_of(masked)) != tuple(dims):
                raise Refused("an additive mask that broadcasts the scores to more batches or heads")
            if added is not None and not added.any():  # a padding mask that hides nothing, folded to zeros
                scores = masked
                continue
            if mask is not None or added is None or not _causal(added, dims[-2], dims[-1]):
                raise Refused("an additive mask that is not one causal mask (cuDNN takes a causal mask, not a bias)")
            scores, mask = masked, "causal"
    first = walk.call(scores, "relax.matmul")
    if first is None:
        raise Refused("attention whose scores are not a product of q and k")
    (q_expr, q_factor), (k_expr, k_factor) = walk.scaled(first.args[0]), walk.scaled(first.args[1])
    scale *= q_factor * k_factor
    q, kt, v = walk.operand(q_expr), walk.operand(k_expr), walk.operand(values)
    operand_dtype = uniform_operand_dtype(first, (q.source, kt.source), SIXTEEN_BIT_DTYPES)
    if uniform_operand_dtype(second, (v.source,), SIXTEEN_BIT_DTYPES) != operand_dtype or str(cast.attrs.dtype) != operand_dtype:
        raise Refused("attention whose q, k, v and result are not of one 16-bit type")
    untaken = [tvm_compat.op_name(call) for call in group.calls if not any(call.same_as(taken) for taken in walk.taken)]
    if untaken:
        raise Refused(f"the group holds operators the fused attention does not compute: {', '.join(untaken)}")
    if len(q.dims) != 4 or len(kt.dims) != 4 or len(v.dims) != 4:
        raise Refused("attention over tensors that are not (batch, heads, sequence, head size)")
    k_dims, k_strides = (*kt.dims[:2], kt.dims[3], kt.dims[2]), (*kt.strides[:2], kt.strides[3], kt.strides[2])
    batch, heads, rows, size = q.dims
    if k_dims[:2] != (batch, heads) or v.dims[:3] != k_dims[:3] or k_dims[3] != size:
        raise Refused("q, k and v of attention whose batch, heads or sequences do not agree (no broadcasting)")
    for head_size in (size, v.dims[3]):
        if head_size % 8 or head_size > MAX_HEAD_SIZE:
            raise Refused(f"a head size of {head_size} (cuDNN's fused attention takes multiples of 8 up to {MAX_HEAD_SIZE})")
    if {q.strides[3], k_strides[3], v.strides[3]} != {1}:
        raise Refused("q, k or v whose head dimension is not contiguous")
    if mask == "causal" and rows != k_dims[2]:
        raise Refused("a causal mask over sequences of different lengths")
    type_code = OPERAND_TYPES[operand_dtype]
    o_dims = tuple(shape_of(second))
    if o_strides[3] != 1:
        raise Refused("attention whose result's head dimension is not contiguous")
    strides = (*q.strides[:3], *k_strides[:3], *v.strides[:3], *o_strides[:3])
    if any(value % ALIGNED_ELEMENTS for value in (q.offset, kt.offset, v.offset, *strides)):
        raise Refused(f"q, k, v or the result at an offset or stride that is not a multiple of {ALIGNED_ELEMENTS} elements")
    words = (
        SPEC_VERSION, ATTENTION, 4, *q.dims, *q.strides, *k_dims, *k_strides, *v.dims, *v.strides, *o_dims, *o_strides,
        q.offset, kt.offset, v.offset, float_word(scale), MASK_CODES[mask], type_code, type_code,
    )
    return KernelSpec(words, (q.source, kt.source, v.source))


def recognize(group: Group, tf32: bool = False, channel_last: bool = False) -> KernelSpec:
    """The cuDNN operation graph computing ``group``, or :class:`Refused` saying why there is none. With ``tf32``
    (the ``_tf32`` patterns of ``--precision tf32``) its float32 operands may go to engines that round them to TF32.
    With ``channel_last`` (the ``_nhwc`` patterns) only a channel-last convolution is taken."""
    names = [tvm_compat.op_name(call) for call in group.calls]
    if "relax.nn.softmax" in names and names.count("relax.matmul") == 2:
        spec = _attention(group)
    else:
        anchor = group.single_anchor(ANCHORS, OPERAND_DTYPES)
        spec = _conv2d(group, anchor) if tvm_compat.op_name(anchor) == "relax.nn.conv2d" else _matmul(group, anchor)
    if channel_last and not (spec.words[1] == CONV2D and str(anchor.attrs.data_layout) == "NHWC"):
        raise Refused("a 16-bit convolution with a bias in NCHW (cuDNN's fused engines take NHWC: --layout nhwc)")
    if not tf32:
        return spec
    *head, operand_type, out_type = spec.words
    if operand_type != OPERAND_TYPES[FLOAT32]:
        raise Refused("a TF32 kernel takes float32 operands")
    return attrs.evolve(spec, words=(*head, TF32_OPERANDS, out_type))
