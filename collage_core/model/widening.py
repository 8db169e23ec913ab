"""Keeping chosen parts of a 16-bit model in float32: the units precision is chosen by, and widening them.

A model converted to bf16 or fp16 (:mod:`collage_core.model.precision`) computes its matrix products and
convolutions (the *anchors*) on 16-bit operands, and the operators that follow them in 16 bits until
a cast back to float32. A *unit* is one anchor with the 16-bit operators it feeds, up to the next
anchor: the smallest piece whose precision can change on its own, numbered in the order of the
model's bindings. Units are found in the converted graph itself, so the same model at the same
precision always has the same units, and a placement file can name them by number.

:func:`widen` gives chosen units float32 arithmetic: their operands are the float32 values the
conversion cast down (weights are taken back from the float32 model, not rounded), the operators
are rebuilt on them, and where an operator outside the units still reads a 16-bit value, a cast
down stays for it. The result is one dataflow block like any model, placed like any model.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.model.dtypes import DTYPES
from collage_core.model.relax_graph import substitute

ANCHORS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.attention", "relax.nn.attention_bias")
SIXTEEN_BIT = tuple(DTYPES.values())
ASTYPE = "relax.astype"


def _bindings(mod) -> list:
    (block,) = mod["main"].body.blocks
    return list(block.bindings)


def _dtype(expr) -> str:
    try:
        return tvm_compat.tensor_shape_dtype(expr)[1]
    except Exception:  # tuples and shapes carry no single dtype
        return ""


def _is_sixteen_bit(expr) -> bool:
    return _dtype(expr) in SIXTEEN_BIT


def touches_sixteen_bit(value) -> bool:
    if not isinstance(value, relax.Call) or not tvm_compat.is_op_call(value):
        return False
    return _is_sixteen_bit(value) or any(_is_sixteen_bit(arg) for arg in value.args if isinstance(arg, relax.Expr))


def _per_module(function: Callable) -> Callable:
    """``function(mod)`` remembered for the last few modules (the same object, ``same_as``): an accuracy
    budget's probes widen one converted model from one float32 original again and again."""
    recent: list = []  # (module, result), the latest last

    @functools.wraps(function)
    def remembered(mod):
        for known, result in recent:
            if known.same_as(mod):
                return result
        result = function(mod)
        recent.append((mod, result))
        del recent[:-2]
        return result

    return remembered


@_per_module
def units(mod) -> list[list[int]]:
    """The model's units: for each anchor with a 16-bit operand, in binding order, the indices of its
    binding and of the 16-bit bindings it feeds before another anchor. Empty for a float32 model."""
    bindings = _bindings(mod)
    unit_of: dict = {}
    found: list[list[int]] = []
    for index, binding in enumerate(bindings):
        value = binding.value
        if touches_sixteen_bit(value) and tvm_compat.op_name(value) in ANCHORS and any(_is_sixteen_bit(a) for a in value.args):
            found.append([index])
            unit_of[binding.var] = len(found) - 1
            continue
        structural = isinstance(value, (relax.Tuple, relax.TupleGetItem))
        if not (structural or touches_sixteen_bit(value)):
            continue
        producers = [unit_of[var] for var in relax.analysis.free_vars(value) if var in unit_of]
        if producers:
            unit = max(producers)
            found[unit].append(index)
            unit_of[binding.var] = unit
    return found


@_per_module
def float32_constants(original_mod) -> dict:
    """The float32 model's constants keyed by their values rounded to each 16-bit dtype, so that a
    widened unit takes back the exact weights the conversion rounded."""
    found: dict = {}

    def visit(expr):
        array = tvm_compat.constant_array(expr)
        if array is not None and array.dtype == np.float32:
            for name in SIXTEEN_BIT:
                rounded = array.astype(name)
                found.setdefault((name, array.shape, rounded.tobytes()), expr)

    relax.analysis.post_order_visit(original_mod["main"], visit)
    return found


def widen(mod, chosen: Iterable[int], original_mod):
    """``mod`` (a converted model) with the units numbered in ``chosen`` computing in float32."""
    chosen = set(chosen)
    if not chosen:
        return mod
    unit_list = units(mod)
    unknown = sorted(u for u in chosen if not 0 <= u < len(unit_list))
    if unknown:
        raise ValueError(f"the model has units 0-{len(unit_list) - 1}, not {unknown}")
    widened = {index for unit in chosen for index in unit_list[unit]}
    constants = float32_constants(original_mod)
    func = mod["main"]
    bindings = _bindings(mod)
    builder = relax.BlockBuilder()
    remap: dict = {}  # old var -> the var that now holds its (unchanged) value
    rounded_from: dict = {}  # a 16-bit var -> the float32 value the conversion rounded to it
    wide: dict = {}  # a widened 16-bit var -> its float32 twin

    def current(arg):
        return substitute(arg, remap)

    def as_float32(arg):
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([as_float32(field) for field in arg.fields])
        if isinstance(arg, relax.Var) and (arg in wide or arg in rounded_from):
            return wide.get(arg, rounded_from.get(arg))
        arg = current(arg)
        if not _is_sixteen_bit(arg):
            return arg
        array = tvm_compat.constant_array(arg)
        if array is not None:
            original = constants.get((_dtype(arg), array.shape, array.tobytes()))
            if original is not None:
                return original
        return builder.emit(relax.op.astype(arg, "float32"))

    with builder.function("main", list(func.params), attrs=_attributes(func)):
        with builder.dataflow():
            for index, binding in enumerate(bindings):
                value, name = binding.value, binding.var.name
                if _casts_down(value):
                    rounded_from[binding.var] = current(value.args[0])
                if index in widened or _casts_a_twin_up(value, wide):
                    twin = builder.emit(_float32_form(value, as_float32), name_hint=name + "_f32")
                    if _is_sixteen_bit(twin):  # an operator whose attributes name a 16-bit result dtype
                        twin = builder.emit(relax.op.astype(twin, "float32"), name_hint=name + "_f32")
                    if _is_sixteen_bit(binding.var):
                        wide[binding.var] = twin
                        remap[binding.var] = builder.emit(relax.op.astype(twin, _dtype(binding.var)), name_hint=name)
                    elif _dtype(binding.var) == "float32":
                        remap[binding.var] = twin
                    else:  # a tuple: widened readers take the twin, the others the value as it was
                        wide[binding.var] = twin
                        remap[binding.var] = builder.emit(current(value), name_hint=name)
                    continue
                remap[binding.var] = builder.emit(current(value), name_hint=name)
            output = builder.emit_output(current(func.body.body))
        builder.emit_func_output(output)
    result = tvm.IRModule({"main": builder.get()["main"]}, attrs=mod.attrs)
    return tvm.transform.Sequential([relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination(["main"])])(result)


def _float32_form(value, as_float32):
    """One binding's value computed on float32 operands (a cast becomes its float32 source)."""
    if isinstance(value, relax.TupleGetItem):
        return relax.TupleGetItem(as_float32(value.tuple_value), value.index)
    if isinstance(value, relax.Tuple):
        return relax.Tuple([as_float32(field) for field in value.fields])
    if tvm_compat.op_name(value) == ASTYPE:
        return as_float32(value.args[0])
    return relax.Call(value.op, [as_float32(arg) for arg in value.args], value.attrs, value.ty_args)


def _casts_down(value) -> bool:
    """Whether ``value`` rounds a float32 value to 16 bits (the float32 value is what a widened unit reads)."""
    return (
        isinstance(value, relax.Call)
        and tvm_compat.is_op_call(value)
        and tvm_compat.op_name(value) == ASTYPE
        and _dtype(value) in SIXTEEN_BIT
        and _dtype(value.args[0]) == "float32"
    )


def _casts_a_twin_up(value, wide) -> bool:
    """Whether ``value`` casts a widened 16-bit value back up to float32 (it becomes the twin itself)."""
    return (
        isinstance(value, relax.Call)
        and tvm_compat.is_op_call(value)
        and tvm_compat.op_name(value) == ASTYPE
        and _dtype(value) == "float32"
        and isinstance(value.args[0], relax.Var)
        and value.args[0] in wide
    )


def _attributes(func) -> dict:
    return {key: func.attrs[key] for key in func.attrs.keys()} if func.attrs is not None else {}
