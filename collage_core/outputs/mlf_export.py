"""Exporting a placed model in Model Library Format (the layout :mod:`collage_core.outputs.mlf` describes and
loads): the build, the memory map, each function lowered, and the deterministic tar.

Exporting builds, so it needs TVM's compiler; loading (:mod:`collage_core.outputs.mlf`) needs TVM's runtime alone.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs
import numpy as np
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build.deploy import backend_needs, runtime_libraries
from collage_core.build.executable import build, lower_partitions
from collage_core.build.partition import BACKEND_ATTR, pattern_of
from collage_core.build.plugin_calls import calls_of
from collage_core.build.profiles import merged_module
from collage_core.errors import CollageError
from collage_core.outputs.mlf import (
    CALL_KINDS,
    EXECUTOR,
    EXECUTOR_CONFIG,
    FORMAT,
    LOWERED_DIR,
    OBJECTS_DIR,
    PLACEMENT,
    RELAX_TEXT,
    RUNTIME_DIR,
    VERSION,
    MLFError,
    _parameters_member,
    check_in_new_process,
)
from collage_core.outputs.output_folder import refuse_special_file
from collage_core.outputs.profiled_result import ProfiledModel
from collage_core.plugins import get_plugin_manager


def _bytes_of(value_type) -> int:
    shape, dtype = tvm_compat.tensor_shape_dtype(value_type)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _tensor_bytes(expr) -> int:
    try:
        return _bytes_of(expr)
    except ValueError:
        return 0


def _constants(func) -> list:

    found = []
    relax.analysis.post_order_visit(func.body, lambda node: found.append(node) if tvm_compat.is_constant(node) else None)
    return found


def _function_memory(name: str, func) -> dict:
    """Bytes of a function's inputs, outputs, constants and intermediate values (before memory planning)."""
    bindings = [binding for block in func.body.blocks for binding in block.bindings]
    outputs = set(_output_vars(func))
    return {
        "function": name,
        "backend": str(func.attrs["collage.backend"]) if func.attrs is not None and "collage.backend" in func.attrs else "",
        "input_bytes": sum(_tensor_bytes(param) for param in func.params),
        "output_bytes": sum(_tensor_bytes(var) for var in _output_vars(func)),
        "constant_bytes": sum(_tensor_bytes(constant) for constant in _constants(func)),
        "intermediate_bytes_unplanned": sum(_tensor_bytes(binding.var) for binding in bindings if binding.var not in outputs),
    }


def _output_vars(func) -> list:

    body = func.body.body
    return list(body.fields) if isinstance(body, relax.Tuple) else [body]


def memory_map(partitioned) -> dict:
    """Per function of the partitioned module: input, output, constant and intermediate bytes."""

    functions = [
        _function_memory(gvar.name_hint, func)
        for gvar, func in sorted(partitioned.functions.items(), key=lambda item: item[0].name_hint)
        if isinstance(func, relax.Function)
    ]
    return {
        "functions": functions,
        "constant_bytes": sum(f["constant_bytes"] for f in functions),
        "note": "intermediate_bytes_unplanned is the sum of intermediate tensors before Relax plans their storage",
    }


def _io(vars_) -> list[dict]:
    """Name, shape and dtype of each tensor; a tuple-typed value is described field by field."""

    described = []
    for var in vars_:
        value_type = tvm_compat.value_type(var)
        fields = list(value_type.fields) if isinstance(value_type, relax.TupleType) else [value_type]
        for index, field in enumerate(fields):
            shape, dtype = tvm_compat.type_shape_dtype(field)
            name = getattr(var, "name", "") + (f"[{index}]" if len(fields) > 1 else "")
            described.append({"name": name, "shape": list(shape), "dtype": dtype})
    return described


def _named(outputs: list[dict], names) -> list[dict]:
    """``outputs`` under the model's own names where it names each of them; else as the Relax function names them."""
    if len(names) != len(outputs):
        return outputs
    return [{**output, "name": str(name)} for output, name in zip(outputs, names)]


def _parameters(partitioned) -> dict:
    """Every distinct constant of the partitioned module, named ``p<i>`` in order of first appearance, as numpy.

    A constant held by several functions (every shape's entry function holds the model's weights) is stored once,
    as the executable's constant pool holds it once.
    """

    params = {}
    seen = set()
    for _, func in sorted(partitioned.functions.items(), key=lambda item: item[0].name_hint):
        if isinstance(func, relax.Function):
            for constant in _constants(func):
                array = np.ascontiguousarray(tvm_compat.constant_array(constant))
                key = (array.dtype.str, array.shape, hashlib.sha256(array.view(np.uint8).reshape(-1)).digest())
                if key not in seen:
                    seen.add(key)
                    params[f"p{len(params)}"] = array
    return params


def _epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def _export_time() -> str:
    moment = (
        datetime.datetime.fromtimestamp(_epoch(), datetime.timezone.utc)
        if "SOURCE_DATE_EPOCH" in os.environ
        else (datetime.datetime.now(datetime.timezone.utc))
    )
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _json_bytes(value) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def _function_order(name: str) -> tuple:
    """Partition functions in the order of their numbers (``collage_tvm_2`` before ``collage_tvm_10``), ``main`` first."""
    number = re.search(r"(\d+)$", name)
    return (name != "main", int(number.group(1)) if number else -1, name)


def _member_name(number: int, function: str) -> str:
    """A member for a function's lowered IR: numbered, so that no name from the model chooses a path."""
    return f"{LOWERED_DIR}{number:03d}-{re.sub(r'[^A-Za-z0-9_]+', '_', function)[:64]}.txt"


def _lowered(pm, partitioned, backends: dict, target, replays_cuda_graphs: bool) -> tuple[dict[str, bytes], list[dict]]:
    """Each Relax function of the partitioned module as its backend lowered it, with what it calls once
    built and those TIR functions: ``({member: text}, [summary per function])``."""

    # Lowered again beside the build, which keeps what it lowered to itself; lowering is deterministic
    # (DNNL's layout choices are kept in its kernel cache), so this is what the build compiled.
    lowered = lower_partitions(pm, partitioned, backends, target)
    built = tvm_compat.lowered_for_build(lowered, target)
    names = sorted((gvar.name_hint for gvar, func in lowered.functions.items() if isinstance(func, relax.Function)), key=_function_order)
    built_names = {gvar.name_hint for gvar in built.get_global_vars()}
    files, summary = {}, []
    for number, name in enumerate(names):
        func = lowered[name]
        backend = str(func.attrs[BACKEND_ATTR]) if func.attrs is not None and BACKEND_ATTR in func.attrs else ""
        calls = calls_of(built[name] if name in built_names else None, built)
        member = _member_name(number, name)
        about = f"a partition placed on {backend} (pattern {pattern_of(func)})" if backend else "the entry function"
        lines = [f"# {name}: {about}"]
        lines += [f"# {CALL_KINDS[kind]} it calls: {', '.join(found) or 'none'}" for kind, found in calls.items()]
        if name == "main" and replays_cuda_graphs:
            lines.append("# built to replay the partitions' kernels and library calls as CUDA graphs (partitions inlined)")
        lines += ["", "# as lowered by its backend:", func.script(name=name)]
        for tir_name in calls["tir_functions"]:
            lines += ["", f"# TIR function {tir_name}, as TVM compiles it:", built[tir_name].script(name=tir_name)]
        files[member] = ("\n".join(lines) + "\n").encode()
        summary.append({"function": name, "backend": backend, "pattern": pattern_of(func), "member": member, **calls})
    return files, summary


def _write_tar(path: Path, files: dict[str, bytes]) -> None:
    directories = sorted(
        {name.rsplit("/", 1)[0] + "/" for name in files if "/" in name}
        | {"/".join(name.split("/")[:depth]) + "/" for name in files for depth in range(1, name.count("/"))}
    )
    partial = path.with_name(path.name + ".writing")
    try:
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            for name in directories + sorted(files):
                info = tarfile.TarInfo(name.rstrip("/") if name.endswith("/") else name)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = _epoch()
                if name.endswith("/"):
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
                else:
                    info.mode, info.size = 0o644, len(files[name])
                    archive.addfile(info, io.BytesIO(files[name]))
        partial.replace(path)
    except BaseException as error:  # a full disk, an interrupt: no half-written tar is left
        partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise CollageError(f"{path}: writing it failed ({error.strerror or error}); nothing of it was left") from None
        raise


@attrs.frozen
class _Placed:
    """What an export builds: the placements (one, or one per shape), the module holding them, its entry
    functions (the largest shape's last) and, for several shapes, the dispatcher's record."""

    name: str
    placements: list
    partitioned: Any
    entries: list
    placement_json: dict
    dispatch: Any = None
    # The model's own names of its outputs, in order (an ONNX graph's, a PyTorch module's ``output['logits']``).
    output_names: tuple = ()


def _placed(optimized) -> _Placed:
    if isinstance(optimized, ProfiledModel):
        dispatch = optimized.dispatch
        order = dispatch.smallest_first()
        return _Placed(
            optimized.name,
            [shape.placement for shape in optimized.shapes],
            merged_module([shape.partitioned_mod for shape in optimized.shapes]),
            [dispatch.functions[i] for i in order],
            optimized.placements_json(),
            dispatch,
            optimized.shapes[0].model.output_names,
        )
    placement = optimized.placement
    return _Placed(
        placement.model_name,
        [placement],
        optimized.partitioned_mod,
        ["main"],
        placement.to_json(),
        output_names=optimized.model.output_names,
    )


def export_mlf(
    optimized, path: os.PathLike, pm=None, cuda_graphs: bool = True, check_inputs: Optional[Sequence[np.ndarray]] = None
) -> Path:
    """Write ``optimized`` (an ``OptimizedModel``, or a ``ProfiledModel``: every shape's placement in one library,
    an entry function per shape, the shapes in the executor configuration) to ``path`` in Model Library Format;
    the path.
    On a CUDA target the library replays CUDA graphs unless ``cuda_graphs`` is off, as ``optimize`` builds it.

    With ``check_inputs``, the tar is loaded in a new process and run once on them before it takes
    its name (:func:`check_in_new_process`); one that fails is left as ``<path>.partial``, nothing is
    left at ``path`` (an earlier export there is removed), and :class:`MLFError` says why in one line.
    """
    path = Path(path)
    refuse_special_file(path)  # before anything is built, and before an earlier export there would be removed
    if path.is_dir():
        raise MLFError(f"{path}: is a folder; name the tar to write (model.tar); nothing was built")
    pm = pm or get_plugin_manager()
    placed = _placed(optimized)
    placement = placed.placements[0]
    used = sorted({p.backend for placement in placed.placements for p in placement.partitions})
    installed = {name: info.backend for name, info in discover_backends(pm).items()}
    missing = [name for name in used if name not in installed]
    if missing:
        raise MLFError(f"{path}: cannot build the placement here, backend(s) not installed: {', '.join(missing)}")
    backends = {name: installed[name] for name in used}
    partitioned = placed.partitioned
    with tempfile.TemporaryDirectory(prefix="collage-mlf-") as scratch:
        executable = build(pm, partitioned, backends, optimized.target, cuda_graphs=cuda_graphs)
        objects = tvm_compat.host_objects(executable, optimized.target, scratch)
    lowered_files, lowered = _lowered(pm, partitioned, backends, optimized.target, cuda_graphs and tvm_compat.is_cuda(optimized.target))
    name = placed.name
    entries = [
        {
            "function": entry,
            "inputs": _io(partitioned[entry].params),
            "outputs": _named(_io(_output_vars(partitioned[entry])), placed.output_names),
        }
        for entry in placed.entries
    ]
    files: dict[str, bytes] = {OBJECTS_DIR + object_name: data for object_name, data in objects.items()}
    parameters = _parameters(partitioned)
    files[_parameters_member(name)] = tvm_compat.save_params(parameters)
    files[RELAX_TEXT] = partitioned.script(show_meta=False).encode()
    files.update(lowered_files)
    runtime = backend_needs(backends.values(), used)
    for backend_name, paths in runtime_libraries(pm, backends.values()).items():
        members = [f"{RUNTIME_DIR}{backend_name}/{Path(source).name}" for source in paths]
        files.update((member, Path(source).read_bytes()) for member, source in zip(members, paths))
        runtime[backend_name]["carried"] = members
    config = {
        "executor": EXECUTOR,
        "entry": entries[-1]["function"],
        "inputs": entries[-1]["inputs"],
        "outputs": entries[-1]["outputs"],
        "device": placement.device,
        "runtime_backends": runtime,
        "parameters_embedded": True,
        # Integer inputs that index a table (token ids): the range of each, which load_mlf's run checks
        "input_ranges": [limit.to_json() for limit in optimized.index_ranges],
    }
    if placed.dispatch is not None:  # the largest shape is the entry above; the loader chooses by each call's shapes
        config.update(entries=entries, shape_profiles=placed.dispatch.to_json())
    files[EXECUTOR_CONFIG] = _json_bytes(config)
    files[PLACEMENT] = _json_bytes(placed.placement_json)
    per_backend: dict[str, dict] = {}
    for part in (part for placement in placed.placements for part in placement.partitions):
        entry = per_backend.setdefault(part.backend, {"partitions": 0, "operators": 0})
        entry["partitions"] += 1
        entry["operators"] += len(part.nodes)
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "layout": "TVM Model Library Format (version 7 layout), adapted to Relax executables",
        "model_name": name,
        "export_datetime": _export_time(),
        "target": {"host": placement.target},
        "executor": EXECUTOR,
        "memory": {**memory_map(partitioned), "parameter_bytes": sum(array.nbytes for array in parameters.values())},
        "placement": {
            "search": placement.search,
            "backends": per_backend,
            "summed_cost_s": sum(placement.to_json()["summed_cost_s"] or 0.0 for placement in placed.placements),
        },
        "lowered": lowered,
        "files": {member: hashlib.sha256(data).hexdigest() for member, data in sorted(files.items())},
        "sizes": {member: len(data) for member, data in sorted(files.items())},
    }
    files["metadata.json"] = _json_bytes(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    if check_inputs is None:
        _write_tar(path, files)
        return path
    partial = path.with_name(path.name + ".partial")
    _write_tar(partial, files)
    try:
        check_in_new_process(partial, check_inputs)
    except MLFError as error:
        path.unlink(missing_ok=True)  # an earlier export must not pass for this one
        problem = str(error).removeprefix(f"{partial}: ")
        raise MLFError(f"{path}: the exported tar does not load and run in a new process: {problem} (left as {partial.name})") from None
    except BaseException:  # interrupted while the tar is checked: nothing half-done is left beside the earlier export
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return path
