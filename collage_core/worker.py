"""The measurement worker: a process that builds and times what it is sent, and nothing else.

It reads one JSON request per line on stdin and answers one JSON line on its own copy of
stdout, after ``{"progress": stage}`` lines for the stages a request passes (a placement
``built``, ``set up`` after a first run that pays one-time setup, then ``ran once``) so the parent can bound each; whatever libraries print goes to stderr. Its parent kills and replaces it when it
crashes or hangs, so a broken backend costs one candidate, not the run.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    state: dict = {}

    def progress(stage: str) -> None:  # tells the parent a stage is done, so it can time the next one
        protocol.write(json.dumps({"progress": stage}) + "\n")
        protocol.flush()

    state["progress"] = progress
    for line in sys.stdin:
        request = json.loads(line)
        try:
            response = HANDLERS[request["op"]](state, request)
        except Exception as error:  # reported to the parent, which records it with the candidate
            lines = [text for text in str(error).strip().splitlines() if text.strip()]
            response = {"error": f"{type(error).__name__}: {lines[-1] if lines else ''}"}
        protocol.write(json.dumps(response) + "\n")
        protocol.flush()


def _init(state, request):
    from collage_core.backends import discover_backends
    from collage_core.plugins import get_plugin_manager

    pm = get_plugin_manager(disabled=request["disabled"], extra_modules=request["plugins"])
    state["pm"] = pm
    state["backends"] = {name: info.backend for name, info in discover_backends(pm).items()}
    return {"ok": True, "pid": os.getpid()}


def _load(request):
    from collage_core import tvm_compat

    with open(request["module"]) as file:
        mod = tvm_compat.load_ir_json(file.read())
    return mod, tvm_compat.make_target(request["target"])


def _measure_candidate(state, request):
    from collage_core.records import Candidate, Cost
    from collage_core.relax_graph import RelaxGraph
    from collage_core.timing import MeasureSettings
    from collage_core.partition import partition_module
    from collage_core.plugins import first_result

    mod, target = _load(request)
    backend = state["backends"][request["backend"]]
    settings = MeasureSettings.from_json(request["settings"])
    cost, errors = first_result(
        state["pm"].hook.collage_measure_candidate, backend=backend, mod=mod, target=target, settings=settings
    )
    if cost is None and errors:
        return {"cost": Cost.invalid("; ".join(errors)).to_json()}
    if cost is None:
        graph = RelaxGraph.from_function(mod["main"], mod)
        whole = Candidate(backend.name, request["pattern"], range(len(graph.graph)), key="")
        placed = partition_module(graph, [whole])
        executable, _ = _build(state, placed, target)
        cost = _time(executable, placed, target, settings)
    if not isinstance(cost, Cost):
        raise TypeError(f"collage_measure_candidate returned {cost!r}, not a Cost")
    return {"cost": cost.to_json()}


def _build(state, mod, target):
    from collage_core.build import build

    started = time.perf_counter()
    executable = build(state["pm"], mod, state["backends"], target)
    return executable, time.perf_counter() - started


def _vm(executable, target):
    from tvm import relax

    from collage_core import tvm_compat

    device = tvm_compat.device_for(target)
    return relax.VirtualMachine(executable, device), device


def _time(executable, mod, target, settings, args=None):
    from collage_core import tvm_compat
    from collage_core.timing import time_callable

    vm, device = _vm(executable, target)
    if args is None:
        args = [tvm_compat.to_tensor(a, device) for a in _random_arguments(mod["main"])]

    def run(number):
        return vm.time_evaluator("main", device, number=number, repeat=1)(*args).mean

    return time_callable(run, settings)


def _random_arguments(func) -> list[np.ndarray]:
    from collage_core import tvm_compat

    rng = np.random.default_rng(0)
    arrays = []
    for param in func.params:
        shape, dtype = tvm_compat.tensor_shape_dtype(param)
        if dtype.startswith(("int", "uint", "bool")):
            arrays.append(np.zeros(shape, dtype=dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
    return arrays


def _run_placement(state, request):
    """Build a placed module, run it on given inputs, time it, and optionally export the library."""
    from collage_core import tvm_compat
    from collage_core.records import Cost
    from collage_core.timing import MeasureSettings

    mod, target = _load(request)
    executable, build_s = _build(state, mod, target)
    vm, device = _vm(executable, target)
    with np.load(request["inputs"], allow_pickle=False) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    args = [tvm_compat.to_tensor(a, device) for a in arrays]
    state["progress"]("built")
    # The first run pays one-time setup (ONNX Runtime creates its sessions then) and says nothing
    # about a run's cost; the run after it is the one judged and kept.
    vm["main"](*args)
    state["progress"]("set up")
    started = time.perf_counter()
    result = vm["main"](*args)
    outputs = [tvm_compat.to_numpy(o) for o in (result if _is_sequence(result) else [result])]
    first_run_s = time.perf_counter() - started
    state["progress"]("ran once")
    np.savez(request["outputs"], *outputs)
    cost = None
    if request.get("settings"):
        settings = MeasureSettings.from_json(request["settings"])
        if first_run_s > settings.single_run_s:
            cost = Cost.measured(first_run_s, 0.0, 1).to_json()
        else:
            cost = _time(executable, mod, target, settings, args).to_json()
    if request.get("library"):
        executable.export_library(request["library"])
    return {"cost": cost, "build_s": build_s}


def _load_library(state, request):
    """Load an exported library and its inputs and run it once; ``time_turn`` then times it."""
    from collage_core import tvm_compat
    from collage_core.deploy import load_vm

    device = tvm_compat.device_for(tvm_compat.make_target(request["target"]))
    function = load_vm(request["library"], device, pm=state["pm"])["main"]
    with np.load(request["inputs"], allow_pickle=False) as saved:
        args = [tvm_compat.to_tensor(saved[f"arr_{i}"], device) for i in range(len(saved.files))]

    def run():
        function(*args)
        device.sync()

    run()
    started = time.perf_counter()
    run()
    state["turn"] = run
    return {"once_s": time.perf_counter() - started}


def _time_turn(state, request):
    """Run the loaded library ``count`` times; the seconds of each run."""
    run, samples = state["turn"], []
    for _ in range(int(request["count"])):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return {"samples_s": samples}


def _is_sequence(value) -> bool:
    return not hasattr(value, "numpy") and hasattr(value, "__len__")


HANDLERS = {
    "init": _init,
    "measure_candidate": _measure_candidate,
    "run_placement": _run_placement,
    "load_library": _load_library,
    "time_turn": _time_turn,
}

if __name__ == "__main__":
    main()
