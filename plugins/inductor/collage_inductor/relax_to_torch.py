"""A Collage partition (a Relax function of one dataflow block) as a PyTorch program.

:func:`convert` gives a ``torch.nn.Module`` whose ``forward`` takes the partition's parameters
and returns its results as a tuple of tensors (a tuple's fields in order); Relax constants become
the module's buffers. ``torch.export`` traces it into the FX graph that torch.compile compiles.
Each operator is converted only after :func:`refusal` has accepted it: the ONNX converter's
refusals (``collage_core.kit.engine_operators``: the attribute combinations where Relax's meaning
is easy to get wrong), then PyTorch's own (:data:`TORCH_REFUSALS`).

The program holds no device: :func:`exported` traces it at the partition's shapes and dtypes with
CPU tensors, and the runtime moves it to the device it runs on (``move_to_device_pass``), so one
lowering serves any device and needs none. Its dtypes are the partition's: float32, and on a GPU
the 16-bit types of ``collage optimize --precision bf16|fp16`` (:data:`SIXTEEN_BIT`). A product of
16-bit operands that Relax accumulates into a float32 result runs as PyTorch's 16-bit product
(tensor cores, float32 accumulation) widened to float32: the result rounded once to 16 bits. TVM's
mixed-precision pass casts nearly every such product back to 16 bits, where the two agree; elsewhere
they differ by that rounding, within the precision's tolerance.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tvm import relax

from collage_core.kit import engine_operators, tvm_compat


class UnsupportedError(ValueError):
    """The function holds something the converter cannot reproduce exactly."""


def _shape(expr) -> tuple[int, ...]:
    return tvm_compat.tensor_shape_dtype(expr)[0]


def _ints(values) -> list[int]:
    return [int(v) for v in values]


# Operator name -> what PyTorch computes differently although the ONNX converter takes it (nothing, now: pooling
# pads explicitly and resizing interpolates with its own weights, so PyTorch's own rules never decide).
TORCH_REFUSALS: dict[str, Callable] = {}

SUPPORTED_OPS = engine_operators.SUPPORTED_OPS


# The 16-bit floating types the converter takes besides float32 where the backend opts in (on CUDA).
SIXTEEN_BIT = engine_operators.SIXTEEN_BIT


def refusal(call, sixteen_bit: frozenset = frozenset()) -> Optional[str]:
    """Why ``call`` cannot be converted to PyTorch faithfully, or None when it can; ``sixteen_bit``: the
    16-bit types taken besides float32 (see ``collage_core.kit.engine_operators.refusal``)."""
    refused = engine_operators.refusal(call, sixteen_bit)
    if refused:
        return refused
    check = TORCH_REFUSALS.get(tvm_compat.op_name(call))
    return check(call) if check is not None else None


def _torch_dtype(dtype: str) -> torch.dtype:
    """``float32`` -> ``torch.float32`` (the converter's dtypes are named alike in both)."""
    return getattr(torch, dtype)


def _as_tensor(array) -> torch.Tensor:
    """A numpy array (ml_dtypes' bfloat16 too, which torch.from_numpy does not know) as a CPU tensor of its dtype."""
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":  # every bfloat16 value is a float32 value: widen, then narrow exactly
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def _accumulating(call, fn) -> Callable:
    """``fn`` for a product whose 16-bit operands Relax accumulates into a wider result (``out_dtype``): PyTorch's
    16-bit product (float32 accumulation, the result in the operands' type) widened to that result's dtype."""
    result, operands = (tvm_compat.tensor_shape_dtype(expr)[1] for expr in (call, call.args[0]))
    if result == operands:
        return fn
    dtype = _torch_dtype(result)
    return lambda *args: fn(*args).to(dtype)


def _matmul(call):
    return _accumulating(call, torch.matmul)


def _elementwise(fn) -> Callable:
    """A converter for an operator whose tensor arguments map one to one onto ``fn``'s."""
    return lambda call: fn


def _gelu(call):
    return lambda x: F.gelu(x)


def _gelu_tanh(call):
    return lambda x: F.gelu(x, approximate="tanh")


def _clip(call):
    low, high = (tvm_compat.scalar_constant(bound) for bound in call.args[1:])
    return lambda x, _low, _high: torch.clamp(x, low, high)


def _conv2d(call):
    attrs = call.attrs
    top, left, bottom, right = _ints(attrs.padding)
    strides, dilation, groups = _ints(attrs.strides), _ints(attrs.dilation), int(attrs.groups)
    if (top, left) == (bottom, right):
        return _accumulating(call, lambda x, w: F.conv2d(x, w, None, strides, [top, left], dilation, groups))
    return _accumulating(call, lambda x, w: F.conv2d(F.pad(x, [left, right, top, bottom]), w, None, strides, 0, dilation, groups))


def _pool2d(call):
    """Explicit padding over the windows' reach (ceil mode's overhang included) and a pooling without any, so that
    PyTorch's rules for padding never decide; an average divides each window's sum by Relax's count."""
    axes = engine_operators.pool_axes(call)
    is_max = call.op.name == "relax.nn.max_pool2d"
    include = not is_max and bool(call.attrs.count_include_pad)
    if engine_operators.is_global_pool(call):
        if is_max:
            return lambda x: torch.amax(x, dim=(2, 3), keepdim=True)
        counted = float(axes[0].divisor(-axes[0].begin, include) * axes[1].divisor(-axes[1].begin, include))
        return lambda x: torch.sum(x, dim=(2, 3), keepdim=True) / counted
    height, width = axes
    padding = [width.begin, width.reached_end(), height.begin, height.reached_end()]
    kernel, strides = [height.kernel, width.kernel], [height.stride, width.stride]
    if is_max:
        dilation = [height.dilation, width.dilation]
        return lambda x: F.max_pool2d(F.pad(x, padding, value=float("-inf")), kernel, strides, 0, dilation)
    counts = np.outer(*[[axis.divisor(index * axis.stride - axis.begin, include) for index in range(axis.length)] for axis in axes])
    divisor = torch.from_numpy(counts.astype(np.float32)).to(_torch_dtype(tvm_compat.tensor_shape_dtype(call)[1]))
    return lambda x: F.avg_pool2d(F.pad(x, padding), kernel, strides, 0, divisor_override=1) / divisor


def _interpolation(call, axis: int) -> np.ndarray:
    """The (output length, input length) matrix of weights resize2d reads each output from along ``axis``, in float64
    from the exact source coordinates; each tap's index clamped to the input, as TVM reads the edge again."""
    attrs = call.attrs
    size, length = _shape(call.args[0])[axis], _shape(call)[axis]
    weights = np.zeros((length, size))
    for index in range(length):
        source = engine_operators.resize_source(str(attrs.coordinate_transformation_mode), size, length, index)
        base = math.floor(source)
        t = float(source - base)
        if str(attrs.method) == "linear":
            taps = {base: 1 - t, base + 1: t}
        else:  # cubic: TVM's spline weights for the four taps around the coordinate
            a = float(attrs.cubic_alpha)
            taps = {
                base - 1: a * (t**3 - 2 * t**2 + t),
                base: (a + 2) * t**3 - (3 + a) * t**2 + 1,
                base + 1: -(a + 2) * t**3 + (3 + 2 * a) * t**2 - a * t,
                base + 2: -a * t**3 + a * t**2,
            }
        for tap, weight in taps.items():
            weights[index, min(max(tap, 0), size - 1)] += weight
    return weights


def _nearest_indices(call, axis: int) -> list[int]:
    """The input index each output reads along ``axis`` (the support check has left no coordinate whose rounding
    is in doubt), clamped to the input."""
    attrs = call.attrs
    size, length = _shape(call.args[0])[axis], _shape(call)[axis]
    rounding = engine_operators.resize_rounding(call)
    indices = []
    for index in range(length):
        source = engine_operators.resize_source(str(attrs.coordinate_transformation_mode), size, length, index)
        if rounding == "floor":
            nearest = math.floor(source)
        elif rounding in ("ceil",):
            nearest = math.ceil(source)
        elif rounding == "round_prefer_ceil":
            nearest = math.floor(source + Fraction(1, 2))
        else:  # round_prefer_floor, and round where no coordinate is a half
            nearest = math.ceil(source - Fraction(1, 2))
        indices.append(min(max(nearest, 0), size - 1))
    return indices


def _resize2d(call):
    if str(call.attrs.method) == "nearest_neighbor":
        rows, columns = (torch.tensor(_nearest_indices(call, axis)) for axis in (2, 3))
        return lambda x, *_: x.index_select(2, rows).index_select(3, columns)
    dtype = _torch_dtype(tvm_compat.tensor_shape_dtype(call)[1])
    rows, columns = (torch.from_numpy(_interpolation(call, axis)).to(dtype) for axis in (2, 3))
    return lambda x, *_: torch.matmul(torch.matmul(rows, x), columns.T)


def _pad(call):
    before, after = engine_operators.pad_widths(call)
    mode = str(call.attrs.pad_mode)
    if mode == "constant":
        widths = [width for pair in zip(reversed(before), reversed(after)) for width in pair]  # last axis first
        value = float(call.attrs.pad_value)
        return lambda x: F.pad(x, widths, value=value)
    # Reflect and replicate as a gather along each padded axis (F.pad takes them on the last three axes only).
    gathers = []
    for axis, (size, low, high) in enumerate(zip(_shape(call.args[0]), before, after)):
        if low or high:
            sources = [index - low for index in range(low + size + high)]
            if mode == "reflect":
                sources = [abs(source) if source < 0 else min(source, 2 * (size - 1) - source) for source in sources]
            else:
                sources = [min(max(source, 0), size - 1) for source in sources]
            gathers.append((axis, torch.tensor(sources)))

    def pad(x):
        for axis, sources in gathers:
            x = x.index_select(axis, sources)
        return x

    return pad


def _adaptive_avg_pool2d(call):
    return lambda x: torch.mean(x, dim=(2, 3), keepdim=True)


def _reduce(fn_all, fn_dims):
    def convert(call):
        axis, keepdim = call.attrs.axis, bool(call.attrs.keepdims)
        if axis is None:
            rank = len(_shape(call.args[0]))
            return lambda x: fn_dims(x, tuple(range(rank)), keepdim) if keepdim else fn_all(x)
        dims = tuple(_ints(axis))
        return lambda x: fn_dims(x, dims, keepdim)

    return convert


def _softmax(fn):
    def convert(call):
        axis = int(call.attrs.axis)
        return lambda x: fn(x, dim=axis)

    return convert


def _layer_norm(call):
    rank = len(_shape(call.args[0]))
    first_axis = min(axis % rank for axis in _ints(call.attrs.axes))
    normalized, epsilon = list(_shape(call.args[0])[first_axis:]), float(call.attrs.epsilon)
    return lambda x, gamma, beta: F.layer_norm(x, normalized, gamma, beta, epsilon)


def _reshape(call):
    # reshape, flatten, squeeze and expand_dims all end at the call's static output shape.
    shape = list(_shape(call))
    return lambda x, *_: torch.reshape(x, shape)


def _permute_dims(call):
    rank = len(_shape(call.args[0]))
    axes = call.attrs.axes
    perm = [axis % rank for axis in (_ints(axes) if axes is not None else reversed(range(rank)))]
    return lambda x: torch.permute(x, perm)


def _broadcast_to(call):
    shape = list(_shape(call))
    return lambda x, *_: torch.broadcast_to(x, shape).contiguous()


def _concat(call):
    axis = int(call.attrs.axis)
    return lambda tensors: torch.cat(list(tensors), dim=axis)


def _strided_slice(call):
    bounds = engine_operators.strided_slice_bounds(call)
    rank = len(_shape(call.args[0]))
    index = [slice(None)] * rank
    for axis, start, stop, step in bounds:
        index[axis] = slice(start, stop, step)
    return lambda x, *_: x[tuple(index)]


def _take(call):
    data_shape = _shape(call.args[0])
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis) % len(data_shape)
    extent = data_shape[axis]
    wrap = str(call.attrs.mode) == "wrap"

    def take(data, indices):
        indices = indices.to(torch.int64)
        if wrap:  # the check admits wrap only with constant indices in [-extent, extent)
            indices = torch.remainder(indices, extent)
        picked = torch.index_select(data, axis, indices.reshape(-1))
        return picked.reshape(list(data_shape[:axis]) + list(indices.shape) + list(data_shape[axis + 1 :]))

    return take


def _astype(call):
    dtype = _torch_dtype(tvm_compat.tensor_shape_dtype(call)[1])
    return lambda x: x.to(dtype)


def _split(call):
    axis, sizes = engine_operators.split_axis_and_sizes(call)
    return lambda x: tuple(torch.split(x, sizes, dim=axis))


def _rsqrt(call):
    return lambda x: torch.rsqrt(x)


def _silu(call):
    return lambda x: F.silu(x)


# Operator name -> a function of the call giving the torch function of its arguments.
CONVERTERS: dict[str, Callable] = {
    "relax.add": _elementwise(torch.add),
    "relax.subtract": _elementwise(torch.sub),
    "relax.multiply": _elementwise(torch.mul),
    "relax.divide": _elementwise(torch.div),
    "relax.power": _elementwise(torch.pow),
    "relax.maximum": _elementwise(torch.maximum),
    "relax.minimum": _elementwise(torch.minimum),
    "relax.less": _elementwise(torch.lt),
    "relax.less_equal": _elementwise(torch.le),
    "relax.greater": _elementwise(torch.gt),
    "relax.greater_equal": _elementwise(torch.ge),
    "relax.equal": _elementwise(torch.eq),
    "relax.not_equal": _elementwise(torch.ne),
    "relax.where": _elementwise(torch.where),
    "relax.nn.relu": _elementwise(torch.relu),
    "relax.nn.gelu": _gelu,
    "relax.nn.gelu_tanh": _gelu_tanh,
    "relax.nn.silu": _silu,
    "relax.sigmoid": _elementwise(torch.sigmoid),
    "relax.tanh": _elementwise(torch.tanh),
    "relax.erf": _elementwise(torch.erf),
    "relax.sqrt": _elementwise(torch.sqrt),
    "relax.rsqrt": _rsqrt,
    "relax.exp": _elementwise(torch.exp),
    "relax.log": _elementwise(torch.log),
    "relax.negative": _elementwise(torch.neg),
    "relax.abs": _elementwise(torch.abs),
    "relax.isnan": _elementwise(torch.isnan),
    "relax.logical_not": _elementwise(torch.logical_not),
    "relax.clip": _clip,
    "relax.nn.conv2d": _conv2d,
    "relax.matmul": _matmul,
    "relax.nn.max_pool2d": _pool2d,
    "relax.nn.avg_pool2d": _pool2d,
    "relax.nn.adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "relax.image.resize2d": _resize2d,
    "relax.nn.pad": _pad,
    "relax.mean": _reduce(torch.mean, lambda x, dims, keepdim: torch.mean(x, dim=dims, keepdim=keepdim)),
    "relax.sum": _reduce(torch.sum, lambda x, dims, keepdim: torch.sum(x, dim=dims, keepdim=keepdim)),
    "relax.max": _reduce(torch.amax, lambda x, dims, keepdim: torch.amax(x, dim=dims, keepdim=keepdim)),
    "relax.min": _reduce(torch.amin, lambda x, dims, keepdim: torch.amin(x, dim=dims, keepdim=keepdim)),
    "relax.nn.softmax": _softmax(torch.softmax),
    "relax.nn.log_softmax": _softmax(torch.log_softmax),
    "relax.nn.layer_norm": _layer_norm,
    "relax.reshape": _reshape,
    "relax.flatten": _reshape,
    "relax.squeeze": _reshape,
    "relax.expand_dims": _reshape,
    "relax.permute_dims": _permute_dims,
    "relax.broadcast_to": _broadcast_to,
    "relax.concat": _concat,
    "relax.strided_slice": _strided_slice,
    "relax.take": _take,
    "relax.astype": _astype,
    "relax.split": _split,
}


STATIC_AFTER_FIRST = frozenset({"relax.reshape", "relax.broadcast_to", "relax.strided_slice", "relax.clip", "relax.image.resize2d"})


class RelaxProgram(torch.nn.Module):
    """Runs the converted steps: each takes tensors (or tuples of them) named by references and
    binds its result to a new name. References: ``("input", i)``, ``("buffer", name)``,
    ``("value", i)``, ``("tuple", [refs])``, ``("item", ref, index)``."""

    def __init__(self, steps, outputs, constants: dict[str, np.ndarray]):
        super().__init__()
        self.steps, self.outputs = steps, outputs
        for name, array in constants.items():
            self.register_buffer(name, _as_tensor(array), persistent=True)

    def _resolve(self, reference, inputs, values):
        kind = reference[0]
        if kind == "input":
            return inputs[reference[1]]
        if kind == "buffer":
            return getattr(self, reference[1])
        if kind == "value":
            return values[reference[1]]
        if kind == "tuple":
            return tuple(self._resolve(r, inputs, values) for r in reference[1])
        return self._resolve(reference[1], inputs, values)[reference[2]]  # "item"

    def forward(self, *inputs):
        values = []
        for fn, arguments in self.steps:
            values.append(fn(*[self._resolve(r, inputs, values) for r in arguments]))
        return tuple(self._resolve(r, inputs, values) for r in self.outputs)


class _Builder:
    def __init__(self, sixteen_bit: frozenset):
        self.sixteen_bit = sixteen_bit
        self.steps: list = []
        self.references: dict = {}  # Relax expression -> reference
        self.constants: dict[str, np.ndarray] = {}

    def reference(self, expr):
        if expr in self.references:
            return self.references[expr]
        if isinstance(expr, relax.Tuple):
            return ("tuple", [self.reference(field) for field in expr.fields])
        array = tvm_compat.constant_array(expr)
        if array is not None:
            name = f"constant_{len(self.constants)}"
            self.constants[name] = np.asarray(array)
            self.references[expr] = ("buffer", name)
            return self.references[expr]
        raise UnsupportedError(f"argument {type(expr).__name__} {expr} is neither a converted value nor a constant")

    def call(self, call):
        refused = refusal(call, self.sixteen_bit)
        if refused:
            raise UnsupportedError(refused)
        fn = CONVERTERS[tvm_compat.op_name(call)](call)
        # Operators whose later arguments are static (a shape, bounds) that the converter already read.
        tensor_arguments = 1 if tvm_compat.op_name(call) in STATIC_AFTER_FIRST else len(call.args)
        arguments = [self.reference(arg) if index < tensor_arguments else ("tuple", []) for index, arg in enumerate(call.args)]
        self.steps.append((fn, arguments))
        return ("value", len(self.steps) - 1)


def convert(func: relax.Function, sixteen_bit: frozenset = frozenset()) -> RelaxProgram:
    """``func`` as a PyTorch module; raises :class:`UnsupportedError` for anything it cannot reproduce.
    ``sixteen_bit``: the 16-bit types (of :data:`SIXTEEN_BIT`) taken besides float32."""
    b = _Builder(sixteen_bit)
    for index, param in enumerate(func.params):
        try:
            tvm_compat.tensor_shape_dtype(param)
        except ValueError as error:
            raise UnsupportedError(f"parameter {param.name}: {error}") from None
        b.references[param] = ("input", index)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        raise UnsupportedError("function body is not a sequence of binding blocks")
    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise UnsupportedError(f"{type(binding).__name__} (only plain variable bindings)")
            value = binding.value
            if isinstance(value, relax.Var):
                b.references[binding.var] = b.reference(value)
            elif isinstance(value, relax.Tuple):
                b.references[binding.var] = ("tuple", [b.reference(field) for field in value.fields])
            elif isinstance(value, relax.TupleGetItem):
                b.references[binding.var] = ("item", b.reference(value.tuple_value), int(value.index))
            elif tvm_compat.is_op_call(value):
                b.references[binding.var] = b.call(value)
            else:
                raise UnsupportedError(f"binding of {type(value).__name__}: {value}")
    result = body.body
    ty = tvm_compat.value_type(result)
    if isinstance(ty, relax.TupleType):
        outputs = [("item", b.reference(result), index) for index in range(len(ty.fields))]
    else:
        outputs = [b.reference(result)]
    return RelaxProgram(b.steps, outputs, b.constants)


def example_inputs(func: relax.Function) -> tuple[torch.Tensor, ...]:
    """Zero CPU tensors of the parameters' static shapes and dtypes (what ``torch.export`` traces with)."""
    inputs = []
    for param in func.params:
        shape, dtype = tvm_compat.tensor_shape_dtype(param)
        inputs.append(torch.zeros(shape, dtype=_torch_dtype(dtype)))
    return tuple(inputs)


def exported(func: relax.Function, sixteen_bit: frozenset = frozenset()) -> "torch.export.ExportedProgram":
    """``func`` converted and traced by ``torch.export`` at its static shapes and dtypes, on the CPU (the
    runtime moves it to its device)."""
    return torch.export.export(convert(func, sixteen_bit), example_inputs(func), strict=False)
