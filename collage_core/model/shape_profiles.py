"""Shape profiles: the static shapes a model with symbolic dimensions is optimized for.

A profile binds each symbolic dimension of the model's inputs (an ONNX ``dim_param`` such as ``batch`` or
``sequence``) to a size. ``--shapes`` lists them in one of two forms:

- by dimension, ``"batch=1,8 sequence=128,512"``: every combination of the sizes listed (here four profiles);
- by input, ``"input_ids=1x128,8x128,8x512"``: the k-th shape of each input listed makes profile k; inputs not
  listed take their sizes from the dimensions the listed ones bind.

Each profile makes a static copy of the model file (:func:`static_onnx`), which the single-shape pipeline
places as it places any model.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from pathlib import Path
from typing import Sequence

import attrs
import numpy as np

from collage_core.errors import CollageError


class ShapeProfileError(CollageError):
    """The shapes asked for do not fit the model, or cannot be read."""


@attrs.frozen
class SymbolicInput:
    """A model input whose dimensions are sizes (int) or symbolic names (str)."""

    name: str
    dims: tuple
    dtype: str

    def bound(self, sizes: dict) -> tuple[int, ...]:
        return tuple(dim if isinstance(dim, int) else sizes[dim] for dim in self.dims)

    def shown(self) -> str:
        """``batchx128``; ``[x.0, x.1]`` where a dimension's name would blur with the ``x`` between them (a PyTorch
        module's axes are named ``input.axis``, and ``x.0xx.1`` reads as nothing)."""
        if any(isinstance(dim, str) and ("x" in dim or "." in dim) for dim in self.dims):
            return "[" + ", ".join(str(dim) for dim in self.dims) + "]"
        return "x".join(str(dim) for dim in self.dims)


@attrs.frozen
class ShapeProfile:
    """One static shape of the model: each symbolic dimension's size, in the order the inputs name them,
    and each input's shape."""

    sizes: tuple[tuple[str, int], ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def label(self) -> str:
        """``batch=8 sequence=128``: how reports and progress name the profile."""
        return " ".join(f"{name}={size}" for name, size in self.sizes)

    def size_of(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    def shape_of(self, input_name: str) -> tuple[int, ...]:
        return dict(self.shapes)[input_name]

    def elements(self) -> int:
        total = 0
        for _, shape in self.shapes:
            count = 1
            for size in shape:
                count *= size
            total += count
        return total

    def to_json(self) -> dict:
        return {"sizes": dict(self.sizes), "inputs": {name: list(shape) for name, shape in self.shapes}}


def symbolic_inputs(proto) -> list[SymbolicInput]:
    """The graph inputs of an ONNX model (initializers left out), each dimension a size or its symbolic name;
    an unnamed dynamic dimension is refused, as no profile could name it."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx

    initializers = {init.name for init in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        if not value.type.HasField("tensor_type"):
            raise ShapeProfileError(f"input {value.name!r} is not a tensor: only tensor inputs take --shapes")
        if not value.type.tensor_type.HasField("shape"):
            raise ShapeProfileError(f"input {value.name!r} records no shape: its rank is unknown, so no shape can be listed for it")
        dims = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.dim_param:
                dims.append(str(dim.dim_param))
            else:
                raise ShapeProfileError(
                    f"input {value.name!r}: dimension {axis} is dynamic and unnamed; name it (a dim_param) to list its sizes"
                )
        found.append(SymbolicInput(value.name, tuple(dims), onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name))
    return found


def symbolic_dims(inputs: Sequence[SymbolicInput]) -> list[str]:
    """The symbolic dimensions, in the order the inputs first name them."""
    seen: list[str] = []
    for spec in inputs:
        seen.extend(dim for dim in spec.dims if isinstance(dim, str) and dim not in seen)
    return seen


_SIZES = re.compile(r"^\d+(,\d+)*$")
_SHAPES = re.compile(r"^\d+(x\d+)*(,\d+(x\d+)*)*$")


def parse_shapes(text: str, inputs: Sequence[SymbolicInput]) -> list[ShapeProfile]:
    """The profiles ``text`` lists (see the module's docstring), in order, each once; or a one-line
    error naming what does not fit."""
    dims = symbolic_dims(inputs)
    if not dims:
        raise ShapeProfileError("the model has no symbolic dimensions: its one static shape needs no --shapes")
    by_input = {spec.name: spec for spec in inputs}
    items = [item for item in re.split(r"[\s;]+", text.strip()) if item]
    if not items:
        raise ShapeProfileError(f"--shapes is empty; list sizes such as {_example(dims)}")
    parsed: dict[str, str] = {}
    for item in items:
        key, equals, values = item.partition("=")
        if not equals or not key or not values:
            raise ShapeProfileError(f"--shapes: {item!r} is not NAME=SIZES; for example {_example(dims)}")
        if key in parsed:
            raise ShapeProfileError(f"--shapes: {key!r} is listed twice")
        parsed[key] = values
    # A name that is both a dimension and an input is a dimension when its value is a list of sizes for an input
    # of another rank than 1 (a shape of rank 1 reads the same as a size).
    dim_keys = [
        key for key in parsed if key in dims and (key not in by_input or (_SIZES.match(parsed[key]) and len(by_input[key].dims) != 1))
    ]
    input_keys = [key for key in parsed if key in by_input and key not in dim_keys]
    unknown = [key for key in parsed if key not in dims and key not in by_input]
    if unknown:
        raise ShapeProfileError(
            f"--shapes: {unknown[0]!r} is neither a symbolic dimension ({_names(dims)}) nor an input ({_names(by_input)})"
        )
    if dim_keys and input_keys:
        raise ShapeProfileError("--shapes: list sizes by dimension (batch=1,8) or shapes by input (input_ids=1x128,8x128), not both")
    if dim_keys:
        profiles = _by_dimension(parsed, dims)
    else:
        profiles = _by_input(parsed, by_input, dims)
    unique = list(dict.fromkeys(tuple(sorted(p.items())) for p in profiles))
    made = [_profile(dict(sizes), inputs, dims) for sizes in unique]
    for profile in made:
        _refuse_beyond_memory(profile, inputs)
    return made


def _refuse_beyond_memory(profile: ShapeProfile, inputs: Sequence[SymbolicInput]) -> None:
    """A one-line error when one input of ``profile`` alone would need more memory than this machine has (a size
    mistyped by a few digits), before any array of it is made."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    by_name = {spec.name: spec for spec in inputs}
    for name, shape in profile.shapes:
        needed = math.prod(shape) * np.dtype(by_name[name].dtype).itemsize
        if needed > memory:
            raise ShapeProfileError(
                f"--shapes: at {profile.label}, input {name!r} alone would take {needed / 2**30:.3g} GiB, more than this machine's "
                f"{memory / 2**30:.3g} GiB of memory"
            )


def _example(dims: Sequence[str]) -> str:
    """Sizes by dimension, or (a name ``--shapes`` cannot hold, with a space, ``=``, ``,`` or ``;``) the by-input form."""
    if all(_WRITABLE.match(dim) for dim in dims):
        return " ".join(f"{dim}=1,8" for dim in dims)
    return "INPUT=1x128,8x128 (by input: a dimension's name here holds a character --shapes cannot)"


def _names(names) -> str:
    return ", ".join(repr(name) if not _WRITABLE.match(name) else name for name in names)


_WRITABLE = re.compile(r"^[^\s=,;]+$")


def _by_dimension(parsed: dict, dims: Sequence[str]) -> list[dict]:
    missing = [dim for dim in dims if dim not in parsed]
    if missing:
        raise ShapeProfileError(f"--shapes: give sizes for {_names(missing)} too (each symbolic dimension needs at least one)")
    for dim, values in parsed.items():
        if not _SIZES.match(values):
            raise ShapeProfileError(f"--shapes: {dim}={values} is not a list of sizes such as {dim}=1,8,32")
    sizes = {dim: [int(v) for v in parsed[dim].split(",")] for dim in dims}
    for dim, values in sizes.items():
        if any(v < 1 for v in values):
            raise ShapeProfileError(f"--shapes: {dim} must be at least 1, not {min(values)}")
    return [dict(zip(dims, combination)) for combination in itertools.product(*(sizes[dim] for dim in dims))]


def _by_input(parsed: dict, by_input: dict, dims: Sequence[str]) -> list[dict]:
    listed = {}
    for name, values in parsed.items():
        if not _SHAPES.match(values):
            raise ShapeProfileError(f"--shapes: {name}={values} is not a list of shapes such as {name}=1x128,8x128")
        listed[name] = [tuple(int(s) for s in shape.split("x")) for shape in values.split(",")]
    counts = {len(shapes) for shapes in listed.values()}
    if len(counts) > 1:
        raise ShapeProfileError("--shapes: every input listed needs as many shapes as the others (the k-th of each makes shape k)")
    profiles = []
    for index in range(counts.pop()):
        sizes: dict[str, int] = {}
        for name, shapes in listed.items():
            spec, shape = by_input[name], shapes[index]
            if len(shape) != len(spec.dims):
                raise ShapeProfileError(f"--shapes: {name} is {spec.shown()}, rank {len(spec.dims)}; {'x'.join(map(str, shape))} is not")
            for dim, size in zip(spec.dims, shape):
                if size < 1:
                    raise ShapeProfileError(f"--shapes: {name}: every size must be at least 1")
                if isinstance(dim, int) and dim != size:
                    raise ShapeProfileError(
                        f"--shapes: {name} is {spec.shown()}; its fixed sizes cannot change ({'x'.join(map(str, shape))})"
                    )
                if isinstance(dim, str) and sizes.setdefault(dim, size) != size:
                    raise ShapeProfileError(f"--shapes: shape {index + 1} gives {dim} two sizes ({sizes[dim]} and {size})")
        missing = [dim for dim in dims if dim not in sizes]
        if missing:
            raise ShapeProfileError(f"--shapes: no input listed binds {_names(missing)}; list an input that has it")
        profiles.append(sizes)
    return profiles


def profile_of(sizes: dict, inputs: Sequence[SymbolicInput]) -> ShapeProfile:
    """The profile binding each symbolic dimension of ``inputs`` to its size in ``sizes`` (every one, each a whole
    number of at least 1; else ``ValueError`` saying which)."""
    dims = symbolic_dims(inputs)
    if set(sizes) != set(dims):
        raise ValueError(f"sizes for {sorted(sizes)}, and the inputs' symbolic dimensions are {sorted(dims)}")
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in sizes.values()):
        raise ValueError(f"sizes must be whole numbers of at least 1: {sizes}")
    return _profile(sizes, inputs, dims)


def _profile(sizes: dict, inputs: Sequence[SymbolicInput], dims: Sequence[str]) -> ShapeProfile:
    return ShapeProfile(tuple((dim, sizes[dim]) for dim in dims), tuple((spec.name, spec.bound(sizes)) for spec in inputs))


def static_onnx(proto, profile: ShapeProfile):
    """A copy of ``proto`` whose inputs (and the outputs' symbolic dimensions it binds) have the profile's
    sizes; the inferred shapes of values inside the graph are dropped, for importers to infer again."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    sizes = dict(profile.sizes)
    for value in list(copy.graph.input) + list(copy.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    del copy.graph.value_info[:]
    return copy


def onnx_model_with_shapes(model):
    """``model`` (an ONNX file or ``onnx.ModelProto``, to be given shapes) as a ModelProto, its bytes (read once) and its name."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            data = path.read_bytes()
            return onnx.load_from_string(data), data, path.stem
        except Exception as error:
            raise ShapeProfileError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from None
    if type(model).__module__.startswith("onnx"):
        return model, model.SerializeToString(), model.graph.name or "onnx_model"
    raise ShapeProfileError(
        f"shape profiles take an ONNX model with symbolic dimensions (a file or onnx.ModelProto), not a {type(model).__name__}"
    )


def at_one_shape(model, shapes: str, what: str):
    """``model`` (an ONNX file or ModelProto with symbolic dimensions) at the one shape ``shapes`` lists (written
    as ``--shapes`` is), and its name: the ModelProto a ``--shapes`` run optimizes at that shape, byte for byte (its
    placement's fingerprint is this one's). Several shapes are refused in one line, saying ``what`` takes one."""
    proto, _, name = onnx_model_with_shapes(model)
    profiles = parse_shapes(shapes, symbolic_inputs(proto))
    if len(profiles) != 1:
        listed = "; ".join(profile.label for profile in profiles)
        raise ShapeProfileError(f"--shapes: {what} takes one shape, and {len(profiles)} are listed ({listed}); give one size each")
    return static_onnx(proto, profiles[0]), name
