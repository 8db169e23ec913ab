"""Reading an operator group as one anchor (a convolution, a matrix product) and the epilogue a kernel fuses.

Native backends recognise the same things after an anchor: a scale, a per-channel bias, a
residual add, an activation (ReLU, erf or tanh GELU spelt out the way exporters write them,
SiLU), reshapes that leave memory as it is. A plugin's recognizer calls :func:`read_epilogue`
and refuses what its kernel does not compute exactly; one recognizer serves both its pattern
checks (on the matched calls of ``main``) and its lowering (on a partition function's bindings).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import attrs
import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from collage_core import tvm_compat
from collage_core.model.dtypes import DTYPES
from collage_core.records import PatternRefused

FLOAT32 = "float32"
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
ACTIVATIONS = ("relu", "gelu_erf", "gelu_tanh", "silu")


class Refused(PatternRefused):
    """The group is outside what a kernel computes exactly; the message says what."""


class Group:
    """Calls in order (anchor's operands first, root last), the variables they are bound to, and the outputs;
    ``items``: the group's variables bound to an item of a call's tuple (``split``'s parts), each to that item."""

    def __init__(self, calls: Sequence, bound_vars: Sequence, outputs: Sequence, items: Optional[dict] = None):
        self.calls = list(calls)
        self.bound_vars = list(bound_vars)
        self.outputs = list(outputs)
        self.items = dict(items or {})
        self._producer = {var: call for var, call in zip(bound_vars, calls)}

    @classmethod
    def from_match(cls, match) -> "Group":
        return cls(match.calls, match.bound_vars, match.outputs, match.items)

    @classmethod
    def from_function(cls, func: relax.Function) -> "Group":
        """A partition function's bindings: its one output is what it returns."""
        bindings = [b for block in func.body.blocks for b in block.bindings]
        calls = [b.value for b in bindings if tvm_compat.is_op_call(b.value)]
        bound = [b.var for b in bindings if tvm_compat.is_op_call(b.value)]
        aliases = {b.var: b.value for b in bindings if isinstance(b.value, relax.Var)}
        items = {b.var: b.value for b in bindings if isinstance(b.value, relax.TupleGetItem)}
        if len(calls) + len(aliases) + len(items) != len(bindings):
            raise Refused("the partition binds values other than operator calls and their items")
        body = func.body.body
        outputs = list(body.fields) if isinstance(body, relax.Tuple) else [body]
        while len(outputs) == 1 and outputs[0] in aliases:
            outputs = [aliases[outputs[0]]]
        if any(alias in aliases for call in calls for alias in call.args):
            raise Refused("the partition reads a renamed intermediate result")
        return cls(calls, bound, outputs, items)

    def producer(self, expr):
        """The group's call whose result ``expr`` is (or whose tuple ``expr`` is an item of), else None."""
        if not isinstance(expr, relax.Var):
            return None
        item = self.items.get(expr)
        return self._producer.get(item.tuple_value) if item is not None else self._producer.get(expr)

    def var_of(self, call):
        return self.bound_vars[self.calls.index(call)]

    def single_anchor(self, anchor_ops: Sequence[str], dtypes: Sequence[str] = (FLOAT32,)):
        """The group's one anchor call; the group must have one output and calls of ``dtypes`` throughout."""
        if len(self.outputs) != 1:
            raise Refused("an intermediate result of the group is used outside it")
        anchors = [call for call in self.calls if tvm_compat.op_name(call) in anchor_ops]
        if len(anchors) != 1:
            raise Refused("the group does not have exactly one anchor operator")
        for call in self.calls:
            expect_dtype(call, dtypes)
        return anchors[0]


def shape_of(expr) -> tuple[int, ...]:
    return tvm_compat.tensor_shape_dtype(expr)[0]


def expect_float32(expr) -> None:
    expect_dtype(expr, (FLOAT32,))


def expect_dtype(expr, dtypes: Sequence[str]) -> str:
    """``expr``'s dtype, which must be one of ``dtypes``."""
    try:
        dtype = tvm_compat.tensor_shape_dtype(expr)[1]
    except ValueError as error:
        raise Refused(str(error)) from None
    if dtype not in dtypes:
        raise Refused(f"dtype {dtype} (only {' or '.join(dtypes)})")
    return dtype


def uniform_operand_dtype(anchor, operands, allowed: Sequence[str]) -> str:
    """The one dtype of ``anchor``'s matrix ``operands``, of ``allowed``: float32, or a 16-bit type that
    accumulates into a float32 result (``out_dtype="float32"``), as TVM's mixed-precision pass writes them."""
    dtypes = {expect_dtype(operand, allowed) for operand in operands}
    if len(dtypes) != 1:
        raise Refused(f"operands of mixed dtypes {sorted(dtypes)}")
    dtype = dtypes.pop()
    if dtype != FLOAT32 and str(anchor.attrs.out_dtype) != FLOAT32:
        raise Refused(f"{dtype} operands with a {dtype} result (only with out_dtype float32)")
    return dtype


def external(group: Group, expr, dtypes: Sequence[str] = (FLOAT32,)) -> None:
    """Operands a kernel reads must come from outside the group (or be constants), of one of ``dtypes``."""
    if group.producer(expr) is not None:
        raise Refused("an operand is computed inside the group by an operator the kernel does not fuse")
    expect_dtype(expr, dtypes)


def expect_plain_out_dtype(call) -> None:
    out_dtype = call.attrs.out_dtype
    if out_dtype is not None and str(out_dtype) not in ("", "void", FLOAT32):
        raise Refused(f"out_dtype {out_dtype}")


def ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def padding4(values) -> tuple[int, int, int, int]:
    """A 2-d operator's padding as (top, left, bottom, right) from Relax's 1, 2 or 4 numbers."""
    values = ints(values)
    if len(values) == 1:
        return values * 4
    if len(values) == 2:
        return values * 2
    return values


def scalar(expr) -> Optional[float]:
    value = tvm_compat.constant_array(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def other_operand(call, value):
    """The argument of a binary call that is not ``value`` (None when neither or both are)."""
    first, second = call.args
    if first.same_as(value) and not second.same_as(value):
        return second
    if second.same_as(value) and not first.same_as(value):
        return first
    return None


def plain_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides


def _close(value: Optional[float], wanted: float, tolerance: float = 1e-6) -> bool:
    return value is not None and abs(value - wanted) <= tolerance * max(1.0, abs(wanted))


def _spelt_out(group: Group, calls: list, value, steps) -> bool:
    """Whether ``calls`` (in any order the exporter wrote them) are ``steps`` applied to ``value``.

    Each step is ``(op, operands)``: operands are ``"x"`` (``value``), an int (the result of that
    earlier step) or a float (a scalar constant of that value, to float32 precision). Additions
    and multiplications may take their operands either way round.
    """
    if sorted(tvm_compat.op_name(call) for call in calls) != sorted(op for op, _ in steps):
        return False
    found: list = []
    for op, operands in steps:
        wanted = [value if o == "x" else group.var_of(found[o]) if isinstance(o, int) else o for o in operands]
        match = next((call for call in calls if call not in found and tvm_compat.op_name(call) == op and _operands_are(call, wanted)), None)
        if match is None:
            return False
        found.append(match)
    return found[-1] is calls[-1]  # the last step is the result the chain goes on from


# How close a spelt-out activation's constant must be to the value it stands for: a 16-bit constant is
# that value rounded to its type (half a unit in the last place, relative).
CONSTANT_TOLERANCE = {"bfloat16": 2.0**-9, "float16": 2.0**-12}


def _operands_are(call, wanted) -> bool:
    def same(arg, expected):
        if isinstance(expected, float):
            dtype = tvm_compat.tensor_shape_dtype(arg)[1] if tvm_compat.is_constant(arg) else FLOAT32
            return _close(scalar(arg), expected, CONSTANT_TOLERANCE.get(dtype, 1e-6))
        return arg.same_as(expected)

    args = list(call.args)
    if len(args) != len(wanted):
        return False
    if all(same(a, w) for a, w in zip(args, wanted)):
        return True
    commutative = tvm_compat.op_name(call) in ("relax.add", "relax.multiply")
    return commutative and same(args[0], wanted[1]) and same(args[1], wanted[0])


# x * (erf(x / sqrt2) + 1) * 0.5, as ONNX exporters write erf GELU
_GELU_ERF_STEPS = (
    ("relax.divide", ("x", SQRT2)), ("relax.erf", (0,)), ("relax.add", (1, 1.0)), ("relax.multiply", ("x", 2)),
    ("relax.multiply", (3, 0.5)),
)
# (x * 0.5) * (tanh((x + x**3 * 0.044715) * sqrt(2/pi)) + 1), as GPT-2's exporters write tanh GELU
_GELU_TANH_STEPS = (
    ("relax.power", ("x", 3.0)), ("relax.multiply", (0, 0.044715)), ("relax.add", ("x", 1)),
    ("relax.multiply", (2, SQRT_2_OVER_PI)), ("relax.tanh", (3,)), ("relax.add", (4, 1.0)), ("relax.multiply", ("x", 0.5)),
    ("relax.multiply", (6, 5)),
)
# the same at 16 bits as TVM's mixed-precision pass leaves it: the cube computed in float32 and cast back
_GELU_TANH_CAST_CUBE_STEPS = (
    ("relax.astype", ("x",)), ("relax.power", (0, 3.0)), ("relax.astype", (1,)), ("relax.multiply", (2, 0.044715)),
    ("relax.add", ("x", 3)), ("relax.multiply", (4, SQRT_2_OVER_PI)), ("relax.tanh", (5,)), ("relax.add", (6, 1.0)),
    ("relax.multiply", ("x", 0.5)), ("relax.multiply", (8, 7)),
)
_SILU_STEPS = (("relax.sigmoid", ("x",)), ("relax.multiply", ("x", 0)))  # x * sigmoid(x)


def _casts_round_trip_through_float32(calls: list, value) -> bool:
    """Whether the casts among ``calls`` take ``value`` to float32 and come back to ``value``'s dtype."""
    casts = [call for call in calls if tvm_compat.op_name(call) == "relax.astype"]
    there = [call for call in casts if call.args[0].same_as(value)]
    back = [call for call in casts if not call.args[0].same_as(value)]
    value_dtype = tvm_compat.tensor_shape_dtype(value)[1]
    return (
        len(there) == 1 and str(there[0].attrs.dtype) == FLOAT32 and all(str(call.attrs.dtype) == value_dtype for call in back)
    )


def _spelt_out_activation(*spellings):
    def taken(group: Group, rest: list, value) -> int:
        for steps in spellings:
            count = len(steps)
            if len(rest) >= count and _spelt_out(group, rest[:count], value, steps):
                casts_checked = all(op != "relax.astype" for op, _ in steps) or _casts_round_trip_through_float32(rest[:count], value)
                return count if casts_checked else 0
        return 0

    return taken


_gelu_erf = _spelt_out_activation(_GELU_ERF_STEPS)
_gelu_tanh = _spelt_out_activation(_GELU_TANH_STEPS, _GELU_TANH_CAST_CUBE_STEPS)
_silu = _spelt_out_activation(_SILU_STEPS)


ACTIVATION_OPS = {"relax.nn.relu": "relu", "relax.nn.gelu": "gelu_erf", "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.silu": "silu"}
SPELT_OUT = {"gelu_erf": _gelu_erf, "gelu_tanh": _gelu_tanh, "silu": _silu}


def _activation(group: Group, rest: list, value, allowed: Sequence[str]) -> tuple[Optional[str], int]:
    """The activation the first calls of ``rest`` apply to ``value``, and how many calls it takes."""
    call = rest[0]
    single = ACTIVATION_OPS.get(tvm_compat.op_name(call))
    if single in allowed and call.args[0].same_as(value):
        return single, 1
    for name, spelt_out in SPELT_OUT.items():
        if name in allowed:
            taken = spelt_out(group, rest, value)
            if taken:
                return name, taken
    return None, 0


@attrs.define
class Epilogue:
    """Operations after the anchor a kernel fuses, in the order kernels apply them: scale, bias, residual, activation.

    ``out_dtype`` is what the kernel writes: float32, or the 16-bit type of a cast read straight after the
    anchor (the residual is then of that type too; the kernel computes the rest in float32 and rounds once),
    or float32 again where that 16-bit value is widened before a float32 residual (``"widen"``).
    """

    scale: float = 1.0
    bias: Optional[np.ndarray] = None
    out_dtype: str = FLOAT32
    residual: object = None
    activation: Optional[str] = None
    output_shape: tuple = ()


def as_dtype(values, dtype: str) -> np.ndarray:
    """``values`` as a numpy array of ``dtype`` (``bfloat16`` is ml_dtypes', which TVM's constants and tensors take)."""
    if dtype == "bfloat16":
        # Deferred: ml_dtypes is optional: only for bfloat16 constants.
        import ml_dtypes

        return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return np.asarray(values).astype(dtype)


def _as_bias(value: np.ndarray, channels: int, axis_from_end: int) -> Optional[np.ndarray]:
    """``value`` as a per-channel bias, when it adds one number per channel along that axis."""
    shape = value.shape
    if value.size != channels or len(shape) < axis_from_end or shape[-axis_from_end] != channels:
        return None
    return value.reshape(channels).astype(np.float32)


SIXTEEN_BIT = tuple(DTYPES.values())  # what `--precision bf16|fp16` converts to


def _sixteen_bit_cast(call) -> str:
    """The 16-bit dtype a cast of a float32 anchor result gives."""
    dtype = str(call.attrs.dtype)
    if dtype not in SIXTEEN_BIT or tvm_compat.tensor_shape_dtype(call.args[0])[1] != FLOAT32:
        raise Refused(f"a cast to {dtype} after the anchor (only float32 to {' or '.join(SIXTEEN_BIT)})")
    return dtype


def read_epilogue(
    group: Group, anchor, channels: int, channel_axis_from_end: int, allowed: Sequence[str], reshapes: bool = False
) -> Epilogue:
    """The calls after ``anchor``, read as scale, bias, residual add and activation (each optional, in that order).

    ``allowed`` names what the kernel fuses: ``"scale"``, ``"bias"``, ``"residual"`` and
    activations from :data:`ACTIVATIONS`, and ``"cast"``: a float32 anchor result cast to 16 bits
    straight away, as TVM's mixed-precision pass writes each product and convolution, after which the
    epilogue runs on 16-bit values. The kernel computes that epilogue in float32 and rounds once where
    the Relax program rounds after each step: closer to float32, within the 16-bit precision's
    tolerance. ``"widen"``: such a 16-bit value cast back to float32 before the residual (which is then
    float32): the kernel writes float32 and skips the program's rounding to 16 bits in between. With
    ``reshapes``, reshapes between them are taken (memory stays as it is); a bias after a reshape must
    still run along the last axis.
    """
    rest = group.calls[group.calls.index(anchor) + 1 :]
    value, epilogue, stage = group.var_of(anchor), Epilogue(), 0
    axis_from_end = channel_axis_from_end
    while rest:
        call, name = rest[0], tvm_compat.op_name(rest[0])
        activation, taken = _activation(group, rest, value, allowed) if stage < 4 else (None, 0)
        other = other_operand(call, value) if name in ("relax.add", "relax.multiply") else None
        if activation is not None:
            epilogue.activation, stage = activation, 4
        elif name == "relax.astype" and "cast" in allowed and call.args[0].same_as(value) and value.same_as(group.var_of(anchor)):
            epilogue.out_dtype, taken = _sixteen_bit_cast(call), 1
        elif (
            name == "relax.astype" and "widen" in allowed and call.args[0].same_as(value) and stage < 3
            and epilogue.out_dtype in SIXTEEN_BIT and str(call.attrs.dtype) == FLOAT32
            and all(tvm_compat.tensor_shape_dtype(arg)[1] == epilogue.out_dtype for arg in anchor.args)
        ):  # only a result of 16-bit operands: the rounding of float32 operands' result to 16 bits was asked for
            epilogue.out_dtype, taken = FLOAT32, 1
        elif name == "relax.reshape" and reshapes and call.args[0].same_as(value):
            taken = 1
            if shape_of(call)[-1] != channels:
                axis_from_end = 0  # the channel axis is gone: no bias may follow
        elif name == "relax.multiply" and other is not None and "scale" in allowed and stage < 1 and scalar(other) is not None:
            epilogue.scale, stage, taken = scalar(other), 1, 1
        elif name == "relax.add" and other is not None and tvm_compat.constant_array(other) is not None:
            constant = tvm_compat.constant_array(other)
            bias = _as_bias(constant, channels, axis_from_end) if axis_from_end else None
            if "bias" not in allowed or stage >= 2 or bias is None or epilogue.scale != 1.0:
                raise Refused(f"an added constant of shape {constant.shape} that the kernel cannot fuse as a bias")
            epilogue.bias, stage, taken = bias, 2, 1
        elif name == "relax.add" and other is not None and "residual" in allowed and stage < 3:
            external(group, other, (epilogue.out_dtype,))
            if shape_of(other) != shape_of(call):
                raise Refused("a residual add that broadcasts")
            epilogue.residual, stage, taken = other, 3, 1
        else:
            raise Refused(f"{name} after the anchor is not a post-operation the kernel fuses there")
        value = group.var_of(rest[taken - 1])
        rest = rest[taken:]
    epilogue.output_shape = shape_of(value)
    return epilogue


@attrs.frozen
class StridedOperand:
    """A tensor a kernel reads, and the dims and strides (in elements) it sees it through, transposes absorbed;
    ``offset``: the elements before the first one read (a part of a ``split``)."""

    source: object = attrs.field(eq=False)
    dims: tuple
    strides: tuple
    offset: int = 0


def strided_operand(group: Group, expr, dtypes: Sequence[str] = (FLOAT32,)) -> StridedOperand:
    """``expr`` read in place: through the group's ``permute_dims`` of an outside tensor, or as it is."""
    producer = group.producer(expr)
    if producer is not None and tvm_compat.op_name(producer) == "relax.permute_dims":
        source = producer.args[0]
        external(group, source, dtypes)
        source_shape = shape_of(source)
        axes = _permuted_axes(producer, len(source_shape))
        plain = plain_strides(source_shape)
        return StridedOperand(source, tuple(source_shape[a] for a in axes), tuple(plain[a] for a in axes))
    external(group, expr, dtypes)
    dims = shape_of(expr)
    return StridedOperand(expr, tuple(dims), tuple(plain_strides(dims)))


VIEW_OPS = ("relax.permute_dims", "relax.reshape", "relax.split")


def viewed_operand(group: Group, expr, dtypes: Sequence[str] = (FLOAT32,)) -> tuple[StridedOperand, list]:
    """``expr`` read in place through the group's views of a tensor from outside it: ``permute_dims``, a ``reshape``
    that strides can express, and a part of a ``split``, in any order. Returns the operand (its offset and strides in
    the outside tensor's elements) and the view calls it looked through; refuses a view strides cannot express."""
    chain, value = [], expr
    while (call := group.producer(value)) is not None:
        if tvm_compat.op_name(call) not in VIEW_OPS:
            raise Refused(f"an operand is computed inside the group by {tvm_compat.op_name(call)}, which is not a view")
        chain.append((call, group.items.get(value)))
        value = call.args[0]
    external(group, value, dtypes)
    dims = list(shape_of(value))
    strides, offset = list(plain_strides(dims)), 0
    for call, item in reversed(chain):
        name = tvm_compat.op_name(call)
        if name == "relax.permute_dims":
            axes = _permuted_axes(call, len(dims))
            dims, strides = [dims[a] for a in axes], [strides[a] for a in axes]
        elif name == "relax.reshape":
            dims, strides = list(shape_of(call)), _reshaped_strides(dims, strides, shape_of(call))
        else:
            if item is None:
                raise Refused("a split whose parts are not read one by one")
            axis = int(call.attrs.axis) % len(dims)
            offset += _split_start(call, int(item.index), dims[axis]) * strides[axis]
            dims = list(shape_of(item))
    return StridedOperand(value, tuple(dims), tuple(strides), offset), [call for call, _ in chain]


def written_view(group: Group, expr) -> tuple[object, tuple[int, ...], list]:
    """What the group's output ``expr`` is a view of, through the group's ``reshape`` and ``permute_dims`` calls, and
    the strides (in elements) a kernel writes that value with so that ``expr`` comes out packed; with the view calls
    looked through. Refuses a view that strides cannot express."""
    chain, value = [], expr
    while (call := group.producer(value)) is not None and tvm_compat.op_name(call) in ("relax.reshape", "relax.permute_dims"):
        chain.append(call)
        value = call.args[0]
    strides = plain_strides(shape_of(expr))
    for call in chain:  # from the output back to the value
        source_shape = shape_of(call.args[0])
        if tvm_compat.op_name(call) == "relax.reshape":
            strides = _reshaped_strides(shape_of(call), strides, source_shape)
        else:
            axes = _permuted_axes(call, len(source_shape))
            inverse = [0] * len(axes)
            for position, axis in enumerate(axes):
                inverse[axis] = strides[position]
            strides = inverse
    return value, tuple(strides), chain


def _permuted_axes(permute, rank: int) -> tuple[int, ...]:
    """The axes a ``permute_dims`` call takes, in order: its own, or all of ``rank`` reversed where it names none."""
    return ints(permute.attrs.axes) if permute.attrs.axes is not None else tuple(reversed(range(rank)))


def _split_start(split, index: int, size: int) -> int:
    """Where part ``index`` of ``split`` begins along its axis of ``size`` elements."""
    sections = split.attrs.indices_or_sections
    if not hasattr(sections, "__len__"):  # a number of equal sections
        return index * (size // int(sections))
    return [0, *ints(sections)][index]


def _reshaped_strides(dims: Sequence[int], strides: Sequence[int], shape: Sequence[int]) -> list[int]:
    """The strides of a view of ``dims`` (read through ``strides``) as ``shape``, row-major as ``reshape`` means;
    :class:`Refused` where the elements of ``shape`` cannot be reached by strides (numpy's no-copy reshape)."""
    old = [(d, s) for d, s in zip(dims, strides) if d != 1]
    new_strides = [0] * len(shape)
    at_old, at_new = 0, 0
    while at_new < len(shape):
        if shape[at_new] == 1:
            new_strides[at_new] = 0
            at_new += 1
            continue
        if at_old >= len(old):
            raise Refused("a reshape that changes the number of elements")
        # the smallest runs of old and new dims of one size
        old_end, new_end = at_old + 1, at_new + 1
        old_size, new_size = old[at_old][0], shape[at_new]
        while old_size != new_size:
            if old_size < new_size:
                if old_end >= len(old):
                    raise Refused("a reshape that changes the number of elements")
                old_size *= old[old_end][0]
                old_end += 1
            else:
                if new_end >= len(shape):
                    raise Refused("a reshape that changes the number of elements")
                new_size *= shape[new_end]
                new_end += 1
        for index in range(at_old, old_end - 1):
            if old[index][1] != old[index + 1][1] * old[index + 1][0]:
                raise Refused("a reshape that merges dimensions strides cannot join (it would copy)")
        stride = old[old_end - 1][1]
        for index in reversed(range(at_new, new_end)):
            new_strides[index] = stride if shape[index] != 1 else 0
            stride *= shape[index]
        at_old, at_new = old_end, new_end
    if at_old != len(old):
        raise Refused("a reshape that changes the number of elements")
    return _packed_ones(shape, new_strides)


def _packed_ones(dims: Sequence[int], strides: Sequence[int]) -> list[int]:
    """``strides`` with each size-1 dimension's stride set as a packed tensor's would be (the next inner dimension's
    stride times its size), never 0: kernel libraries read a zero stride as a broadcast (cuDNN's attention does)."""
    strides = list(strides)
    for axis in reversed(range(len(dims))):
        if dims[axis] == 1:
            strides[axis] = strides[axis + 1] * dims[axis + 1] if axis + 1 < len(dims) else 1
    return strides


# Dataflow patterns for the same epilogues, so that every backend matches them alike. Each takes
# the pattern of the value the epilogue applies to and returns the pattern of its result.


def either(op: str, value, other):
    """``op(value, other)`` or ``op(other, value)``: exporters write commutative operands either way."""
    return is_op(op)(value, other) | is_op(op)(other, value)


def cast_pattern(value):
    """A cast of ``value`` (TVM's mixed-precision pass casts each float32-accumulated result to 16 bits, and a
    16-bit value back to float32 where it joins a float32 computation)."""
    return is_op("relax.astype")(value)


def bias_pattern(value):
    return either("relax.add", value, is_const())


def residual_pattern(value):
    return either("relax.add", value, wildcard())


def scale_pattern(value):
    return either("relax.multiply", value, is_const())


def reshape_pattern(value):
    return is_op("relax.reshape")(value, wildcard())


def _gelu_erf_pattern(value):
    """TVM's gelu, or erf GELU as ONNX exporters spell it: x * (erf(x / sqrt2) + 1) * 0.5."""
    erf = is_op("relax.erf")(is_op("relax.divide")(value, is_const()))
    product = either("relax.multiply", value, either("relax.add", erf, is_const()))
    return is_op("relax.nn.gelu")(value) | either("relax.multiply", product, is_const())


def _gelu_tanh_pattern(value):
    """TVM's gelu_tanh, or tanh GELU as GPT-2's exporters spell it: (x * 0.5) * (tanh((x + x**3 * c) * sqrt(2/pi)) + 1);
    at 16 bits TVM's mixed-precision pass computes the cube in float32 between two casts."""
    power = is_op("relax.power")(value, is_const()) | cast_pattern(is_op("relax.power")(cast_pattern(value), is_const()))
    cube = either("relax.multiply", power, is_const())
    tanh = is_op("relax.tanh")(either("relax.multiply", either("relax.add", value, cube), is_const()))
    spelt_out = either("relax.multiply", either("relax.multiply", value, is_const()), either("relax.add", tanh, is_const()))
    return is_op("relax.nn.gelu_tanh")(value) | spelt_out


def _silu_pattern(value):
    """TVM's silu, or x * sigmoid(x)."""
    return is_op("relax.nn.silu")(value) | either("relax.multiply", value, is_op("relax.sigmoid")(value))


ACTIVATION_PATTERNS = {
    "relu": lambda value: is_op("relax.nn.relu")(value),
    "gelu_erf": _gelu_erf_pattern,
    "gelu_tanh": _gelu_tanh_pattern,
    "silu": _silu_pattern,
}


def activation_pattern(value, names: Sequence[str]):
    """Any of the activations ``names`` applied to ``value``."""
    alternatives = [ACTIVATION_PATTERNS[name](value) for name in names]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def product_epilogues(activations: Sequence[str], widened_residual: bool = False, reshaped_residual: bool = False) -> dict:
    """The epilogue patterns a product kernel fuses, by name suffix: bias, then residual, then one of
    ``activations`` (each optional); a reshape may stand before the activation. With ``widened_residual``
    also ``_bias_f32_add``, ``_reshape_f32_add`` and ``_bias_reshape_f32_add``: the (16-bit) result cast back to float32 and added to a float32
    residual, as GPT-2's projections join its float32 residual stream at 16 bits (the ``"widen"`` of
    :func:`read_epilogue`). With ``reshaped_residual`` also ``_reshape_add`` and ``_bias_reshape_add``: the result
    reshaped (rows back into batch and sequence) and then added to a residual of its type, as GPT-2's projections
    join its residual stream at float32. Each value takes the pattern of the product and returns the pattern of the
    group's result."""
    identity = lambda value: value  # noqa: E731
    epilogues = {}
    for bias_name, bias in (("", identity), ("_bias", bias_pattern)):
        if widened_residual:
            for reshape_name, reshape in (("", identity), ("_reshape", reshape_pattern)):
                if not bias_name and not reshape_name:
                    continue  # a cast straight after the product is the 16-bit one: that is `_add`
                epilogues[f"{bias_name}{reshape_name}_f32_add"] = (
                    lambda v, bias=bias, reshape=reshape: residual_pattern(cast_pattern(reshape(bias(v))))
                )
        if reshaped_residual:
            epilogues[f"{bias_name}_reshape_add"] = lambda v, bias=bias: residual_pattern(reshape_pattern(bias(v)))
        for residual_name, residual in (("", identity), ("_add", residual_pattern)):
            epilogues[f"{bias_name}{residual_name}"] = lambda v, bias=bias, residual=residual: residual(bias(v))
            for name in activations:
                suffix = "_gelu" if name == "gelu_tanh" else f"_{name}"
                for reshape_name, reshape in (("", identity), ("_reshape", reshape_pattern)):
                    epilogues[f"{bias_name}{residual_name}{reshape_name}{suffix}"] = (
                        lambda v, bias=bias, residual=residual, reshape=reshape, name=name:
                        activation_pattern(reshape(residual(bias(v))), [name])
                    )
    return epilogues


def recognizer_check(recognize):
    """A pattern check for a backend whose kernels are described by ``recognize(group)`` (which
    raises :class:`Refused` with the reason for what its kernels would compute differently).

    A batched matmul pattern with a constant right operand is refused: the dense patterns take it.
    """

    def check(match) -> bool:
        matmuls = [call for call in match.calls if tvm_compat.op_name(call) == "relax.matmul"]
        if ".batch_matmul" in match.pattern.name and any(tvm_compat.is_constant(arg) for call in matmuls for arg in call.args):
            raise Refused("a constant right operand is the dense patterns' match")
        recognize(Group.from_match(match))
        return True

    return check
