"""Choosing, for a call, the shape profile of a library that runs it.

A call whose input shapes are a profile's runs that profile's entry function. Another runs on the smallest
profile (fewest input elements) that covers it, when every dimension it falls short in is one the padding rule
allows (:mod:`collage_core.model.padding`): its inputs are padded with zeros and its outputs cut back. Any
other call is refused in one line naming the shapes the library holds.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model.padding import PaddingRule, cut, padded
from collage_core.model.shape_profiles import ShapeProfile, SymbolicInput, profile_of, symbolic_dims


class ShapeNotServed(CollageError):
    """A call's input shapes fit none of the library's shape profiles."""


class ShapeRecordError(CollageError):
    """A record of shape profiles (a runtime file's, a placements file's, a tar's) cannot be read."""


@attrs.frozen
class Choice:
    """The profile a call runs on (its index and entry function) and the output cuts its padding needs
    (``(output index, axis)`` to the size kept); no cuts when the shapes are the profile's own."""

    index: int
    function: str
    cuts: dict = attrs.field(factory=dict)
    padded: bool = False


@attrs.frozen
class ShapeDispatch:
    """A library's shape profiles, their entry functions, its inputs' symbolic dimensions and its padding rule."""

    inputs: tuple[SymbolicInput, ...]
    profiles: tuple[ShapeProfile, ...]
    functions: tuple[str, ...]
    padding: PaddingRule

    def to_json(self) -> dict:
        return {
            "inputs": [{"name": spec.name, "dims": list(spec.dims), "dtype": spec.dtype} for spec in self.inputs],
            "profiles": [{**profile.to_json(), "function": function} for profile, function in zip(self.profiles, self.functions)],
            "padding": self.padding.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict, origin: str = "shape profiles") -> "ShapeDispatch":
        """The record :meth:`to_json` wrote, checked: each shape binds exactly the inputs' symbolic dimensions, its
        input shapes are rebuilt from them in input order, and each has an entry function of its own; anything
        else is a :class:`ShapeRecordError` naming ``origin``."""
        try:
            inputs = tuple(
                SymbolicInput(
                    str(item["name"]),
                    tuple(d if isinstance(d, int) and not isinstance(d, bool) else str(d) for d in item["dims"]),
                    str(item["dtype"]),
                )
                for item in data["inputs"]
            )
            profiles = tuple(profile_of(dict(item["sizes"]), inputs) for item in data["profiles"])
            functions = tuple(str(item["function"]) for item in data["profiles"])
            padding = PaddingRule.from_json(data.get("padding", {}))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ShapeRecordError(f"{origin}: its shapes cannot be read ({type(error).__name__}: {error})") from None
        if not profiles or len(set(functions)) != len(functions):
            raise ShapeRecordError(f"{origin}: its shapes cannot be read (no shape, or two shapes with one entry function)")
        dims = set(symbolic_dims(inputs))
        if any(dim not in dims for dim, _ in padding.allowed) or any(o < 0 or a < 0 for _, axes in padding.allowed for o, a in axes):
            raise ShapeRecordError(f"{origin}: its padding rule names a dimension or axis the inputs do not have")
        return cls(inputs, profiles, functions, padding)

    def smallest_first(self) -> list[int]:
        """The profiles' indices, fewest input elements first (the order a call looks for one that covers it)."""
        return sorted(range(len(self.profiles)), key=lambda i: (self.profiles[i].elements(), i))

    def listed(self) -> str:
        return "; ".join(profile.label for profile in self.profiles)

    def choose(self, shapes: Sequence[tuple[int, ...]]) -> Choice:
        """The profile arrays of ``shapes`` (in input order) run on; :class:`ShapeNotServed` when none may."""
        shapes = [tuple(int(size) for size in shape) for shape in shapes]
        if len(shapes) != len(self.inputs):
            raise ShapeNotServed(
                f"the model takes {len(self.inputs)} inputs ({', '.join(repr(s.name) for s in self.inputs)}), not {len(shapes)}"
            )
        for spec, shape in zip(self.inputs, shapes):
            if len(shape) != len(spec.dims) or any(isinstance(dim, int) and dim != size for dim, size in zip(spec.dims, shape)):
                raise ShapeNotServed(f"input {spec.name!r} is {spec.shown()}, not {'x'.join(map(str, shape))}")
        sizes = self._sizes(shapes)
        order = self.smallest_first()
        for index in order:
            profile = self.profiles[index]
            if sizes == dict(profile.sizes):
                return Choice(index, self.functions[index])
        why = "no listed shape covers it"
        for index in order:
            profile = self.profiles[index]
            short = {dim: size for dim, size in sizes.items() if size < profile.size_of(dim)}
            if any(size > profile.size_of(dim) for dim, size in sizes.items()):
                continue
            refused = [dim for dim in short if not self.padding.allows(dim)]
            if refused:
                why = f"{refused[0]!r} cannot be padded ({dict(self.padding.refused).get(refused[0], 'not verified')})"
                continue
            cuts = {axis: size for dim, size in short.items() for axis in self.padding.output_axes(dim)}
            return Choice(index, self.functions[index], cuts, padded=True)
        shown = ", ".join(f"{spec.name} {'x'.join(map(str, shape))}" for spec, shape in zip(self.inputs, shapes))
        raise ShapeNotServed(f"{shown}: {why}; this library holds the shapes {self.listed()}")

    def _sizes(self, shapes) -> dict:
        sizes: dict[str, int] = {}
        for spec, shape in zip(self.inputs, shapes):
            for dim, size in zip(spec.dims, shape):
                if isinstance(dim, str) and sizes.setdefault(dim, size) != size:
                    raise ShapeNotServed(f"input {spec.name!r} gives {dim!r} the size {size}, another input {sizes[dim]}")
        return sizes

    def arguments(self, choice: Choice, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``arrays`` padded with zeros to the chosen profile's shapes."""
        profile = self.profiles[choice.index]
        return [padded(np.asarray(array), profile.shape_of(spec.name)) for spec, array in zip(self.inputs, arrays)]

    def outputs(self, choice: Choice, outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The chosen profile's outputs cut back to the call's sizes."""
        return cut(outputs, choice.cuts) if choice.cuts else list(outputs)


def run_dispatched(vm, device, dispatch: ShapeDispatch, inputs) -> list[np.ndarray]:
    """One call of a library of shape profiles (a Relax VM over it on ``device``) through its dispatcher."""
    arrays = [np.asarray(array) for array in inputs]
    choice = dispatch.choose([array.shape for array in arrays])
    result = vm[choice.function](*[tvm_compat.to_tensor(a, device) for a in dispatch.arguments(choice, arrays)])
    outputs = [tvm_compat.to_numpy(o) for o in (result if not hasattr(result, "numpy") else [result])]
    return dispatch.outputs(choice, outputs)
