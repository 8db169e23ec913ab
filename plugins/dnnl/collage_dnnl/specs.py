"""What a DNNL operator group computes, as the words of a kernel spec, or why the kernels cannot.

One recognizer serves the patterns' checks (on the matched calls of ``main``) and the lowering
(on a partition function's bindings), so whatever a check accepts is exactly what the kernel is
told to compute. The spec layout is read by ``runtime/collage_dnnl.cc``; keep the two in step.
"""

from __future__ import annotations

import math
import struct
from typing import Optional, Sequence

import attrs
import numpy as np
from tvm import relax

from collage_core import tvm_compat

SPEC_VERSION = 1
CONV2D, MATMUL, POOL2D, SOFTMAX, LAYER_NORM = 1, 2, 3, 4, 5
NO_ELTWISE, RELU, GELU_ERF = 0, 1, 2
MAX, AVG_INCLUDE_PAD, AVG_EXCLUDE_PAD = 0, 1, 2
PLAIN_ACTIVATIONS, BLOCKED_ACTIVATIONS = 0, 1  # convolution layouts; the build times both and keeps the faster
ANCHORS = ("relax.nn.conv2d", "relax.matmul", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.softmax", "relax.nn.layer_norm")
FLOAT32 = "float32"
SQRT2 = math.sqrt(2.0)


class Refused(Exception):
    """The group is outside what the kernels compute exactly; the message says what."""


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


def float_word(value: float) -> int:
    """A float64 as the int64 word with the same bits (how the spec carries floats)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


class Group:
    """Calls in order (anchor's operands first, root last), the variables they are bound to, and the outputs."""

    def __init__(self, calls: Sequence, bound_vars: Sequence, outputs: Sequence):
        self.calls = list(calls)
        self.bound_vars = list(bound_vars)
        self.outputs = list(outputs)
        self._producer = {var: call for var, call in zip(bound_vars, calls)}

    @classmethod
    def from_function(cls, func: relax.Function) -> "Group":
        """A partition function's bindings: its one output is what it returns."""
        bindings = [b for block in func.body.blocks for b in block.bindings]
        calls = [b.value for b in bindings if tvm_compat.is_op_call(b.value)]
        bound = [b.var for b in bindings if tvm_compat.is_op_call(b.value)]
        aliases = {b.var: b.value for b in bindings if isinstance(b.value, relax.Var)}
        if len(calls) + len(aliases) != len(bindings):
            raise Refused("the partition binds values other than operator calls")
        body = func.body.body
        outputs = list(body.fields) if isinstance(body, relax.Tuple) else [body]
        while len(outputs) == 1 and outputs[0] in aliases:
            outputs = [aliases[outputs[0]]]
        if any(alias in aliases for call in calls for alias in call.args):
            raise Refused("the partition reads a renamed intermediate result")
        return cls(calls, bound, outputs)

    def producer(self, expr):
        return self._producer.get(expr) if isinstance(expr, relax.Var) else None

    def var_of(self, call):
        return self.bound_vars[self.calls.index(call)]


def recognize(group: Group) -> KernelSpec:
    """The kernel computing ``group``, or :class:`Refused` saying why there is none."""
    # The last call is live (main has no dead code), so one output is the last call's result.
    if len(group.outputs) != 1:
        raise Refused("an intermediate result of the group is used outside it")
    anchors = [call for call in group.calls if tvm_compat.op_name(call) in ANCHORS]
    if len(anchors) != 1:
        raise Refused("the group does not have exactly one anchor operator")
    anchor = anchors[0]
    for call in group.calls:
        _expect_float32(call)
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


def _shape(expr) -> tuple[int, ...]:
    return tvm_compat.tensor_shape_dtype(expr)[0]


def _expect_float32(expr) -> None:
    try:
        dtype = tvm_compat.tensor_shape_dtype(expr)[1]
    except ValueError as error:
        raise Refused(str(error)) from None
    if dtype != FLOAT32:
        raise Refused(f"dtype {dtype} (only float32)")


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _external(group: Group, expr) -> None:
    """Operands the kernel reads must come from outside the group (or be constants)."""
    if group.producer(expr) is not None:
        raise Refused("an operand is computed inside the group by an operator the kernel does not fuse")
    _expect_float32(expr)


def _out_dtype(call) -> None:
    out_dtype = call.attrs.out_dtype
    if out_dtype is not None and str(out_dtype) not in ("", "void", FLOAT32):
        raise Refused(f"out_dtype {out_dtype}")


def _constant_value(expr) -> Optional[np.ndarray]:
    return tvm_compat.constant_array(expr)


def _scalar(expr) -> Optional[float]:
    value = _constant_value(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


@attrs.define
class _Epilogue:
    """Operations after the anchor the kernel fuses, in the order oneDNN applies them."""

    scale: float = 1.0
    bias: Optional[np.ndarray] = None
    residual: object = None
    eltwise: int = NO_ELTWISE


def _other(call, value):
    """The argument of a binary call that is not ``value`` (None when neither or both are)."""
    first, second = call.args
    if first.same_as(value) and not second.same_as(value):
        return second
    if second.same_as(value) and not first.same_as(value):
        return first
    return None


def _gelu_erf(group: Group, rest: list, value) -> int:
    """How many calls of ``rest`` spell out erf GELU on ``value``: x * (erf(x / sqrt2) + 1) * 0.5."""
    if len(rest) < 5:
        return 0
    divide, erf, add, multiply, half = rest[:5]
    names = [tvm_compat.op_name(call) for call in rest[:5]]
    if names != ["relax.divide", "relax.erf", "relax.add", "relax.multiply", "relax.multiply"]:
        return 0
    ok = (
        divide.args[0].same_as(value)
        and _scalar(divide.args[1]) is not None
        and abs(_scalar(divide.args[1]) - SQRT2) < 1e-6
        and erf.args[0].same_as(group.var_of(divide))
        and _scalar(_other(add, group.var_of(erf))) == 1.0
        and _other(multiply, value) is not None
        and _other(multiply, value).same_as(group.var_of(add))
        and _scalar(_other(half, group.var_of(multiply))) == 0.5
    )
    return 5 if ok else 0


def _bias(value: np.ndarray, channels: int, axis_from_end: int) -> Optional[np.ndarray]:
    """``value`` as a per-channel bias, when it adds one number per channel along that axis."""
    shape = value.shape
    if value.size != channels or len(shape) < axis_from_end or shape[-axis_from_end] != channels:
        return None
    return value.reshape(channels).astype(np.float32)


def _epilogue(group: Group, anchor, channels: int, channel_axis_from_end: int, allowed: set[str]) -> _Epilogue:
    """The calls after ``anchor``, read as scale, bias, residual add and activation (each optional, in that order)."""
    rest = group.calls[group.calls.index(anchor) + 1 :]
    value, epilogue, stage = group.var_of(anchor), _Epilogue(), 0
    while rest:
        call, name = rest[0], tvm_compat.op_name(rest[0])
        gelu_calls = _gelu_erf(group, rest, value) if "gelu" in allowed and stage < 4 else 0
        other = _other(call, value) if name in ("relax.add", "relax.multiply") else None
        taken = 1
        if gelu_calls:
            epilogue.eltwise, stage, taken = GELU_ERF, 4, gelu_calls
        elif name == "relax.nn.relu" and stage < 4 and call.args[0].same_as(value):
            epilogue.eltwise, stage = RELU, 4
        elif name == "relax.nn.gelu" and "gelu" in allowed and stage < 4 and call.args[0].same_as(value):
            epilogue.eltwise, stage = GELU_ERF, 4
        elif name == "relax.multiply" and other is not None and "scale" in allowed and stage < 1 and _scalar(other) is not None:
            epilogue.scale, stage = _scalar(other), 1
        elif name == "relax.add" and other is not None and _constant_value(other) is not None:
            bias = _bias(_constant_value(other), channels, channel_axis_from_end)
            if "bias" not in allowed or stage >= 2 or bias is None or epilogue.scale != 1.0:
                raise Refused(f"an added constant of shape {_constant_value(other).shape} that the kernel cannot fuse as a bias")
            epilogue.bias, stage = bias, 2
        elif name == "relax.add" and other is not None and stage < 3:
            _external(group, other)
            if _shape(other) != _shape(call):
                raise Refused("a residual add that broadcasts")
            epilogue.residual, stage = other, 3
        else:
            raise Refused(f"{name} after the anchor is not a post-operation the kernel fuses there")
        value = group.var_of(rest[taken - 1])
        rest = rest[taken:]
    return epilogue


def _padding(values) -> tuple[int, int, int, int]:
    values = _ints(values)
    if len(values) == 1:
        return values * 4
    if len(values) == 2:
        return values * 2
    return values


def _conv2d(group: Group, conv) -> KernelSpec:
    attrs_ = conv.attrs
    for name, wanted in (("data_layout", "NCHW"), ("kernel_layout", "OIHW"), ("out_layout", "NCHW")):
        if str(getattr(attrs_, name)) != wanted:
            raise Refused(f"conv2d {name} {getattr(attrs_, name)} (only {wanted})")
    _out_dtype(conv)
    if group.calls[0] is not conv:
        raise Refused("the group holds operators before the convolution")
    data, weights = conv.args
    _external(group, data)
    if not tvm_compat.is_constant(weights):
        raise Refused("conv2d weights that are not constants")
    n, c, h, w = _shape(data)
    o, _, kh, kw = _shape(weights)
    _, _, oh, ow = _shape(conv)
    groups = int(attrs_.groups)
    if c % groups or o % groups or _shape(weights)[1] * groups != c:
        raise Refused(f"conv2d with {groups} groups over {c} input channels")
    epilogue = _epilogue(group, conv, o, 3, {"bias"})
    operands = [data, weights]
    if epilogue.bias is not None:
        operands.append(relax.const(epilogue.bias, FLOAT32))
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        CONV2D, n, c, h, w, o, kh, kw, groups, oh, ow, *_ints(attrs_.strides), *_ints(attrs_.dilation),
        *_padding(attrs_.padding), int(epilogue.bias is not None), int(epilogue.residual is not None),
        int(epilogue.eltwise == RELU), BLOCKED_ACTIVATIONS, 0,
    )
    return KernelSpec(words, tuple(operands), packed_operand=1)


def _plain_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides


def _matmul_operand(group: Group, expr, rank: int) -> tuple[object, list[int], list[int]]:
    """The tensor the kernel reads, and the dims and strides it sees it through (transposes absorbed)."""
    producer = group.producer(expr)
    if producer is not None and tvm_compat.op_name(producer) == "relax.permute_dims":
        source = producer.args[0]
        _external(group, source)
        source_shape = _shape(source)
        axes = _ints(producer.attrs.axes) if producer.attrs.axes is not None else tuple(reversed(range(len(source_shape))))
        plain = _plain_strides(source_shape)
        dims, strides = [source_shape[a] for a in axes], [plain[a] for a in axes]
    else:
        _external(group, expr)
        source = expr
        dims = list(_shape(expr))
        strides = _plain_strides(dims)
    if len(dims) < 2:
        raise Refused("matmul of a vector")
    total = math.prod(dims)
    while len(dims) < rank:
        dims.insert(0, 1)
        strides.insert(0, total)
    return source, dims, strides


def _matmul(group: Group, matmul) -> KernelSpec:
    _out_dtype(matmul)
    out_shape = _shape(matmul)
    rank = len(out_shape)
    if rank > 6:
        raise Refused(f"matmul of rank {rank}")
    lhs, lhs_dims, lhs_strides = _matmul_operand(group, matmul.args[0], rank)
    rhs, rhs_dims, rhs_strides = _matmul_operand(group, matmul.args[1], rank)
    for axis in range(rank - 2):
        if lhs_dims[axis] != rhs_dims[axis] and 1 not in (lhs_dims[axis], rhs_dims[axis]):
            raise Refused("matmul batch dimensions that do not broadcast")
        if lhs_dims[axis] == 1 and rhs_dims[axis] != 1:
            raise Refused("matmul whose left operand broadcasts over the batch")
    consumed = {group.producer(arg) for arg in matmul.args} - {None}
    if set(group.calls[: group.calls.index(matmul)]) != consumed:
        raise Refused("the group holds operators before the matmul that the kernel does not absorb")
    epilogue = _epilogue(group, matmul, out_shape[-1], 1, {"scale", "bias", "gelu"})
    operands = [lhs, rhs]
    bias_words: tuple[int, ...] = (0,)
    if epilogue.bias is not None:
        operands.append(relax.const(epilogue.bias, FLOAT32))
        bias_words = (1, *([1] * (rank - 1)), out_shape[-1])
    if epilogue.residual is not None:
        operands.append(epilogue.residual)
    words = (
        MATMUL, rank, *lhs_dims, *lhs_strides, *rhs_dims, *rhs_strides, *out_shape, *bias_words,
        float_word(epilogue.scale), epilogue.eltwise, int(epilogue.residual is not None),
    )
    return KernelSpec(words, tuple(operands))


def _pool2d(pool) -> KernelSpec:
    attrs_ = pool.attrs
    if str(attrs_.layout) != "NCHW" or str(attrs_.out_layout) != "NCHW":
        raise Refused(f"pooling layout {attrs_.layout} (only NCHW)")
    data = pool.args[0]
    _expect_float32(data)
    shape = _shape(data)
    if len(shape) != 4:
        raise Refused("pooling on other than 4-d tensors")
    kernel, strides, dilation = _ints(attrs_.pool_size), _ints(attrs_.strides), _ints(attrs_.dilation)
    padding = _padding(attrs_.padding)
    out = _shape(pool)[2:]
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
    shape = _shape(data)
    axis = int(softmax.attrs.axis) % len(shape)
    return KernelSpec((SOFTMAX, len(shape), *shape, axis), (data,))


def _layer_norm(group: Group, norm) -> KernelSpec:
    data, gamma, beta = norm.args
    shape = _shape(data)
    axes = [int(a) % len(shape) for a in norm.attrs.axes]
    if axes != [len(shape) - 1]:
        raise Refused(f"layer_norm over axes {axes} (only the last)")
    if not (norm.attrs.center and norm.attrs.scale):
        raise Refused("layer_norm without both scale and shift")
    for operand in (data, gamma, beta):
        _external(group, operand)
    if _shape(gamma) != (shape[-1],) or _shape(beta) != (shape[-1],):
        raise Refused("layer_norm scale or shift not of the normalized length")
    return KernelSpec((LAYER_NORM, len(shape), *shape, float_word(norm.attrs.epsilon)), (data, gamma, beta))
