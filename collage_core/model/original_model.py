"""An engine's own session over the model file the user gave, as a placement Collage can return.

Collage's converters hand a graph-level engine the regions they can express; an operator they cannot
(a resize the Relax-to-ONNX converter lacks) stays on TVM, untuned, and can cost more than the whole
model does in the engine's own session. So each backend whose plugin implements
``collage_lower_whole_model`` also runs the original file, exactly as its users run it, as a
contender beside the searched placement: one partition holding every operator, whose function the
plugin lowers from the file's bytes, not from what Collage's importer made of them. When it is the
fastest, it is what Collage returns, saves, replays and exports, and Collage is never slower than
that engine's own session, whatever the converters lack.

The lowering needs the original bytes, which only the process that imported the model holds, so it
happens there (:func:`lowered_module`); the lowered function travels in the module, and a process
that builds it only prepares the backend's runtime (see ``collage_core.build.executable.lower_partitions``).
"""

from __future__ import annotations

import hashlib
from typing import Optional

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build.partition import BACKEND_ATTR, PATTERN_ATTR, partition_function_name, pattern_of
from collage_core.errors import CollageError
from collage_core.plugins import first_result
from collage_core.records import Cost, Partition

# The pattern of the one partition of such a placement: "<backend>.original_model".
ORIGINAL_MODEL = "original_model"
# The one model format Collage keeps the original of (a PyTorch module or a Relax module has no file).
ONNX = "onnx"


class OriginalModelError(CollageError):
    """A backend's plugin failed to run the original model, or returned what cannot stand for it."""


@attrs.frozen
class OriginalModel:
    """The model file the user gave, as bytes in ``format``, and its SHA-256 digest."""

    format: str
    data: bytes = attrs.field(eq=False, repr=False)
    digest: str

    @classmethod
    def from_bytes(cls, format: str, data: bytes) -> "OriginalModel":
        return cls(format, data, hashlib.sha256(data).hexdigest())


def pattern(backend: str) -> str:
    return f"{backend}.{ORIGINAL_MODEL}"


def runs_original(part) -> bool:
    """Whether ``part`` (a Partition, Candidate or anything with ``backend`` and ``pattern``) is an
    engine's own session over the original file."""
    return part.pattern == pattern(part.backend)


def engine_of(parts) -> Optional[str]:
    """The backend whose own session runs the original file, when ``parts`` is such a placement."""
    if parts is not None and len(parts) == 1 and runs_original(parts[0]):
        return parts[0].backend
    return None


def is_lowered_already(func) -> bool:
    """Whether a partition function is an engine's session over the original file: lowered where the file was."""
    return (
        isinstance(func, relax.Function)
        and func.attrs is not None
        and BACKEND_ATTR in func.attrs
        and pattern_of(func) == pattern(str(func.attrs[BACKEND_ATTR]))
    )


def contender_name(backend: str) -> str:
    """The row of the end-to-end table, and the name the contest gives it."""
    return f"{backend}'s own session"


def what_it_runs(backend: str) -> str:
    """Why such a placement is what it is, for the sentence saying why it was returned."""
    return (
        f"{contender_name(backend)} runs the original model file as its users run it (the engine's default session, "
        f"Collage's thread settings), every operator in the engine, none converted by Collage"
    )


def placement_parts(backend: str, operators: int, original: OriginalModel, cost: Cost = Cost.unknown()) -> list[Partition]:
    """The placement: one partition of every operator, keyed by the file's digest."""
    return [Partition(backend, pattern(backend), range(operators), f"{pattern(backend)}:{original.digest}", cost)]


def key_part(parts, backends: dict) -> str:
    """What a cost-database key says of such a placement: the engine, its version and the file's digest."""
    (part,) = parts
    return f"{part.key}|{part.backend}={backends[part.backend].version}"


def lowered_module(pm, imported, backend, target) -> Optional[tvm.IRModule]:
    """``main`` calling one function, ``collage_<backend>_0``, that ``backend``'s plugin lowered to run
    ``imported``'s original file (``collage_lower_whole_model``); None when the model has no original
    file, or no plugin runs it for ``backend`` on ``target``. A plugin that raised is named in the error."""
    original = imported.original
    if original is None:
        return None
    main = imported.mod["main"]
    name = partition_function_name(backend.name, 0)
    func = main.without_attr("global_symbol").with_attrs({BACKEND_ATTR: backend.name, PATTERN_ATTR: pattern(backend.name)})
    lowered, errors = first_result(
        pm.hook.collage_lower_whole_model,
        backend=backend,
        model=original.data,
        model_format=original.format,
        func=func,
        name=name,
        target=target,
    )
    if lowered is None:
        if errors:
            raise OriginalModelError(f"backend {backend.name}: running the original model failed: {'; '.join(errors)}")
        return None
    if len(lowered.params) != len(main.params) or not tvm_compat.structural_equal(
        tvm_compat.return_type(lowered), tvm_compat.return_type(main)
    ):
        raise OriginalModelError(
            f"backend {backend.name}: collage_lower_whole_model returned a function that does not "
            f"take the model's inputs and give its outputs"
        )
    lowered = lowered.with_attrs(dict(func.attrs))  # marked as what it is however the plugin built it
    bb = relax.BlockBuilder()
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in main.params]
    with bb.function("main", params):
        gvar = bb.add_func(lowered, name)
        with bb.dataflow():
            output = bb.emit_output(relax.Call(gvar, params))
        bb.emit_func_output(output)
    return bb.get()


def kind_of(imported) -> str:
    """What a model given without a file is, in words: ``a PyTorch module``."""
    return {"torch": "a PyTorch module", "relax": "a Relax module"}.get(imported.source, "not a model file")
