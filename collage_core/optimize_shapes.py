"""Optimizing a model with symbolic dimensions for several shapes (``optimize(..., shapes=...)``).

Each shape profile is optimized as a model of its own (a static copy of the file, placed by the single-shape
pipeline into ``shape-K/`` of the output folder); costs go to the same cost database, so a candidate the
shapes share is measured once. Each engine's own session (a contender of each shape's run) runs the file as given,
its dimensions symbolic, as its users run it: the library then holds one copy of the file for every shape. The profiles' placements are then built into one library with a dispatcher
(:mod:`collage_core.build.profiles`), whose every profile is verified against the reference, a shape between
them too (padded, where the padding rule allows it), and timed in turns beside that shape's own library.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.build import deploy
from collage_core.build.profiles import entry_function, merged_module, write_profiles_runtime_file
from collage_core.errors import CollageError, reraise_interrupt
from collage_core.measure import remote as remote_servers
from collage_core.measure.arrays_file import load_arrays
from collage_core.measure.in_turns import time_in_turns
from collage_core.measure.progress import PhaseClock
from collage_core.measure.worker_client import MeasurementWorker, WorkerFailure
from collage_core.model.model_import import load_model, onnx_reference
from collage_core.model.original_model import ONNX, OriginalModel
from collage_core.model.padding import padding_rule, probe_inputs
from collage_core.model.shape_profiles import (
    ShapeProfile,
    ShapeProfileError,
    onnx_model_with_shapes,
    parse_shapes,
    static_onnx,
    symbolic_inputs,
)
from collage_core.model.verify import DEFAULT_ATOL, DEFAULT_RTOL, compare_outputs
from collage_core.options import OptimizeOptions
from collage_core.outputs import output_folder
from collage_core.outputs.dispatch import ShapeDispatch
from collage_core.outputs.placement_file import PlacementFileError, load_shape_placements
from collage_core.outputs.profiled_result import ProfiledModel, ShapeCheck, kept_profiles, shown_ms
from collage_core.plugins import disabled_plugin_names, get_plugin_manager

# How long building the library of every shape, or one run of it, may take in its worker.
WORKER_LIMIT_S = 3600.0


def optimize_for_shapes(model: Any, options: OptimizeOptions, optimize_one: Callable, say: Callable[[str], None]) -> ProfiledModel:
    """``model`` (an ONNX file or ``onnx.ModelProto`` with symbolic dimensions) optimized for each shape
    ``options.shapes`` lists, by ``optimize_one`` (``collage_core.optimize``), into one library."""
    proto, data, name = onnx_model_with_shapes(model)
    inputs = symbolic_inputs(proto)
    placements = None
    if options.placement is not None:  # a replay: the shapes and their placements as the file has them
        profiles, placements = _replayed(options.placement, inputs)
    else:
        profiles = parse_shapes(options.shapes, inputs)
    reference = onnx_reference(data, inputs)  # on the file as given, its symbolic dimensions free
    clock = PhaseClock()
    say(f"{name}: optimizing for {len(profiles)} shapes: {'; '.join(p.label for p in profiles)}")
    padding = padding_rule(proto, inputs, profiles, reference)
    say(f"padding: {padding.describe()}")
    clock.lap("checking the padding rule")
    dispatch = ShapeDispatch(tuple(inputs), tuple(profiles), tuple(entry_function(i) for i in range(len(profiles))), padding)
    original = OriginalModel.from_bytes(ONNX, data)
    with output_folder.for_run(options.output_dir) as folder:
        results = []
        for index, profile in enumerate(profiles):
            say(f"shape {index + 1} of {len(profiles)}: {profile.label}")
            static = folder.scratch / f"shape-{index + 1}" / f"{output_folder.safe_file_name(name)}.onnx"
            static.parent.mkdir(parents=True, exist_ok=True)
            output_folder.write_bytes(static, static_onnx(proto, profile).SerializeToString())
            one = attrs.evolve(options, shapes=None, output_dir=folder.path / f"shape-{index + 1}")
            if placements is not None:
                replayed = static.parent / "placement.json"
                placements[index].save(replayed)
                one = attrs.evolve(one, placement=replayed)
            # Engines' own sessions run the file as given, symbolic dimensions and all, as its users run it: one copy
            # of it serves every shape in the library (constants are pooled by value).
            shaped = attrs.evolve(load_model(static), original=original)
            results.append(optimize_one(shaped, options=one))
        clock.lap("optimizing each shape")
        library = output_folder.library_file(folder.path, name)
        say(f"building the {len(profiles)} placements into one library: {library.name}")
        pm = get_plugin_manager()
        target = results[0].target
        with MeasurementWorker(pm.module_plugin_names(), sorted(disabled_plugin_names())) as worker:
            module = folder.scratch / "profiles.json"
            output_folder.write_text(module, tvm_compat.save_ir_json(merged_module([result.partitioned_mod for result in results])))
            request = {"op": "build_library", "module": str(module), "target": tvm_compat.target_to_json(target)}
            built = folder.scratch / "library" / library.name  # moved into the folder once checked, with the rest
            built.parent.mkdir(parents=True, exist_ok=True)
            request.update(library=str(built), cuda_graphs=options.settings.cuda_graphs)
            _asked(worker, request, "building the library of every shape")
            write_profiles_runtime_file(built, [result.library_path for result in results], dispatch)
            clock.lap("building one library")
            timed = options.compares_backends()
            remote = _servers(options, built, target)
            checks = _checked(worker, built, target, dispatch, results, reference, say, folder.scratch, timed, remote)
        clock.lap("checking the library")
        deploy.copy_library(built, library, move=True)
        profiled = ProfiledModel(name, dispatch, tuple(results), library, target, tuple(checks), phases_s=clock.phases_s)
        for check in checks:
            if not check.verification.passed:
                say(f"numerics FAILED at {check.label}: {check.verification.describe()}")
        return kept_profiles(profiled, folder.kept, folder.path, model if isinstance(model, (str, os.PathLike)) else None)


def recorded_shapes(placements_file) -> str:
    """The shapes a placements file of several shapes holds, listed by input (as a replay of a PyTorch module
    exports it again)."""
    shapes, _ = load_shape_placements(placements_file)
    profiles = ShapeDispatch.from_json(shapes, str(placements_file)).profiles
    names = [name for name, _ in profiles[0].shapes]
    return " ".join(f"{name}=" + ",".join("x".join(map(str, p.shape_of(name))) for p in profiles) for name in names)


def _replayed(path, inputs) -> tuple[list[ShapeProfile], list]:
    """The shapes and placements of a placements file, checked against the model's inputs."""
    shapes, placements = load_shape_placements(path)
    recorded = ShapeDispatch.from_json(shapes, str(path))
    if [(spec.name, spec.dims) for spec in recorded.inputs] != [(spec.name, spec.dims) for spec in inputs]:
        made = ", ".join(f"{spec.name} {spec.shown()}" for spec in recorded.inputs)
        given = ", ".join(f"{spec.name} {spec.shown()}" for spec in inputs)
        raise PlacementFileError(f"{path}: made for inputs {made}; this model's are {given}")
    return list(recorded.profiles), placements


def between(dispatch: ShapeDispatch) -> ShapeProfile | None:
    """A shape no profile lists that the library serves padded: the largest profile with each dimension the
    padding rule allows halfway down to the next size listed (None when no dimension may be padded)."""
    allowed = [dim for dim, _ in dispatch.padding.allowed]
    if not allowed:
        return None
    largest = max(dispatch.profiles, key=lambda p: (p.elements(), p.label))
    sizes = dict(largest.sizes)
    for dim in allowed:
        below = [p.size_of(dim) for p in dispatch.profiles if p.size_of(dim) < sizes[dim]]
        sizes[dim] = (max(below, default=0) + sizes[dim] + 1) // 2 if sizes[dim] > 1 else 1
    if any(dict(p.sizes) == sizes for p in dispatch.profiles):
        return None
    return ShapeProfile(tuple(sizes.items()), tuple((spec.name, spec.bound(sizes)) for spec in dispatch.inputs))


def _servers(options: OptimizeOptions, library: Path, target) -> dict | None:
    """With ``--rpc-tracker``: what a worker needs to run the one library on a server (the tracker, the key and the
    native libraries the library's runtime file carries); None: here."""
    if options.rpc_tracker is None:
        return None
    host, port = remote_servers.parse_tracker(options.rpc_tracker)
    _, carried = deploy.needs_and_carried(library, deploy.read_runtime_file(library))
    return remote_servers.RemoteServers(host, port, options.rpc_key, target).request([path for paths in carried.values() for path in paths])


def _checked(
    worker, library: Path, target, dispatch: ShapeDispatch, results, reference, say, scratch: Path, timed: bool, remote=None
) -> list[ShapeCheck]:
    """Each profile run from the one library (in ``worker``) against the reference and, when ``timed`` (the runs
    compare with baselines), timed in turns beside its own library; then a shape between them, padded."""
    checks = []
    for index, (profile, result) in enumerate(zip(dispatch.profiles, results)):
        arrays = result.model.random_inputs()
        outputs = _run_in(worker, library, target, dispatch, arrays, scratch, remote)
        verification = compare_outputs(outputs, reference(arrays), "onnxruntime", *_tolerance(result))
        in_library_s, alone_s = _in_turns(worker, library, result, index, arrays, target, say, scratch, remote) if timed else (None, None)
        checks.append(ShapeCheck(profile.label, index, False, verification, in_library_s, alone_s))
        timing = f"; in turns: in the library {shown_ms(in_library_s)}, alone {shown_ms(alone_s)}" if timed else ""
        say(f"  {profile.label}: {verification.describe()}{timing}")
    middle = between(dispatch)
    if middle is not None:
        arrays = probe_inputs(dispatch.inputs, [shape for _, shape in middle.shapes], seed=1)
        choice = dispatch.choose([a.shape for a in arrays])
        tolerance = results[choice.index].verification  # the shape it runs on, at the run's precision
        rtol, atol = (tolerance.rtol, tolerance.atol) if tolerance is not None else (1e-3, 1e-4)
        verification = compare_outputs(
            _run_in(worker, library, target, dispatch, arrays, scratch, remote), reference(arrays), "onnxruntime", rtol, atol
        )
        checks.append(ShapeCheck(middle.label, choice.index, True, verification))
        say(f"  {middle.label} (padded to {dispatch.profiles[choice.index].label}): {verification.describe()}")
    return checks


def _tolerance(result) -> tuple[float, float]:
    """The (rtol, atol) a shape's own run was verified with, or the fp32 defaults when it was not verified."""
    checked = result.verification
    return (checked.rtol, checked.atol) if checked is not None else (DEFAULT_RTOL, DEFAULT_ATOL)


def _run_in(worker, library: Path, target, dispatch: ShapeDispatch, arrays, scratch: Path, remote=None) -> list[np.ndarray]:
    """The library's outputs for ``arrays``, run in ``worker`` (on a server, with ``remote``) through the dispatcher."""
    choice = dispatch.choose([np.shape(a) for a in arrays])
    inputs, outputs = scratch / "check-inputs.npz", scratch / "check-outputs.npz"
    np.savez(inputs, *dispatch.arguments(choice, arrays))
    request = {"op": "run_library", "library": str(library), "function": choice.function, "inputs": str(inputs)}
    request.update(outputs=str(outputs), target=tvm_compat.target_to_json(target))
    if remote is not None:
        request["remote"] = remote
    _asked(worker, request, f"running {choice.function}")
    return dispatch.outputs(choice, load_arrays(outputs))


def _asked(worker, request: dict, what: str) -> dict:
    try:
        return worker.request(request, WORKER_LIMIT_S)
    except WorkerFailure as failure:
        raise ShapeProfileError(f"{what} failed: {failure}") from None


def _in_turns(worker, library: Path, result, index: int, arrays, target, say, scratch: Path, remote=None):
    inputs = scratch / f"turns-{index + 1}.npz"
    np.savez(inputs, *arrays)
    try:
        turns = time_in_turns(
            {"library": library, "alone": result.library_path},
            inputs,
            tvm_compat.target_to_json(target),
            worker.plugin_modules,
            worker.disabled,
            functions={"library": entry_function(index)},
            remote=remote,
        )
    except (CollageError, WorkerFailure) as error:
        reraise_interrupt(error)
        say(f"  timing shape {index + 1} in turns failed: {error}")
        return None, None
    return turns["library"].warm.median_s, turns["alone"].warm.median_s
