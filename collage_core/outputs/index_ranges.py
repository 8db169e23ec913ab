"""The range each integer input of a model may take where it indexes a table (token ids into an embedding), and
the check that refuses a call outside it.

ONNX's ``Gather`` (TVM's ``take``) reads its indices unchecked in TVM's kernels ("fast" mode): an id past the
vocabulary reads a wrong row or, far past it, faults, where ONNX Runtime and PyTorch raise. An input that reaches a
``take``'s indices through operators that keep its values (reshapes, casts, slices; ONNX's normalization of
negative indices, ``where(i < 0, i + n, i)``) may take the values ``[-n, n)`` of a table of ``n`` rows along that
axis (``[0, n)`` without the normalization). :func:`index_ranges` finds those ranges in the imported Relax, and
:func:`check_index_ranges` refuses a call outside them in one line before anything runs. The ranges go into a
Model Library Format tar's executor configuration (``input_ranges``) for deployments to check as well.
Checking needs TVM's runtime alone; finding the ranges needs Relax.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.errors import CollageError

# Operators whose output holds values of their first argument only (rearranged, repeated, cast or sliced).
KEEPS_VALUES = {
    "relax.reshape",
    "relax.astype",
    "relax.expand_dims",
    "relax.squeeze",
    "relax.flatten",
    "relax.permute_dims",
    "relax.broadcast_to",
    "relax.strided_slice",
}


class IndexOutOfRange(CollageError):
    """A call's integer input holds a value outside the range of the table it indexes."""


@attrs.frozen
class IndexRange:
    """Input ``index`` (``name``) may take values in ``[low, high)``: it indexes a table of ``high`` rows."""

    index: int
    name: str
    low: int
    high: int

    def to_json(self) -> dict:
        return {"input": self.index, "name": self.name, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, data: dict) -> "IndexRange":
        return cls(int(data["input"]), str(data["name"]), int(data["low"]), int(data["high"]))


@attrs.frozen
class _Traced:
    """A value that holds (some of) input ``index``'s values; ``shifted``: plus a constant (``i + n``);
    ``normalized``: passed through ``where(i < 0, i + n, i)``, so negative values index from the end."""

    index: int
    shifted: bool = False
    normalized: bool = False


def index_ranges(mod) -> tuple[IndexRange, ...]:
    """The range of each integer input of ``mod["main"]`` that indexes a table, tightest over every table it
    indexes; inputs that index none are left out."""
    # Relax here: a loaded tar checks its ranges with TVM's runtime alone
    from tvm import relax

    func = mod["main"]
    traced: dict = {}
    for position, param in enumerate(func.params):
        try:
            _, dtype = tvm_compat.tensor_shape_dtype(param)
        except ValueError:
            continue
        if dtype.startswith(("int", "uint")):
            traced[param] = _Traced(position)
    found: dict[int, tuple[int, int]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not tvm_compat.is_op_call(value):
                if isinstance(value, relax.Var) and value in traced:
                    traced[binding.var] = traced[value]
                continue
            name = tvm_compat.op_name(value)
            args = list(value.args)
            if name in KEEPS_VALUES and args and args[0] in traced and not traced[args[0]].shifted:
                traced[binding.var] = traced[args[0]]
            elif name == "relax.add" and len(args) == 2 and _one_constant_and_one_traced(args, traced):
                source = traced[args[0] if args[0] in traced else args[1]]
                traced[binding.var] = attrs.evolve(source, shifted=True)
            elif name == "relax.where" and len(args) == 3 and args[1] in traced and args[2] in traced:
                shifted, plain = traced[args[1]], traced[args[2]]
                if shifted.shifted and not plain.shifted and shifted.index == plain.index:
                    traced[binding.var] = _Traced(plain.index, normalized=True)
            elif name == "relax.take" and len(args) == 2 and args[1] in traced and not traced[args[1]].shifted:
                rows = _rows(args[0], int(value.attrs.axis))
                if rows is not None:
                    source = traced[args[1]]
                    low, high = found.get(source.index, (-rows, rows))
                    found[source.index] = (max(low, -rows if source.normalized else 0), min(high, rows))
    return tuple(IndexRange(index, str(func.params[index].name), low, high) for index, (low, high) in sorted(found.items()))


def check_index_ranges(ranges: Sequence[IndexRange], inputs: Sequence) -> None:
    """Raise :class:`IndexOutOfRange` naming the first input, value and position outside its range."""
    for limit in ranges:
        if limit.index >= len(inputs):
            continue
        array = np.asarray(inputs[limit.index])
        if array.size == 0 or not np.issubdtype(array.dtype, np.integer):
            continue
        outside = (array < limit.low) | (array >= limit.high)
        if outside.any():
            where = tuple(int(i) for i in np.argwhere(outside)[0])
            raise IndexOutOfRange(
                f"input {limit.name or limit.index}: {int(array[where])} at {list(where)} is outside [{limit.low}, {limit.high}), "
                f"the rows of the table it indexes (a token id past the vocabulary?); nothing was run"
            )


def _one_constant_and_one_traced(args, traced) -> bool:
    return sum(arg in traced for arg in args) == 1 and any(tvm_compat.is_constant(arg) for arg in args)


def _rows(table, axis: int):
    try:
        shape, _ = tvm_compat.tensor_shape_dtype(table)
    except ValueError:
        return None
    return shape[axis] if -len(shape) <= axis < len(shape) else None
