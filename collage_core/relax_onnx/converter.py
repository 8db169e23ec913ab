"""A Collage partition (a Relax function of one dataflow block) as an ONNX model, opset 17.

Parameters become the graph inputs ``input_<i>``, Relax constants become initializers, and the
returned tensor or tuple of tensors becomes the outputs ``output_<i>``, in order. Each operator
is converted only after :func:`collage_core.relax_onnx.support.refusal` has accepted it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper
from tvm import relax

from collage_core import tvm_compat
from collage_core.relax_onnx import support

OPSET = 17
# The IR version that came with opset 17; newer ONNX packages stamp versions older runtimes refuse.
IR_VERSION = 8


class UnsupportedError(ValueError):
    """The function holds something the converter cannot reproduce exactly."""


def input_name(index: int) -> str:
    return f"input_{index}"


def output_name(index: int) -> str:
    return f"output_{index}"


def onnx_dtype(dtype: str) -> int:
    if dtype == "bfloat16":  # ml_dtypes' bfloat16, which ONNX's own mapping does not know
        return onnx.TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class _Graph:
    """The ONNX graph under construction: nodes, initializers and the names of converted values."""

    def __init__(self, widened: frozenset = frozenset()):
        self.widened = widened  # 16-bit types computed in float32 inside the model (see convert)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.names: dict = {}  # Relax expression -> ONNX value name (a list of names for a tuple)
        self.tuple_fields: dict = {}  # a variable bound to a tuple -> the tuple's fields
        self._count = 0

    def fresh(self, stem: str = "t") -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def node(self, op_type: str, inputs: list[str], output: str | None = None, **attributes) -> str:
        return self.multi_output_node(op_type, inputs, [output or self.fresh(op_type.lower())], **attributes)[0]

    def multi_output_node(self, op_type: str, inputs: list[str], outputs: list[str], **attributes) -> list[str]:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh("node"), **attributes))
        return outputs

    def inner(self, dtype: str) -> str:
        """The type a tensor of ``dtype`` has inside the ONNX model."""
        return "float32" if dtype in self.widened else dtype

    def constant(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        if array.dtype.name in self.widened:
            array = array.astype(np.float32)
        if array.dtype.name == "bfloat16":  # stored as float32 (exact) and cast: ONNX's helpers take no ml_dtypes
            return self.node("Cast", [self.constant(array.astype(np.float32))], to=onnx.TensorProto.BFLOAT16)
        name = self.fresh("const")
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def int64s(self, values) -> str:
        return self.constant(np.asarray(list(values), dtype="int64"))

    def scalar(self, value, dtype: str) -> str:
        return self.constant(np.asarray(value, dtype=self.inner(dtype)))

    def value(self, expr) -> str:
        """The ONNX name of a tensor-valued argument: a converted variable or a constant."""
        if expr in self.names:
            name = self.names[expr]
            if isinstance(name, list):
                raise UnsupportedError(f"a tuple used where a tensor is expected: {expr}")
            return name
        array = tvm_compat.constant_array(expr)
        if array is not None:
            name = self.constant(array)
            self.names[expr] = name
            return name
        raise UnsupportedError(f"argument {type(expr).__name__} {expr} is neither a converted value nor a constant")


def _out_dtype(call) -> str:
    return tvm_compat.tensor_shape_dtype(call)[1]


def _out_shape(call) -> tuple[int, ...]:
    return tvm_compat.tensor_shape_dtype(call)[0]


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _simple(op_type: str) -> Callable:
    def convert(g: _Graph, call) -> str:
        return g.node(op_type, [g.value(arg) for arg in call.args])

    return convert


def _not_equal(g: _Graph, call) -> str:
    return g.node("Not", [g.node("Equal", [g.value(arg) for arg in call.args])])


def _rsqrt(g: _Graph, call) -> str:
    return g.node("Reciprocal", [g.node("Sqrt", [g.value(call.args[0])])])


def _silu(g: _Graph, call) -> str:
    x = g.value(call.args[0])
    return g.node("Mul", [x, g.node("Sigmoid", [x])])


def _gelu(g: _Graph, call) -> str:
    # Opset 17 has no Gelu: 0.5 * x * (1 + erf(x / sqrt(2))), as Relax defines nn.gelu.
    x, dtype = g.value(call.args[0]), _out_dtype(call)
    erf = g.node("Erf", [g.node("Mul", [x, g.scalar(1 / math.sqrt(2), dtype)])])
    half_x = g.node("Mul", [x, g.scalar(0.5, dtype)])
    return g.node("Mul", [half_x, g.node("Add", [erf, g.scalar(1.0, dtype)])])


def _gelu_tanh(g: _Graph, call) -> str:
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), as Relax defines nn.gelu_tanh.
    x, dtype = g.value(call.args[0]), _out_dtype(call)
    cube = g.node("Mul", [x, g.node("Mul", [x, x])])
    inner = g.node("Add", [x, g.node("Mul", [cube, g.scalar(0.044715, dtype)])])
    tanh = g.node("Tanh", [g.node("Mul", [inner, g.scalar(math.sqrt(2 / math.pi), dtype)])])
    half_x = g.node("Mul", [x, g.scalar(0.5, dtype)])
    return g.node("Mul", [half_x, g.node("Add", [tanh, g.scalar(1.0, dtype)])])


def _clip(g: _Graph, call) -> str:
    dtype = _out_dtype(call)
    low, high = (g.scalar(tvm_compat.scalar_constant(bound), dtype) for bound in call.args[1:])
    return g.node("Clip", [g.value(call.args[0]), low, high])


def _product_operands(g: _Graph, call) -> list[str]:
    """A product's operands; 16-bit ones accumulating into float32 are cast to float32 first (exactly: every 16-bit
    value is a float32 value), so ONNX's same-typed MatMul and Conv compute what Relax does."""
    operands = [g.value(arg) for arg in call.args]
    if _out_dtype(call) == "float32" and g.inner(tvm_compat.tensor_shape_dtype(call.args[0])[1]) != "float32":
        operands = [g.node("Cast", [operand], to=onnx.TensorProto.FLOAT) for operand in operands]
    return operands


def _matmul(g: _Graph, call) -> str:
    return g.node("MatMul", _product_operands(g, call))


def _conv2d(g: _Graph, call) -> str:
    attrs = call.attrs
    weight_shape = tvm_compat.tensor_shape_dtype(call.args[1])[0]
    # Relax padding is (top, left, bottom, right): ONNX's [x1_begin, x2_begin, x1_end, x2_end].
    return g.node(
        "Conv",
        _product_operands(g, call),
        kernel_shape=list(weight_shape[2:]),
        strides=_ints(attrs.strides),
        pads=_ints(attrs.padding),
        dilations=_ints(attrs.dilation),
        group=int(attrs.groups),
    )


def _pool2d(g: _Graph, call) -> str:
    """In floor mode over the end padding the windows reach, so every runtime computes Relax's windows (ceil mode's
    among them); an average counts explicit padding (count_include_pad) as the zeros of a Pad, never ceil mode's
    overhang, as Relax does."""
    axes = support.pool_axes(call)
    x, is_max = g.value(call.args[0]), call.op.name == "relax.nn.max_pool2d"
    include = not is_max and bool(call.attrs.count_include_pad)
    if support.is_global_pool(call):
        if is_max:
            return g.node("GlobalMaxPool", [x])
        mean = g.node("GlobalAveragePool", [x])
        area = axes[0].size * axes[1].size
        counted = axes[0].divisor(-axes[0].begin, include) * axes[1].divisor(-axes[1].begin, include)
        return mean if counted == area else g.node("Mul", [mean, g.scalar(area / counted, _out_dtype(call))])
    begins, ends = [axis.begin for axis in axes], [axis.reached_end() for axis in axes]
    zeros = [min(axis.end, end) for axis, end in zip(axes, ends)]  # the explicit end padding the windows reach
    if include and any(begins + zeros):
        x = g.node("Pad", [x, g.int64s([0, 0, *begins, 0, 0, *zeros])], mode="constant")
        begins, ends = [0, 0], [end - zero for end, zero in zip(ends, zeros)]
    attributes = dict(kernel_shape=[axis.kernel for axis in axes], strides=[axis.stride for axis in axes], pads=begins + ends, ceil_mode=0)
    if is_max:
        return g.node("MaxPool", [x], dilations=[axis.dilation for axis in axes], **attributes)
    return g.node("AveragePool", [x], count_include_pad=0, **attributes)


def _resize2d(g: _Graph, call) -> str:
    attrs = call.attrs
    method, mode = str(attrs.method), str(attrs.coordinate_transformation_mode)
    extra = {}
    if method == "nearest_neighbor":
        extra["nearest_mode"] = support.NEAREST_MODES[support.resize_rounding(call)]
    elif method == "cubic":
        extra.update(cubic_coeff_a=float(attrs.cubic_alpha), exclude_outside=int(attrs.cubic_exclude))
    # Sizes, not scales: the runtimes derive the scale from the lengths, as TVM does.
    return g.node(
        "Resize",
        [g.value(call.args[0]), "", "", g.int64s(_out_shape(call))],
        mode=support.RESIZE_METHODS[method],
        coordinate_transformation_mode=mode,
        **extra,
    )


def _pad(g: _Graph, call) -> str:
    before, after = support.pad_widths(call)
    mode = str(call.attrs.pad_mode)
    inputs = [g.value(call.args[0]), g.int64s(before + after)]
    if mode == "constant":
        inputs.append(g.scalar(float(call.attrs.pad_value), _out_dtype(call)))
    return g.node("Pad", inputs, mode=support.PAD_MODES[mode])


def _reduce(op_type: str) -> Callable:
    def convert(g: _Graph, call) -> str:
        axis, keepdims = call.attrs.axis, int(bool(call.attrs.keepdims))
        inputs = [g.value(call.args[0])]
        if axis is None:
            return g.node(op_type, inputs, keepdims=keepdims)
        if op_type == "ReduceSum":  # ReduceSum takes its axes as an input from opset 13
            return g.node(op_type, inputs + [g.int64s(_ints(axis))], keepdims=keepdims)
        return g.node(op_type, inputs, axes=_ints(axis), keepdims=keepdims)

    return convert


def _softmax(op_type: str) -> Callable:
    def convert(g: _Graph, call) -> str:
        return g.node(op_type, [g.value(call.args[0])], axis=int(call.attrs.axis))

    return convert


def _layer_norm(g: _Graph, call) -> str:
    rank = len(tvm_compat.tensor_shape_dtype(call.args[0])[0])
    first_axis = min(axis % rank for axis in _ints(call.attrs.axes))
    inputs = [g.value(arg) for arg in call.args]
    return g.node("LayerNormalization", inputs, axis=first_axis, epsilon=float(call.attrs.epsilon))


def _reshape(g: _Graph, call) -> str:
    # reshape, flatten, squeeze and expand_dims all end at the call's static output shape.
    return g.node("Reshape", [g.value(call.args[0]), g.int64s(_out_shape(call))], allowzero=1)


def _permute_dims(g: _Graph, call) -> str:
    axes = call.attrs.axes
    rank = len(tvm_compat.tensor_shape_dtype(call.args[0])[0])
    perm = _ints(axes) if axes is not None else list(reversed(range(rank)))
    return g.node("Transpose", [g.value(call.args[0])], perm=[axis % rank for axis in perm])


def _concat(g: _Graph, call) -> str:
    return g.node("Concat", [g.value(field) for field in call.args[0].fields], axis=int(call.attrs.axis))


def _strided_slice(g: _Graph, call) -> str:
    bounds = support.strided_slice_bounds(call)
    axes, starts, stops, steps = zip(*bounds) if bounds else ((), (), (), ())
    inputs = [g.value(call.args[0]), g.int64s(starts), g.int64s(stops), g.int64s(axes), g.int64s(steps)]
    return g.node("Slice", inputs)


def _take(g: _Graph, call) -> str:
    axis = call.attrs.axis
    return g.node("Gather", [g.value(call.args[0]), g.value(call.args[1])], axis=0 if axis is None else int(axis))


def _astype(g: _Graph, call) -> str:
    source, target = g.inner(tvm_compat.tensor_shape_dtype(call.args[0])[1]), g.inner(_out_dtype(call))
    if source == target:  # a cast between a widened type and float32
        return g.node("Identity", [g.value(call.args[0])])
    return g.node("Cast", [g.value(call.args[0])], to=onnx_dtype(target))


def _broadcast_to(g: _Graph, call) -> str:
    return g.node("Expand", [g.value(call.args[0]), g.int64s(_out_shape(call))])


def _adaptive_avg_pool2d(g: _Graph, call) -> str:
    return g.node("GlobalAveragePool", [g.value(call.args[0])])


def _split(g: _Graph, call) -> list[str]:
    # The pieces' sizes come from the call's static result type, however its attributes spell them.
    axis, sizes = support.split_axis_and_sizes(call)
    outputs = [g.fresh("split") for _ in sizes]
    return g.multi_output_node("Split", [g.value(call.args[0]), g.int64s(sizes)], outputs, axis=axis)


CONVERTERS: dict[str, Callable] = {
    "relax.add": _simple("Add"),
    "relax.subtract": _simple("Sub"),
    "relax.multiply": _simple("Mul"),
    "relax.divide": _simple("Div"),
    "relax.power": _simple("Pow"),
    "relax.maximum": _simple("Max"),
    "relax.minimum": _simple("Min"),
    "relax.less": _simple("Less"),
    "relax.less_equal": _simple("LessOrEqual"),
    "relax.greater": _simple("Greater"),
    "relax.greater_equal": _simple("GreaterOrEqual"),
    "relax.equal": _simple("Equal"),
    "relax.not_equal": _not_equal,
    "relax.where": _simple("Where"),
    "relax.matmul": _matmul,
    "relax.nn.relu": _simple("Relu"),
    "relax.sigmoid": _simple("Sigmoid"),
    "relax.tanh": _simple("Tanh"),
    "relax.erf": _simple("Erf"),
    "relax.sqrt": _simple("Sqrt"),
    "relax.exp": _simple("Exp"),
    "relax.log": _simple("Log"),
    "relax.negative": _simple("Neg"),
    "relax.abs": _simple("Abs"),
    "relax.rsqrt": _rsqrt,
    "relax.nn.silu": _silu,
    "relax.nn.gelu": _gelu,
    "relax.nn.gelu_tanh": _gelu_tanh,
    "relax.clip": _clip,
    "relax.nn.conv2d": _conv2d,
    "relax.nn.max_pool2d": _pool2d,
    "relax.nn.avg_pool2d": _pool2d,
    "relax.nn.adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "relax.image.resize2d": _resize2d,
    "relax.nn.pad": _pad,
    "relax.mean": _reduce("ReduceMean"),
    "relax.sum": _reduce("ReduceSum"),
    "relax.max": _reduce("ReduceMax"),
    "relax.min": _reduce("ReduceMin"),
    "relax.nn.softmax": _softmax("Softmax"),
    "relax.nn.log_softmax": _softmax("LogSoftmax"),
    "relax.nn.layer_norm": _layer_norm,
    "relax.reshape": _reshape,
    "relax.flatten": _reshape,
    "relax.squeeze": _reshape,
    "relax.expand_dims": _reshape,
    "relax.permute_dims": _permute_dims,
    "relax.concat": _concat,
    "relax.strided_slice": _strided_slice,
    "relax.take": _take,
    "relax.astype": _astype,
    "relax.broadcast_to": _broadcast_to,
    "relax.split": _split,
    "relax.isnan": _simple("IsNaN"),
    "relax.logical_not": _simple("Not"),
}


def _value_info(name: str, expr) -> onnx.ValueInfoProto:
    """A graph input or output: a tensor of static shape, as ``expr`` (a parameter or result) has."""
    return _value_info_of_type(name, tvm_compat.value_type(expr))


def _value_info_of_type(name: str, ty) -> onnx.ValueInfoProto:
    try:
        shape, dtype = tvm_compat.type_shape_dtype(ty)
    except ValueError as error:
        raise UnsupportedError(f"{name}: {error}") from None
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), shape)


def _convert_binding(g: _Graph, binding, sixteen_bit: frozenset = frozenset()) -> None:
    value = binding.value
    if isinstance(value, relax.Var):
        g.names[binding.var] = g.names[value] if value in g.names else g.value(value)
    elif isinstance(value, relax.Tuple):
        g.names[binding.var] = [g.value(field) for field in value.fields]
        g.tuple_fields[binding.var] = list(value.fields)
    elif isinstance(value, relax.TupleGetItem):
        g.names[binding.var] = g.names[value.tuple_value][value.index]
    elif tvm_compat.is_op_call(value):
        refused = support.refusal(value, sixteen_bit)
        if refused:
            raise UnsupportedError(refused)
        g.names[binding.var] = CONVERTERS[tvm_compat.op_name(value)](g, value)
    else:
        raise UnsupportedError(f"binding of {type(value).__name__}: {value}")


def convert(
    func: relax.Function, name: str = "collage_partition", sixteen_bit: frozenset = frozenset(), widened: frozenset = frozenset()
) -> onnx.ModelProto:
    """``func`` as an ONNX model; raises :class:`UnsupportedError` for anything it cannot reproduce.
    ``sixteen_bit``: the 16-bit floating types the backend running the model takes (see ``support.refusal``).
    ``widened`` (of those): types that are float32 inside the model, cast only where the model's inputs and
    outputs have them; the casts between them and float32 become identities. For a backend that lowers float32
    arithmetic to its own 16-bit policy (OpenVINO's bf16 inference precision), which then decides what runs
    in 16 bits instead of TVM's mixed-precision pass."""
    g = _Graph(widened)
    inputs = []
    for index, param in enumerate(func.params):
        inputs.append(_value_info(input_name(index), param))
        g.names[param] = input_name(index)
        if tvm_compat.tensor_shape_dtype(param)[1] in widened:
            g.names[param] = g.node("Cast", [input_name(index)], to=onnx.TensorProto.FLOAT)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        raise UnsupportedError("function body is not a sequence of binding blocks")
    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise UnsupportedError(f"{type(binding).__name__} (only plain variable bindings)")
            _convert_binding(g, binding, sixteen_bit)

    result = body.body
    if isinstance(result, relax.Tuple):
        returned = list(result.fields)
    else:
        returned = g.tuple_fields.get(result, [result])
    sources = []  # (ONNX name, its Relax tensor type)
    for expr in returned:
        source = g.names.get(expr) if isinstance(expr, relax.Var) else None
        source = source if source is not None else g.value(expr)
        ty = tvm_compat.value_type(expr)
        if isinstance(source, list) and expr not in g.tuple_fields and len(returned) == 1:
            sources.extend(zip(source, ty.fields))  # the result of a tuple-valued operator (split)
        elif isinstance(source, list):
            raise UnsupportedError("a nested tuple among the outputs")
        else:
            sources.append((source, ty))
    outputs = []
    for index, (source, ty) in enumerate(sources):
        dtype = tvm_compat.type_shape_dtype(ty)[1]
        if dtype in widened:
            g.node("Cast", [source], output=output_name(index), to=onnx_dtype(dtype))
            outputs.append(_value_info_of_type(output_name(index), ty))
            continue
        g.node("Identity", [source], output=output_name(index))
        outputs.append(_value_info_of_type(output_name(index), ty))

    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="collage")
    model.ir_version = IR_VERSION
    return model
