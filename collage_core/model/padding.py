"""The padding rule of a model with shape profiles: which symbolic dimensions a call may be padded along.

A call whose shapes no profile matches runs on the smallest profile that covers them: its inputs are padded
with zeros up to that profile's sizes and its outputs cut back. That is right only where the model computes
the real positions the same whatever follows them (a batch of independent rows; a sequence whose padded
tokens are masked out with an attention mask of zeros). Collage does not assume it: for each symbolic
dimension that the outputs name too (so that it knows which output axes to cut), it runs the model's
reference (ONNX Runtime on the original file) on a smaller size and on the same inputs zero-padded, and
allows padding along the dimension only when the real positions agree within the fp32 tolerance. The probe's
integer inputs are ones (token ids of 1, attention masks that keep every real position); float inputs are
uniform in [-1, 1]. Padding along two dimensions at once is allowed when each is.
"""

from __future__ import annotations

from typing import Optional, Sequence

import attrs
import numpy as np

from collage_core.model.shape_profiles import ShapeProfile, SymbolicInput
from collage_core.model.verify import compare_outputs


@attrs.frozen
class PaddingRule:
    """``allowed``: the dimensions a call may be padded along, each with the output axes cut back to its size
    (``(output index, axis)`` pairs); ``refused``: the others, each with why."""

    allowed: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()

    def allows(self, dim: str) -> bool:
        return dim in dict(self.allowed)

    def output_axes(self, dim: str) -> tuple[tuple[int, int], ...]:
        return dict(self.allowed)[dim]

    def describe(self) -> str:
        said = [f"{dim}: padded with zeros (verified against the reference)" for dim, _ in self.allowed]
        said += [f"{dim}: not padded ({why})" for dim, why in self.refused]
        return "; ".join(said)

    def to_json(self) -> dict:
        return {"allowed": {dim: [list(pair) for pair in axes] for dim, axes in self.allowed}, "refused": dict(self.refused)}

    @classmethod
    def from_json(cls, data: dict) -> "PaddingRule":
        return cls(
            tuple((str(dim), tuple((int(o), int(a)) for o, a in axes)) for dim, axes in data.get("allowed", {}).items()),
            tuple((str(dim), str(why)) for dim, why in data.get("refused", {}).items()),
        )


def output_dims(proto) -> list[tuple]:
    """Each graph output's dimensions: sizes (int), symbolic names (str) or None where unnamed."""
    found = []
    for value in proto.graph.output:
        dims = []
        for dim in value.type.tensor_type.shape.dim:
            dims.append(int(dim.dim_value) if dim.HasField("dim_value") else (str(dim.dim_param) if dim.dim_param else None))
        found.append(tuple(dims))
    return found


def probe_inputs(inputs: Sequence[SymbolicInput], shapes: Sequence[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    """Inputs of ``shapes`` for the padding probe: integer inputs of ones, floats uniform in [-1, 1]."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec, shape in zip(inputs, shapes):
        if spec.dtype.startswith(("int", "uint")) or spec.dtype == "bool":
            arrays.append(np.ones(shape, dtype=spec.dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(spec.dtype))
    return arrays


def padded(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``array`` with zeros after its last element along each axis, up to ``shape``."""
    if tuple(array.shape) == tuple(shape):
        return array
    grown = np.zeros(shape, dtype=array.dtype)
    grown[tuple(slice(0, size) for size in array.shape)] = array
    return grown


def cut(outputs: Sequence[np.ndarray], cuts: dict[tuple[int, int], int]) -> list[np.ndarray]:
    """``outputs`` cut back: ``cuts`` maps (output index, axis) to the size to keep."""
    kept = []
    for index, output in enumerate(outputs):
        where = [slice(None)] * np.ndim(output)
        for (which, axis), size in cuts.items():
            if which == index:
                where[axis] = slice(0, size)
        kept.append(np.asarray(output)[tuple(where)])
    return kept


def padding_rule(proto, inputs: Sequence[SymbolicInput], profiles: Sequence[ShapeProfile], reference) -> PaddingRule:
    """Which symbolic dimensions calls may be padded along (see the module's docstring); ``reference`` runs
    the original model on a list of arrays, in input order, and returns its outputs."""
    outputs = output_dims(proto)
    dims = [dim for dim, _ in profiles[0].sizes]
    allowed, refused = [], []
    for dim in dims:
        axes, problem = _output_axes(outputs, dim, dims)
        if problem:
            refused.append((dim, problem))
            continue
        largest = max(profile.size_of(dim) for profile in profiles)
        probe = min((p for p in profiles if p.size_of(dim) > 1), key=lambda p: (p.elements(), p.size_of(dim)), default=None)
        if probe is None:
            refused.append((dim, f"every size listed is 1 (largest {largest}): nothing to pad"))
            continue
        why = _probe_fails(inputs, probe, dim, axes, reference)
        if why:
            refused.append((dim, why))
        else:
            allowed.append((dim, axes))
    return PaddingRule(tuple(allowed), tuple(refused))


def _output_axes(outputs: list[tuple], dim: str, dims: Sequence[str]) -> tuple[tuple[tuple[int, int], ...], str]:
    axes = []
    for index, output in enumerate(outputs):
        for axis, size in enumerate(output):
            if size is None or (isinstance(size, str) and size not in dims):
                return (), f"output {index}'s axis {axis} is {size or 'unnamed'}, so which of its positions are padding is unknown"
            if size == dim:
                axes.append((index, axis))
    return tuple(axes), ""


def _probe_fails(inputs, probe: ShapeProfile, dim: str, axes, reference) -> Optional[str]:
    size = probe.size_of(dim)
    smaller = max(1, size // 2)
    small_shapes = [tuple(smaller if d == dim else s for d, s in zip(spec.dims, probe.shape_of(spec.name))) for spec in inputs]
    full_shapes = [probe.shape_of(spec.name) for spec in inputs]
    small = probe_inputs(inputs, small_shapes)
    try:
        expected = reference(small)
        got = reference([padded(array, shape) for array, shape in zip(small, full_shapes)])
    except Exception as error:
        return (
            f"the reference failed on the probe: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        )
    checked = compare_outputs(cut(got, {axis: smaller for axis in axes}), expected, "the reference")
    if not checked.passed:
        return f"zero padding from {smaller} to {size} changes the real positions' outputs (max abs error {checked.max_abs_error:.3g})"
    return None
