"""What a DNNL operator group computes, as the words of a kernel spec, or why the kernels cannot.

One recognizer serves the patterns' checks (on the matched calls of ``main``) and the lowering
(on a partition function's bindings), so whatever a check accepts is exactly what the kernel is
told to compute. The spec layout is read by ``runtime/collage_dnnl.cc``; keep the two in step.
"""

from __future__ import annotations

import math
from typing import Optional

import attrs
import numpy as np
from tvm import relax

from collage_core.kit import (
    Group, Refused, expect_float32, expect_plain_out_dtype, external, float_word, has_fast_bf16, ints, padding4,
    read_epilogue, shape_of, strided_operand, tvm_compat, uniform_operand_dtype,
)

SPEC_VERSION = 2
CONV2D, MATMUL, POOL2D, SOFTMAX, LAYER_NORM = 1, 2, 3, 4, 5
NO_ELTWISE, RELU, GELU_ERF = 0, 1, 2
MAX, AVG_INCLUDE_PAD, AVG_EXCLUDE_PAD = 0, 1, 2
PLAIN_ACTIVATIONS, BLOCKED_ACTIVATIONS = 0, 1  # convolution layouts; the build times both and keeps the faster
ANCHORS = ("relax.nn.conv2d", "relax.matmul", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.softmax", "relax.nn.layer_norm")
FLOAT32, BFLOAT16 = "float32", "bfloat16"
OPERAND_TYPES = {FLOAT32: 0, BFLOAT16: 1}  # the spec's operand-type word for convolutions and matmuls
ELTWISE_CODES = {None: NO_ELTWISE, "relu": RELU, "gelu_erf": GELU_ERF}
CONV2D_FUSED = ("bias", "residual", "relu")
MATMUL_FUSED = ("scale", "bias", "residual", "relu", "gelu_erf")


@attrs.frozen
class KernelSpec:
    """A kernel's spec words (kind first, version not included) and its operands in kernel order.

    ``packed_operand`` is the index of the operand (a constant) whose layout the build replaces
    with the one oneDNN prefers; the spec then ends with that layout's descriptor.
    """

    words: tuple[int, ...]
    operands: tuple = attrs.field(eq=False)
    packed_operand: Optional[int] = None

    def array(self) -> np.ndarray:
        return np.array((SPEC_VERSION, *self.words), dtype=np.int64)


def operand_dtypes() -> tuple[str, ...]:
    """What convolutions and matmuls may read: bfloat16 too where this CPU computes it fast (AMX, AVX512-BF16)."""
    return (FLOAT32, BFLOAT16) if has_fast_bf16() else (FLOAT32,)


def _operand_type(anchor, operands) -> int:
    """The spec word for the anchor's operand type (see :func:`collage_core.kit.uniform_operand_dtype`)."""
    return OPERAND_TYPES[uniform_operand_dtype(anchor, operands, operand_dtypes())]


def recognize(group: Group) -> KernelSpec:
    """The kernel computing ``group``, or :class:`Refused` saying why there is none."""
    # The last call is live (main has no dead code), so one output is the last call's result.
    anchor = group.single_anchor(ANCHORS, operand_dtypes())
    name = tvm_compat.op_name(anchor)
    if name == "relax.nn.conv2d":
        return _conv2d(group, anchor)
    if name == "relax.matmul":
        return _matmul(group, anchor)
    if len(group.calls) != 1:
        raise Refused(f"{name} fuses nothing")
    if name in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
        return _pool2d(anchor)
    if name == "relax.nn.softmax":
        return _softmax(anchor)
    return _layer_norm(group, anchor)


def _conv2d(group: Group, conv) -> KernelSpec:
    attrs_ = conv.attrs
    for name, wanted in (("data_layout", "NCHW"), ("kernel_layout", "OIHW"), ("out_layout", "NCHW")):
        if str(getattr(attrs_, name)) != wanted:
            raise Refused(f"conv2d {name} {getattr(attrs_, name)} (only {wanted})")
    expect_plain_out_dtype(conv)
    if group.calls[0] is not conv:
        raise Refused("the group holds operators before the convolution")
    data, weights = conv.args
    operand_type = _operand_type(conv, (data, weights))
    external(group, data, operand_dtypes())
    if not tvm_compat.is_constant(weights):
        raise Refused("conv2d weights that are not constants")
    n, c, h, w = shape_of(data)
    o, _, kh, kw = shape_of(weights)
    _, _, oh, ow = shape_of(conv)
    groups = int(attrs_.groups)
    if c % groups or o % groups or shape_of(weights)[1] * groups != c:
        raise Refused(f"conv2d with {groups} groups over {c} input channels")
    epilogue = read_epilogue(group, conv, o, 3, CONV2D_FUSED)
    operands = [data, weights]
    if epilogue.bias is not None:
        operands.append(relax.const(epilogue.bias, FLOAT32))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        CONV2D, operand_type, n, c, h, w, o, kh, kw, groups, oh, ow, *ints(attrs_.strides), *ints(attrs_.dilation),
        *padding4(attrs_.padding), int(epilogue.bias is not None), int(epilogue.residual is not None),
        int(epilogue.activation == "relu"), BLOCKED_ACTIVATIONS, 0,
    )
    return KernelSpec(words, tuple(operands), packed_operand=1)


def _matmul_operand(group: Group, expr, rank: int) -> tuple[object, list[int], list[int]]:
    """The tensor the kernel reads, and the dims and strides it sees it through (transposes absorbed), at ``rank``."""
    operand = strided_operand(group, expr, operand_dtypes())
    dims, strides = list(operand.dims), list(operand.strides)
    if len(dims) < 2:
        raise Refused("matmul of a vector")
    total = math.prod(dims)
    while len(dims) < rank:
        dims.insert(0, 1)
        strides.insert(0, total)
    return operand.source, dims, strides


def _matmul(group: Group, matmul) -> KernelSpec:
    expect_plain_out_dtype(matmul)
    out_shape = shape_of(matmul)
    rank = len(out_shape)
    if rank > 6:
        raise Refused(f"matmul of rank {rank}")
    lhs, lhs_dims, lhs_strides = _matmul_operand(group, matmul.args[0], rank)
    rhs, rhs_dims, rhs_strides = _matmul_operand(group, matmul.args[1], rank)
    operand_type = _operand_type(matmul, (lhs, rhs))
    for axis in range(rank - 2):
        if lhs_dims[axis] != rhs_dims[axis] and 1 not in (lhs_dims[axis], rhs_dims[axis]):
            raise Refused("matmul batch dimensions that do not broadcast")
        if lhs_dims[axis] == 1 and rhs_dims[axis] != 1:
            raise Refused("matmul whose left operand broadcasts over the batch")
    consumed = {group.producer(arg) for arg in matmul.args} - {None}
    if set(group.calls[: group.calls.index(matmul)]) != consumed:
        raise Refused("the group holds operators before the matmul that the kernel does not absorb")
    epilogue = read_epilogue(group, matmul, out_shape[-1], 1, MATMUL_FUSED)
    operands = [lhs, rhs]
    bias_words: tuple[int, ...] = (0,)
    if epilogue.bias is not None:
        operands.append(relax.const(epilogue.bias, FLOAT32))
        bias_words = (1, *([1] * (rank - 1)), out_shape[-1])
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        MATMUL, operand_type, rank, *lhs_dims, *lhs_strides, *rhs_dims, *rhs_strides, *out_shape, *bias_words,
        float_word(epilogue.scale), ELTWISE_CODES[epilogue.activation], int(epilogue.residual is not None),
    )
    return KernelSpec(words, tuple(operands))


def _pool2d(pool) -> KernelSpec:
    attrs_ = pool.attrs
    if str(attrs_.layout) != "NCHW" or str(attrs_.out_layout) != "NCHW":
        raise Refused(f"pooling layout {attrs_.layout} (only NCHW)")
    data = pool.args[0]
    expect_float32(data)
    shape = shape_of(data)
    if len(shape) != 4:
        raise Refused("pooling on other than 4-d tensors")
    kernel, strides, dilation = ints(attrs_.pool_size), ints(attrs_.strides), ints(attrs_.dilation)
    padding = padding4(attrs_.padding)
    out = shape_of(pool)[2:]
    for axis in range(2):
        span = shape[2 + axis] + padding[axis] + padding[axis + 2] - dilation[axis] * (kernel[axis] - 1) - 1
        if span // strides[axis] + 1 != out[axis]:
            raise Refused("pooling in ceil mode that adds a window")
    if tvm_compat.op_name(pool) == "relax.nn.max_pool2d":
        algorithm = MAX
    else:
        if dilation != (1, 1):
            raise Refused("avg_pool2d with dilation")
        algorithm = AVG_INCLUDE_PAD if attrs_.count_include_pad else AVG_EXCLUDE_PAD
    words = (POOL2D, algorithm, *shape, *out, *kernel, *strides, *dilation, *padding)
    return KernelSpec(words, (data,))


def _softmax(softmax) -> KernelSpec:
    data = softmax.args[0]
    shape = shape_of(data)
    axis = int(softmax.attrs.axis) % len(shape)
    return KernelSpec((SOFTMAX, len(shape), *shape, axis), (data,))


def _layer_norm(group: Group, norm) -> KernelSpec:
    data, gamma, beta = norm.args
    shape = shape_of(data)
    axes = [int(a) % len(shape) for a in norm.attrs.axes]
    if axes != [len(shape) - 1]:
        raise Refused(f"layer_norm over axes {axes} (only the last)")
    if not (norm.attrs.center and norm.attrs.scale):
        raise Refused("layer_norm without both scale and shift")
    for operand in (data, gamma, beta):
        external(group, operand)
    if shape_of(gamma) != (shape[-1],) or shape_of(beta) != (shape[-1],):
        raise Refused("layer_norm scale or shift not of the normalized length")
    return KernelSpec((LAYER_NORM, len(shape), *shape, float_word(norm.attrs.epsilon)), (data, gamma, beta))
