"""Which Relax operator calls the ONNX converter reproduces exactly, and why it refuses the others.

The backend's patterns ask :func:`supports` before a match becomes a candidate, and the
converter asks :func:`refusal` before it converts, so an operator the converter cannot
reproduce faithfully is refused, never miscomputed.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, NamedTuple, Optional

from tvm import relax

from collage_core import tvm_compat

FLOAT = frozenset({"float32"})
# Integer arithmetic is exact in both runtimes; integer division and powers are not the same.
NUMERIC = frozenset({"float32", "int64"})
# Operators that only move or select values: any dtype both runtimes store the same way.
MOVABLE = frozenset({"float32", "int32", "int64", "bool"})
INDEX = frozenset({"int32", "int64"})
BOOL = frozenset({"bool"})
# 16-bit floating types a backend may opt into (``sixteen_bit``): wherever float32 is taken, and as the operands
# of a matrix product or convolution accumulating into float32, as TVM's mixed-precision pass writes them.
SIXTEEN_BIT = frozenset({"bfloat16", "float16"})
PRODUCTS = ("relax.matmul", "relax.nn.conv2d")

NCHW_CONV_LAYOUTS = {"data_layout": "NCHW", "kernel_layout": "OIHW", "out_layout": "NCHW"}
NCHW_POOL_LAYOUTS = {"layout": "NCHW", "out_layout": "NCHW"}


def _shape(expr) -> tuple[int, ...]:
    return tvm_compat.tensor_shape_dtype(expr)[0]


def _dtype(expr) -> str:
    return tvm_compat.tensor_shape_dtype(expr)[1]


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _layouts(call, wanted: dict) -> Optional[str]:
    for name, layout in wanted.items():
        if str(getattr(call.attrs, name)) != layout:
            return f"{name} {getattr(call.attrs, name)} (only {layout})"
    return None


def _out_dtype(call) -> Optional[str]:
    out_dtype = call.attrs.out_dtype
    if out_dtype is None or str(out_dtype) in ("", "void", _dtype(call.args[0])):
        return None
    if str(out_dtype) == "float32" and _dtype(call.args[0]) in SIXTEEN_BIT:
        return None  # 16-bit operands accumulating into float32: refusal() allows it only where the backend opted in
    return f"out_dtype {out_dtype} differs from the input's"


def _check_conv2d(call) -> Optional[str]:
    if len(_shape(call.args[0])) != 4 or len(_shape(call.args[1])) != 4:
        return "conv2d on other than 4-d tensors"
    return _layouts(call, NCHW_CONV_LAYOUTS) or _out_dtype(call)


def _check_matmul(call) -> Optional[str]:
    return _out_dtype(call)


def _check_clip(call) -> Optional[str]:
    low, high = (tvm_compat.scalar_constant(bound) for bound in call.args[1:])
    if low is None or high is None:
        return "clip bounds that are not constants"
    if low > high:
        # Relax's max(min(x, high), low) gives low; ONNX Clip's min(max(x, low), high) gives high.
        return f"clip with min {low} above max {high}"
    return None


class PoolAxis(NamedTuple):
    """One spatial axis of a pooling: its explicit padding, and the windows Relax computes (``length`` of them, the
    i-th starting at ``i * stride - begin``, in ceil mode or not)."""

    size: int
    kernel: int
    stride: int
    dilation: int
    begin: int
    end: int
    length: int

    def windows(self):
        """Each window's taps, in the input's coordinates (negative or past the end: padding)."""
        for index in range(self.length):
            start = index * self.stride - self.begin
            yield [start + tap * self.dilation for tap in range(self.kernel)]

    def reached_end(self) -> int:
        """The end padding the windows reach: with it, floor mode gives exactly ``length`` windows (ceil mode's
        overhang included, the padding past the last window left out)."""
        reach = (self.length - 1) * self.stride + self.dilation * (self.kernel - 1) + 1
        return max(0, reach - self.size - self.begin)

    def covers_input(self) -> bool:
        """One contiguous window over the whole input: the pooling is a global one."""
        return self.length == 1 and (self.dilation == 1 or self.kernel == 1) and self.kernel - self.begin >= self.size

    def divisor(self, start: int, count_include_pad: bool) -> int:
        """How many elements of the window starting at ``start`` an average divides by, as Relax (and PyTorch) count: the
        explicit padding when ``count_include_pad``, never ceil mode's overhang."""
        low, high = (-self.begin, self.size + self.end) if count_include_pad else (0, self.size)
        return max(0, min(start + self.kernel, high) - max(start, low))


def pool_axes(call) -> tuple[PoolAxis, PoolAxis]:
    """The pooling's height and width axes (its static shapes; Relax padding is top, left, bottom, right)."""
    attrs, padding = call.attrs, _ints(call.attrs.padding)
    return tuple(
        PoolAxis(
            _shape(call.args[0])[2 + axis],
            int(attrs.pool_size[axis]),
            int(attrs.strides[axis]),
            int(attrs.dilation[axis]),
            padding[axis],
            padding[axis + 2],
            _shape(call)[2 + axis],
        )
        for axis in (0, 1)
    )


def _pool_axis_refusal(axis: PoolAxis) -> Optional[str]:
    if axis.length < 1:
        return "pooling to an empty output"
    for taps in axis.windows():
        if not any(0 <= tap < axis.size for tap in taps):
            return "pooling with a window wholly in the padding"
    if axis.covers_input():
        return None
    if max(axis.begin, axis.reached_end()) >= axis.kernel:
        # ONNX Runtime refuses pads as wide as the kernel.
        return "pooling with padding as wide as the window (ONNX takes pads narrower than the kernel)"
    return None


def is_global_pool(call) -> bool:
    """Whether the pooling's one window covers its whole input (each axis)."""
    return all(axis.covers_input() for axis in pool_axes(call))


def _check_pool2d(call) -> Optional[str]:
    refused = _layouts(call, NCHW_POOL_LAYOUTS)
    if refused:
        return refused
    if len(_shape(call.args[0])) != 4:
        return "pooling on other than 4-d tensors"
    if call.op.name == "relax.nn.avg_pool2d" and _ints(call.attrs.dilation) != (1, 1):
        return "avg_pool2d with dilation (ONNX AveragePool has none before opset 19)"
    return next(filter(None, (_pool_axis_refusal(axis) for axis in pool_axes(call))), None)


# Relax's resize2d methods and coordinate transformations -> ONNX Resize-13's (opset 17 has no tf_half_pixel_for_nn).
RESIZE_METHODS = {"nearest_neighbor": "nearest", "linear": "linear", "cubic": "cubic"}
RESIZE_COORDINATES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")
# Relax's nearest rounding methods -> ONNX's nearest_mode. Relax's "round" rounds halves to even, which ONNX cannot:
# it is taken where no source coordinate is a half (then every rounding of halves agrees).
NEAREST_MODES = {
    "round": "round_prefer_floor",
    "round_prefer_floor": "round_prefer_floor",
    "round_prefer_ceil": "round_prefer_ceil",
    "floor": "floor",
    "ceil": "ceil",
}
# TVM floors ``x + 1e-5`` and ceils ``x - 1e-5``; a source coordinate nearer a rounding boundary than this (and
# not on it) may round either way in float32.
NEAREST_MARGIN = 1e-4


def resize_rounding(call) -> str:
    """The rounding method TVM applies to a nearest resize (its default where the attribute is empty)."""
    method = str(call.attrs.rounding_method)
    if method:
        return method
    return "round" if str(call.attrs.coordinate_transformation_mode) == "align_corners" else "floor"


def resize_source(mode: str, size: int, length: int, index: int) -> Fraction:
    """The exact source coordinate of output ``index`` (ONNX's formulas, which are TVM's in exact arithmetic)."""
    if mode == "align_corners":
        return Fraction(index * (size - 1), length - 1) if length > 1 else Fraction(0)
    if mode == "asymmetric":
        return Fraction(index * size, length)
    if mode == "pytorch_half_pixel" and length == 1:
        return Fraction(0)
    return (index + Fraction(1, 2)) * Fraction(size, length) - Fraction(1, 2)


def _exactly_computed(mode: str, size: int, length: int, rounding: str) -> bool:
    """Whether every runtime computes the source coordinates exactly in float32: the ratio is a power of two, or
    TVM divides integers (an asymmetric, floored upscale by a whole factor, which ONNX divides by exactly)."""
    ratio = Fraction(size - 1, length - 1) if mode == "align_corners" else Fraction(size, length)
    power_of_two = ratio.numerator & (ratio.numerator - 1) == 0 and ratio.denominator & (ratio.denominator - 1) == 0
    return power_of_two or (mode == "asymmetric" and rounding == "floor" and length % size == 0)


def _nearest_axis_refusal(mode: str, size: int, length: int, rounding: str) -> Optional[str]:
    halves = rounding not in ("floor", "ceil")
    for index in range(length):
        source = resize_source(mode, size, length, index)
        # The nearest boundary where the rounding changes, and the index just below it.
        boundary = math.floor(source) + Fraction(1, 2) if halves else Fraction(round(source))
        below = math.floor(boundary) if halves else int(boundary) - 1
        if below + 1 <= 0 or below >= size - 1:
            continue  # both sides of the boundary read the same clamped edge pixel
        distance = abs(source - boundary)
        if distance == 0 and rounding == "round":
            return f"nearest resize rounding the half {float(source)} to even (ONNX rounds halves one way)"
        if distance == 0 and not _exactly_computed(mode, size, length, rounding):
            return (
                f"nearest resize {size} -> {length} ({mode}) whose source coordinate {float(source)} is a "
                "rounding boundary the runtimes compute inexactly"
            )
        if 0 < distance < NEAREST_MARGIN * max(1, abs(source)):
            return f"nearest resize {size} -> {length} ({mode}) with a source coordinate within float32 error of a rounding boundary"
    return None


def _check_resize2d(call) -> Optional[str]:
    attrs = call.attrs
    if str(attrs.layout) != "NCHW":
        return f"resize2d layout {attrs.layout} (only NCHW)"
    if len(_shape(call.args[0])) != 4:
        return "resize2d on other than a 4-d tensor"
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "void", _dtype(call.args[0])):
        return f"resize2d out_dtype {attrs.out_dtype} differs from the input's"
    method, mode = str(attrs.method), str(attrs.coordinate_transformation_mode)
    if method not in RESIZE_METHODS:
        return f"resize2d method {method}"
    if mode not in RESIZE_COORDINATES:
        return f"resize2d coordinate_transformation_mode {mode} (ONNX Resize-13 takes {', '.join(RESIZE_COORDINATES)})"
    sizes, lengths = _shape(call.args[0])[2:], _shape(call)[2:]
    if mode == "align_corners" and any(length == 1 < size for size, length in zip(sizes, lengths)):
        return "resize2d with align_corners to a length of 1 (TVM divides by zero)"
    if method == "cubic" and int(attrs.cubic_exclude):
        # ONNX Runtime renormalizes as TVM does; OpenVINO 2026.4 gives other numbers (off by up to 0.4).
        return "cubic resize with exclude_outside (the runtimes renormalize the weights differently)"
    if method == "nearest_neighbor":
        rounding = resize_rounding(call)
        if rounding not in NEAREST_MODES:
            return f"resize2d rounding_method {rounding}"
        return next(filter(None, (_nearest_axis_refusal(mode, size, length, rounding) for size, length in zip(sizes, lengths))), None)
    return None


PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


def pad_widths(call) -> tuple[list[int], list[int]]:
    """``nn.pad``'s widths before and after each axis (Relax interleaves them: before_0, after_0, before_1, ...)."""
    widths = _ints(call.attrs.pad_width)
    return list(widths[0::2]), list(widths[1::2])


def _check_pad(call) -> Optional[str]:
    mode = str(call.attrs.pad_mode)
    if mode not in PAD_MODES:
        return f"pad in mode {mode} (ONNX Pad-13 takes constant, reflect and edge)"
    shape = _shape(call.args[0])
    before, after = pad_widths(call)
    if len(before) != len(shape) or len(after) != len(shape):
        return f"pad widths {_ints(call.attrs.pad_width)} for a {len(shape)}-d tensor"
    if min(before + after) < 0:
        return "pad with negative widths"
    if mode == "reflect" and any(max(b, a) >= size for b, a, size in zip(before, after, shape)):
        return "reflect pad as wide as the axis it mirrors"
    if mode == "constant" and _dtype(call) in INDEX and not float(call.attrs.pad_value).is_integer():
        return f"pad of {_dtype(call)} with the value {float(call.attrs.pad_value)}"
    return None


def _check_adaptive_avg_pool2d(call) -> Optional[str]:
    refused = _layouts(call, NCHW_POOL_LAYOUTS)
    if refused:
        return refused
    if len(_shape(call.args[0])) != 4 or _shape(call)[2:] != (1, 1):
        return "adaptive_avg_pool2d to other than a 1x1 output (only GlobalAveragePool)"
    return None


def _check_reduce(call) -> Optional[str]:
    if call.attrs.axis is not None and len(call.attrs.axis) == 0:
        return "a reduction over an empty axis list"
    return None


def _check_layer_norm(call) -> Optional[str]:
    shape = _shape(call.args[0])
    axes = sorted(axis % len(shape) for axis in _ints(call.attrs.axes))
    if not axes or axes != list(range(axes[0], len(shape))):
        return f"layer_norm over axes {axes}, not the trailing ones (ONNX LayerNormalization)"
    if not (call.attrs.center and call.attrs.scale):
        # The attributes say to leave out beta or gamma; TVM 0.27's legalization applies both anyway.
        return "layer_norm with center or scale off (TVM and its attributes disagree on the meaning)"
    normalized = shape[axes[0] :]
    for name, index in (("gamma", 1), ("beta", 2)):
        if _shape(call.args[index]) != normalized:
            return f"layer_norm {name} of shape {_shape(call.args[index])}, not {normalized}"
    return None


def _check_concat(call) -> Optional[str]:
    if not isinstance(call.args[0], relax.Tuple):
        return "concat of a tuple variable (only an inline tuple of tensors)"
    if call.attrs.axis is None:
        return "concat without an axis"
    return None


def strided_slice_bounds(call) -> Optional[list[tuple[int, int, int, int]]]:
    """``(axis, start, stop, step)`` per sliced axis in numpy's clamped form, or None when not static."""
    shape = _shape(call.args[0])
    # Arguments: data, axes, begin, end, and strides unless they are all 1.
    if len(call.args) not in (4, 5) or not all(isinstance(arg, relax.Tuple) for arg in call.args[1:]):
        return None
    values = []
    for arg in call.args[1:]:
        numbers = [tvm_compat.scalar_constant(field) for field in arg.fields]
        if any(number is None for number in numbers):
            return None
        values.append([int(number) for number in numbers])
    if len(values) == 3:
        values.append([1] * len(values[0]))
    bounds = []
    for axis, begin, end, step in zip(*values):
        axis %= len(shape)
        start, stop, step = slice(begin, end, step).indices(shape[axis])
        bounds.append((axis, start, stop, step))
    return bounds


def _check_strided_slice(call) -> Optional[str]:
    bounds = strided_slice_bounds(call)
    if bounds is None:
        return "strided_slice with bounds that are not constants"
    if any(step <= 0 for _, _, _, step in bounds):
        return "strided_slice with a step that is not positive"
    expected = list(_shape(call.args[0]))
    for axis, start, stop, step in bounds:
        expected[axis] = len(range(start, stop, step))
    if tuple(expected) != _shape(call):
        return f"strided_slice gives shape {_shape(call)} where numpy slicing gives {tuple(expected)}"
    return None


def _check_take(call) -> Optional[str]:
    data_shape = _shape(call.args[0])
    if call.attrs.axis is None and len(data_shape) != 1:
        return "take without an axis on more than one dimension"
    if _dtype(call.args[1]) not in INDEX:
        return f"take with {_dtype(call.args[1])} indices"
    if _dtype(call.args[0]) != _dtype(call):
        return "take whose result dtype differs from its data's"
    mode = str(call.attrs.mode)
    if mode == "fast":
        # Relax leaves out-of-range indices undefined; ONNX Gather defines every in-range one the same.
        return None
    indices = tvm_compat.constant_array(call.args[1])
    extent = data_shape[0 if call.attrs.axis is None else int(call.attrs.axis)]
    lowest = {"wrap": -extent, "clip": 0}.get(mode)
    if lowest is None or indices is None or indices.size and (indices.min() < lowest or indices.max() >= extent):
        return f"take in mode {mode!r} with indices that may be out of range"
    return None


def _check_astype(call) -> Optional[str]:
    if _dtype(call.args[0]) not in MOVABLE - BOOL:
        return f"astype from {_dtype(call.args[0])}"
    return None


def _check_where(call) -> Optional[str]:
    if _dtype(call.args[0]) not in BOOL:
        return f"where with a {_dtype(call.args[0])} condition"
    if {_dtype(call.args[1]), _dtype(call.args[2])} != {_dtype(call)}:
        return "where choosing between different dtypes"
    return None


def _check_isnan(call) -> Optional[str]:
    if _dtype(call.args[0]) not in FLOAT:
        return f"isnan of {_dtype(call.args[0])} (ONNX IsNaN takes floats)"
    return None


def split_axis_and_sizes(call) -> tuple[int, list[int]]:
    """The axis ``split`` cuts, counted from 0, and its pieces' lengths along it, from the call's result type."""
    axis = int(call.attrs.axis) % len(_shape(call.args[0]))
    return axis, [tvm_compat.type_shape_dtype(piece)[0][axis] for piece in _result_types(call)]


def _check_split(call) -> Optional[str]:
    shape = _shape(call.args[0])
    axis, sizes = split_axis_and_sizes(call)
    if sum(sizes) != shape[axis] or 0 in sizes:
        return f"split into pieces of {sizes} along an axis of length {shape[axis]}"
    return None


def _check_comparison(call) -> Optional[str]:
    dtypes = {_dtype(arg) for arg in call.args}
    if len(dtypes) != 1 or not dtypes <= NUMERIC:
        return f"comparison of {' and '.join(sorted(dtypes))}"
    return None


UNARY_FLOAT = (
    "relax.nn.relu",
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.erf",
    "relax.sqrt",
    "relax.rsqrt",
    "relax.exp",
    "relax.log",
    "relax.negative",
    "relax.abs",
)
BINARY_NUMERIC = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum")
BINARY_FLOAT = ("relax.divide", "relax.power")
COMPARISONS = ("relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal", "relax.equal", "relax.not_equal")
RESHAPES = ("relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims")

Check = Optional[Callable[[relax.Call], Optional[str]]]

# Operator name -> (dtypes its result may have, the check of its attributes and arguments).
RULES: dict[str, tuple[frozenset, Check]] = {
    **{op: (FLOAT, None) for op in UNARY_FLOAT + BINARY_FLOAT},
    **{op: (NUMERIC, None) for op in BINARY_NUMERIC},
    **{op: (BOOL, _check_comparison) for op in COMPARISONS},
    "relax.logical_not": (BOOL, None),
    **{op: (MOVABLE, None) for op in RESHAPES + ("relax.permute_dims", "relax.broadcast_to")},
    "relax.nn.conv2d": (FLOAT, _check_conv2d),
    "relax.matmul": (FLOAT, _check_matmul),
    "relax.clip": (NUMERIC, _check_clip),
    "relax.nn.max_pool2d": (FLOAT, _check_pool2d),
    "relax.nn.avg_pool2d": (FLOAT, _check_pool2d),
    "relax.nn.adaptive_avg_pool2d": (FLOAT, _check_adaptive_avg_pool2d),
    "relax.image.resize2d": (FLOAT, _check_resize2d),
    "relax.nn.pad": (MOVABLE - BOOL, _check_pad),
    "relax.mean": (FLOAT, _check_reduce),
    "relax.sum": (NUMERIC, _check_reduce),
    "relax.max": (NUMERIC, _check_reduce),
    "relax.min": (NUMERIC, _check_reduce),
    "relax.nn.softmax": (FLOAT, None),
    "relax.nn.log_softmax": (FLOAT, None),
    "relax.nn.layer_norm": (FLOAT, _check_layer_norm),
    "relax.concat": (MOVABLE, _check_concat),
    "relax.strided_slice": (MOVABLE, _check_strided_slice),
    "relax.take": (MOVABLE, _check_take),
    "relax.astype": (MOVABLE - BOOL, _check_astype),
    "relax.where": (MOVABLE, _check_where),
    "relax.split": (MOVABLE, _check_split),
    "relax.isnan": (BOOL, _check_isnan),
}

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(RULES))
# Operators whose operands may have another dtype than their result; their checks look at each.
MIXED_DTYPES = frozenset({"relax.take", "relax.astype", "relax.where", "relax.isnan", *COMPARISONS})


def _result_types(call) -> list:
    """The tensor types ``call`` returns: one, or each field of its tuple (split)."""
    ty = tvm_compat.value_type(call)
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def _tensor_operands(call):
    """Every tensor the call reads, looking inside inline tuples (concat's argument)."""
    for arg in call.args:
        fields = arg.fields if isinstance(arg, relax.Tuple) else (arg,)
        for field in fields:
            if isinstance(tvm_compat.value_type(field), relax.TensorType):
                yield field


def refusal(call, sixteen_bit: frozenset = frozenset()) -> Optional[str]:
    """Why ``call`` cannot be converted to ONNX faithfully, or None when it can. ``sixteen_bit``: the 16-bit
    floating types (of SIXTEEN_BIT) the backend takes besides float32 (none: float32 only)."""
    if not tvm_compat.is_op_call(call):
        return "not an operator call"
    name = tvm_compat.op_name(call)
    tir_call = tvm_compat.tir_call(call)
    if tir_call is not None:
        # What a TIR function computes is not known from the call; collage_core.model.rewrites turns the kernels TVM's
        # ONNX importer writes for Pad back into relax.nn.pad before partitioning.
        return f"relax.call_tir of {tir_call[0].name_hint} (a TIR function, not an operator) has no ONNX conversion"
    if name not in RULES:
        return f"{name} has no ONNX conversion"
    dtypes, check = RULES[name]
    if "float32" in dtypes:
        dtypes = dtypes | sixteen_bit
    try:
        result_dtypes = {tvm_compat.type_shape_dtype(ty)[1] for ty in _result_types(call)}  # raises on a dynamic shape
        if result_dtypes - dtypes:
            return f"{name} on {', '.join(sorted(result_dtypes - dtypes))}"
        operand_dtypes = {_dtype(operand) for operand in _tensor_operands(call)}
        accumulating = name in PRODUCTS and result_dtypes == {"float32"} and len(operand_dtypes) == 1
        if name not in MIXED_DTYPES and operand_dtypes - result_dtypes and not (accumulating and operand_dtypes <= sixteen_bit):
            return f"{name} mixes {', '.join(sorted(operand_dtypes | result_dtypes))}"
        if name == "relax.astype" and _dtype(call.args[0]) in sixteen_bit:
            return None
        return check(call) if check is not None else None
    except ValueError as error:  # a dynamic shape
        return f"{name}: {error}"


def supports(call, sixteen_bit: frozenset = frozenset()) -> bool:
    """Whether the converter reproduces ``call`` exactly as Relax defines it."""
    return refusal(call, sixteen_bit) is None
