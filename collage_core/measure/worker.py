"""The measurement worker: a process that builds and times what it is sent, and nothing else.

It reads one JSON request per line on stdin and answers one JSON line on its own copy of
stdout, after ``{"progress": stage}`` lines for the stages a request passes (a placement
``built``, ``set up`` after a first run that pays one-time setup, then ``ran once``) so the parent can bound each; whatever libraries print goes to stderr. Its parent kills and replaces it when it
crashes or hangs, so a broken backend costs one candidate, not the run.

A worker ends with the run it serves: should the run die without closing its stdin (SIGKILL, while
the worker is busy building or timing), a watch thread sees the run's process gone within
RUN_WATCH_S and ends the worker, so no worker outlives its run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import registered_backends
from collage_core.build.deploy import backend_needs, load_vm, write_runtime_file
from collage_core.build.executable import build
from collage_core.build.partition import partition_module, placed_whole
from collage_core.measure.arrays_file import load_arrays
from collage_core.measure.cost_db import TRANSIENT_REASON
from collage_core.measure.processor_wait import waiting
from collage_core.measure.timing import MeasureSettings, time_callable
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.widening import widen
from collage_core.outputs.output_folder import export_library
from collage_core.plugins import first_result, get_plugin_manager
from collage_core.records import Candidate, Cost

# A placement's run from Python shorter than this is judged again by TVM's own timer before the
# cut-off sees it: a call from Python pays what the timed repeats do not (on an H200, BERT-base b1 at
# fp16 ran in 0.745 ms timed and 1.25-1.32 ms as one call from Python, so calibration cut every
# placement after the first off on that one call). Longer runs are judged as they ran: a second run
# of seconds costs more than the call's overhead could mislead.
REJUDGE_BELOW_S = 0.05
# How often a worker looks whether the run it serves is still there.
RUN_WATCH_S = 1.0
# The exit status of a worker whose run went away.
EXIT_RUN_GONE = 3


def main(state: dict | None = None, run_pid: Optional[int] = None) -> None:
    """Serve requests until stdin closes; ``state`` is what an ``init`` request left (a zygote's
    forked child starts with its parent's). ``run_pid`` is the run's process (default: the parent);
    the worker ends when it is gone."""
    end_with(os.getppid() if run_pid is None else run_pid)
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    state = {} if state is None else state

    def progress(stage: str) -> None:  # tells the parent a stage is done, so it can time the next one
        protocol.write(json.dumps({"progress": stage}) + "\n")
        protocol.flush()

    state["progress"] = progress
    for line in _requests():
        request = json.loads(line)
        try:
            response = HANDLERS[request["op"]](state, request)
        except Exception as error:  # reported to the parent, which records it with the candidate
            response = {"error": describe_failure(error)}
        protocol.write(json.dumps(response) + "\n")
        protocol.flush()


def _requests() -> Iterator[bytes]:
    """The request lines on stdin, read from its descriptor with ``os.read``; stdin itself then reads
    /dev/null. Waiting in ``sys.stdin`` would hold its buffer's lock, and a process a library forks
    meanwhile from another thread (OpenVINO's telemetry does, on import) would wait for that lock
    for ever as it closes its stdin, outliving the worker."""
    descriptor = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", closefd=False)
    pending = b""
    while True:
        chunk = os.read(descriptor, 1 << 16)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending
    os.close(descriptor)


def process_start(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, from /proc), or None when there is no such
    process (or no /proc): with the pid, it names one process, whose pid may later be reused."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def end_with(pid: int) -> None:
    """End this process (status EXIT_RUN_GONE) once process ``pid`` is gone; not watched without /proc."""
    started = process_start(pid)
    if started is None:
        return

    def watch() -> None:
        while process_start(pid) == started:
            time.sleep(RUN_WATCH_S)
        os._exit(EXIT_RUN_GONE)

    threading.Thread(target=watch, name="collage-run-watch", daemon=True).start()


# What CUDA's runtime (through TVM or PyTorch), cuBLAS and cuDNN say when device memory runs out.
OUT_OF_GPU_MEMORY_REASON = "out of GPU memory"
OUT_OF_GPU_MEMORY = (
    "CUDA: out of memory",
    "CUDA out of memory",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "STATUS_ALLOC_FAILED",
)


# What a full disk says (Python's OSError, and a compiler or linker it ran): the machine's doing, not the candidate's.
DISK_FULL = "No space left on device"


def describe_failure(error: Exception) -> str:
    """One line for a failed request: the error's type and last line, marked when the GPU ran out of memory or
    the disk was full."""
    lines = [text for text in str(error).strip().splitlines() if text.strip()]
    return _marked(f"{type(error).__name__}: {lines[-1] if lines else ''}", str(error))


def _marked(reason: str, text: str) -> str:
    """``reason``, prefixed with ``out of GPU memory`` when ``text`` (the whole error) says so, or marked a
    transient failure (measured again by a later run: see cost_db.TRANSIENT_REASON) when the disk was full."""
    if any(marker in text for marker in OUT_OF_GPU_MEMORY):
        return f"{OUT_OF_GPU_MEMORY_REASON} ({reason})"
    if DISK_FULL in text:
        return f"{TRANSIENT_REASON}: the disk is full ({DISK_FULL.lower()}; {reason})"
    return reason


def _init(state, request):
    pm = get_plugin_manager(disabled=request["disabled"], extra_modules=request["plugins"])
    state["pm"] = pm
    state["backends"] = registered_backends(pm)
    return {"ok": True, "pid": os.getpid()}


def _load(request):
    with open(request["module"]) as file:
        mod = tvm_compat.load_ir_json(file.read())
    return mod, tvm_compat.make_target(request["target"])


def _measure_candidate(state, request):
    """Build a candidate placed whole on its backend and time it (the backend may measure it itself)."""
    mod, target = _load(request)
    settings = MeasureSettings.from_json(request["settings"])
    cost = _own_measurement(state, request["backend"], mod, target, settings)
    if cost is None:
        placed = placed_whole(mod, request["backend"], request["pattern"])
        executable, _ = _build(state, placed, target)
        cost = _net_of_call(_time(executable, placed, target, settings), _call_overhead_s(state, target, settings))
    return {"cost": cost.to_json()}


# A candidate's cost net of the VM call is kept at no less than this share of what was timed.
NET_FLOOR = 0.1


def _call_overhead_s(state, target, settings) -> float:
    """Seconds the VM takes to call a ``main`` that runs nothing (it returns its argument), timed as
    candidates are, once per worker process and target.

    A candidate timed alone pays for entering and leaving the VM (argument checks, the evaluator's
    call) on top of its kernels; inside a placement that is paid once for the whole model, so it is
    taken off every candidate's cost. On CPUs it is well under a microsecond, so it moves little
    there; what a whole placement pays beyond its candidates (or less than them) is left to
    calibration's per-partition charge (see :mod:`collage_core.search.calibration`).
    """

    cache = state.setdefault("call_overhead_s", {})
    key = tvm_compat.target_to_json(target)
    if key not in cache:
        param = relax.Var("x", relax.TensorType((1,), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [param]):
            bb.emit_func_output(param)
        vm, device = _vm(relax.build(bb.get(), target), target)
        cache[key] = _time_vm(vm, device, None, settings, [tvm_compat.to_tensor(np.zeros(1, "float32"), device)]).median_s
    return cache[key]


def _net_of_call(cost, overhead_s: float):
    """``cost`` less the VM's call overhead (see :func:`_call_overhead_s`), never below NET_FLOOR of it."""
    if not cost.is_measured:
        return cost
    return Cost.measured(max(cost.median_s - overhead_s, NET_FLOOR * cost.median_s), cost.spread_s, cost.repeats, cost.held_up_share)


# A plugin's own measurement shorter than this is not judged held up.
OWN_MEASUREMENT_JUDGED_S = 0.01


def _own_measurement(state, backend_name: str, mod, target, settings):
    """The cost a plugin's ``collage_measure_candidate`` gives (invalid if every one raised), or None; marked held
    up when this process's threads waited for a processor while the plugin measured (see ``time_callable``)."""
    # A plugin that answers at once (a cost it knew) timed nothing to judge.
    with waiting(min_wall_s=OWN_MEASUREMENT_JUDGED_S) as waited:
        cost, errors = first_result(
            state["pm"].hook.collage_measure_candidate, backend=state["backends"][backend_name], mod=mod, target=target, settings=settings
        )
    if isinstance(cost, Cost) and waited.held_up:
        cost = cost.with_held_up_share(waited.share)
    if cost is None and errors:
        reason = "; ".join(errors)
        return Cost.invalid(_marked(reason, reason))
    if cost is not None and not isinstance(cost, Cost):
        raise TypeError(f"collage_measure_candidate returned {cost!r}, not a Cost")
    return cost


def _build_candidate(state, request):
    """Build a candidate placed whole on its backend and export it to ``library``; nothing runs.

    Candidates built this way, several workers at once, are timed one by one afterwards
    (``time_candidate``), so that no build disturbs a timing.
    """
    mod, target = _load(request)
    backend = state["backends"][request["backend"]]
    executable, build_s = _build(state, placed_whole(mod, backend.name, request["pattern"]), target)
    export_library(executable, request["library"])
    write_runtime_file(request["library"], backend_needs([backend], [backend.name]))
    return {"build_s": build_s}


def _time_candidate(state, request):
    """Time a candidate's library built by ``build_candidate``; a backend that measures its own
    candidates (``collage_measure_candidate``) is asked first, as in ``measure_candidate``."""
    mod, target = _load(request)
    settings = MeasureSettings.from_json(request["settings"])
    cost = _own_measurement(state, request["backend"], mod, target, settings)
    if cost is None:
        device = tvm_compat.device_for(target)
        cost = _time_vm(load_vm(request["library"], device, pm=state["pm"]), device, mod, settings)
        cost = _net_of_call(cost, _call_overhead_s(state, target, settings))
    return {"cost": cost.to_json()}


def _build(state, mod, target, cuda_graphs: bool = False):
    started = time.perf_counter()
    executable = build(state["pm"], mod, state["backends"], target, cuda_graphs=cuda_graphs)
    return executable, time.perf_counter() - started


def _vm(executable, target):

    device = tvm_compat.device_for(target)
    return relax.VirtualMachine(executable, device), device


def _time(executable, mod, target, settings, args=None):
    vm, device = _vm(executable, target)
    return _time_vm(vm, device, mod, settings, args)


def _time_vm(vm, device, mod, settings, args=None, warm_run_s=None, judge_waiting=True):
    """``vm``'s main timed on ``args`` (default: seeded random arguments of ``mod``'s main); with
    ``warm_run_s``, ``vm`` is warm and one run took that long; ``judge_waiting``, whether it runs in this
    process, whose waiting for a processor marks a cost held up (see ``time_callable``)."""
    if args is None:
        args = [tvm_compat.to_tensor(a, device) for a in random_arguments(mod["main"])]

    def run(number):
        return vm.time_evaluator("main", device, number=number, repeat=1)(*args).mean

    return time_callable(run, settings, warm_run_s, judge_waiting)


def _one_timed_run_s(vm, device, args) -> float:
    """One run of ``vm``'s main as TVM's timer measures it, with no Python inside the timed call."""
    return vm.time_evaluator("main", device, number=1, repeat=1)(*args).mean


def random_arguments(func) -> list[np.ndarray]:
    """Seeded arguments for ``func``: uniform floats in [-1, 1), zeros for integer and boolean tensors."""
    rng = np.random.default_rng(0)
    arrays = []
    for param in func.params:
        shape, dtype = tvm_compat.tensor_shape_dtype(param)
        if dtype.startswith(("int", "uint", "bool")):
            arrays.append(np.zeros(shape, dtype=dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
    return arrays


def _build_placement(state, request):
    """Build a placed module and export it to ``library`` for a later ``run_placement`` with ``prebuilt``; with
    ``inputs``, also run it once, untimed, so that what its backends compile at a first run (AOTInductor's packages)
    is in their caches when it is timed. Placements built this way, several workers at once, are timed one by one
    afterwards, so that no build runs while a placement is timed."""
    executable, target, build_s = _placement_built(state, request, MeasureSettings.from_json(request["settings"]))
    write_runtime_file(request["library"], backend_needs(state["backends"].values(), request["placed_on"]))
    if request.get("inputs"):
        vm, device = _vm(executable, target)
        _run_and_time(state, {**request, "timed": False}, vm, device, None)
    return {"build_s": build_s}


def _run_placement(state, request):
    """Build a placed module (or load the one ``build_placement`` exported to ``prebuilt``), run it on given inputs,
    time it, and optionally export the library."""
    settings = MeasureSettings.from_json(request["settings"]) if request.get("settings") else None
    if request.get("prebuilt"):
        target = tvm_compat.make_target(request["target"])
        device = tvm_compat.device_for(target)
        vm = load_vm(request["prebuilt"], device, pm=state["pm"])
        return {"cost": _run_and_time(state, request, vm, device, settings), "build_s": 0.0}
    executable, target, build_s = _placement_built(state, request, settings)
    if request.get("remote"):  # cross-compiled for another machine: run and timed there
        state["remote_target"] = tvm_compat.target_to_json(target)
        return _run_placement_remotely(state, request, settings, build_s)
    vm, device = _vm(executable, target)
    return {"cost": _run_and_time(state, request, vm, device, settings), "build_s": build_s}


def _placement_built(state, request, settings: Optional[MeasureSettings]):
    """The request's placement (sent as partitions of the held model, or as a module) built, and exported to its
    ``library`` when it names one; gives (executable, target, seconds the build took)."""
    mod, target = _held_placement(state, request) if "held" in request else _load(request)
    executable, build_s = _build(state, mod, target, cuda_graphs=(settings or MeasureSettings()).cuda_graphs)
    if request.get("library"):
        # Before any VM exists: making one fills the executable's memory-scope map with an entry per
        # constant, and a library exported after that prints TVM's "Scope Loaded" warning per constant on every load.
        export_library(executable, request["library"])
    return executable, target, build_s


def _run_and_time(state, request, vm, device, settings: Optional[MeasureSettings], here: bool = True) -> Optional[dict]:
    """Run ``vm``'s main on the request's inputs, keep its outputs, and time it (None: not timed); timed ``here``
    (not on a remote server), the cost is marked held up when other processes kept this one waiting for a processor."""
    arrays = load_arrays(request["inputs"])
    args = [tvm_compat.to_tensor(a, device) for a in arrays]
    state["progress"]("built")
    # The first run pays one-time setup (ONNX Runtime creates its sessions then) and says nothing
    # about a run's cost; the run after it is the one judged and kept. Untimed (``"timed": false``),
    # the first run's outputs are kept and nothing else runs.
    timed = request.get("timed", True)
    first = vm["main"](*args)
    state["progress"]("set up")
    started = time.perf_counter()
    result = vm["main"](*args) if timed else first
    device.sync()
    run_s = time.perf_counter() - started  # the run alone, for the timing below; with the copy out, for single_run_s
    outputs = [tvm_compat.to_numpy(o) for o in (result if _is_sequence(result) else [result])]
    first_run_s = time.perf_counter() - started
    state["progress"]("ran once")
    np.savez(request["outputs"], *outputs)
    if settings is None or not timed:
        return None
    if first_run_s > settings.single_run_s:
        return Cost.measured(first_run_s, 0.0, 1).to_json()
    # The VM is warm (two runs): timed as it is, with no warm-up of a VM of its own.
    judged_s = run_s if run_s >= REJUDGE_BELOW_S else _one_timed_run_s(vm, device, args)
    return _time_vm(vm, device, None, settings, args, warm_run_s=judged_s, judge_waiting=here).to_json()


def _held_placement(state, request):
    """The placement ``request["parts"]`` of the model the zygote held under ``request["held"]``, built
    from this process's inherited copy (see ``collage_core.measure.zygote.hold_model``)."""
    graph = state.get("held", {}).get(request["held"])
    if graph is None:
        raise LookupError(f"this worker does not hold model {request['held'][:12]}")
    if request.get("float32_units"):  # a variant: these units of the held 16-bit model widened first
        converted, original = state["widenable"][request["held"]]
        widened = widen(converted, request["float32_units"], original)
        graph = RelaxGraph.from_function(widened["main"], widened)
    parts = [Candidate(part["backend"], part["pattern"], part["nodes"], key="") for part in request["parts"]]
    return partition_module(graph, parts), tvm_compat.make_target(request["target"])


def _load_library(state, request):
    """Load an exported library and its inputs and run its entry function (``function``, default ``main``)
    ``warmup_runs`` times (default 1) and once more, timed; ``time_turn`` then times it by the request's ``name``
    (a worker may hold several). With ``remote``, the library is uploaded to a server and runs there, each run
    timed there by TVM's timer (no round trip inside a sample)."""
    if request.get("remote"):
        return _load_library_remotely(state, request)
    function, args, device = _library_function(state, request)

    def run():
        function(*args)
        device.sync()

    def runs(count: int) -> list[float]:
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
        return samples

    for _ in range(int(request.get("warmup_runs", 1))):
        run()
    (once_s,) = runs(1)
    state.setdefault("turns", {})[request.get("name")] = {"runs": runs, "last_run_end": time.perf_counter()}
    return {"once_s": once_s}


def _load_library_remotely(state, request):
    vm, device, args = _remote_library(state, request)
    function = request.get("function", "main")

    def runs(count: int) -> list[float]:
        evaluator = vm.time_evaluator(function, device, number=1, repeat=count)
        return [float(sample) for sample in evaluator(*args).results]

    def warm_then_once() -> float:
        warmup_runs = int(request.get("warmup_runs", 1))
        if warmup_runs > 0:
            runs(warmup_runs)
        return runs(1)[0]

    once_s = _guarded(state, warm_then_once)
    state.setdefault("turns", {})[request.get("name")] = {
        "runs": lambda count: _guarded(state, lambda: runs(count)),
        "last_run_end": time.perf_counter(),
    }
    return {"once_s": once_s, "server": _remote(state)["server"]}


def _library_function(state, request):
    """The request's ``library`` loaded on its target's device: its entry function ``function`` (default
    ``main``), the ``inputs`` (an ``.npz``) as tensors there, and the device."""
    device = tvm_compat.device_for(tvm_compat.make_target(request["target"]))
    function = load_vm(request["library"], device, pm=state["pm"])[request.get("function", "main")]
    return function, _saved_tensors(request["inputs"], device), device


def _saved_tensors(path, device) -> list:
    """The arrays of an ``.npz`` (``arr_0``, ``arr_1``, ...) as tensors on ``device``."""
    return [tvm_compat.to_tensor(array, device) for array in load_arrays(path)]


def _build_library(state, request):
    """Build a module (entry functions of its own, such as a library of shape profiles') and export it to
    ``library``; nothing runs."""
    mod, target = _load(request)
    executable, build_s = _build(state, mod, target, cuda_graphs=bool(request.get("cuda_graphs")))
    export_library(executable, request["library"])
    return {"build_s": build_s}


def _run_library(state, request):
    """Run an exported library's entry function ``function`` on the ``inputs`` (an ``.npz``), once, and save
    its outputs to ``outputs``; with ``remote``, on a server (the library cross-compiled for it)."""
    if request.get("remote"):
        function, args = _remote_library_function(state, request)
    else:
        function, args, _ = _library_function(state, request)
    result = function(*args)
    np.savez(request["outputs"], *[tvm_compat.to_numpy(o) for o in (result if _is_sequence(result) else [result])])
    return {}


def _time_turn(state, request):
    """Run the loaded library of the request's ``name`` ``count`` times; the seconds of each run. With ``pause_s``,
    the turn first waits until the library has been idle that long since its last run, and says how long it was idle
    (``paused_s``): the first run of the turn is then a run after a pause, the others back to back."""
    turn = state["turns"][request.get("name")]
    if "pause_s" in request:
        idle_s = time.perf_counter() - turn["last_run_end"]
        if idle_s < request["pause_s"]:
            time.sleep(request["pause_s"] - idle_s)
    paused_s = time.perf_counter() - turn["last_run_end"]
    samples = turn["runs"](int(request["count"]))
    turn["last_run_end"] = time.perf_counter()
    return {"samples_s": samples, "paused_s": paused_s}


def _is_sequence(value) -> bool:
    return not hasattr(value, "numpy") and hasattr(value, "__len__")


# On another machine: a session on one server of a TVM RPC tracker (collage_core.measure.remote), and candidates and
# placements built here timed there with the policy of local timing. The worker holds one session at a time. Before a
# library, the native kernels its backends call (DNNL's kernel library, ...) are uploaded and loaded on the server once
# per session: their static initializers register the functions the library calls. A failure that leaves the server
# unable to answer (it died, hung up, dropped the connection) is RemoteServerLost, so that the parent measures the
# request on another server; any other failure is the candidate's own.

# How a lost server's error starts (its type's name: see describe_failure), so the parent tells it from a candidate's own.
LOST = "RemoteServerLost"


class RemoteServerLost(Exception):
    """The server stopped answering; the request itself may be fine."""


def _remote_connect(state, request):
    """A session on a free server of ``request["key"]`` (any held before is dropped); the server's address."""
    state.pop("remote", None)
    session, server = tvm_compat.rpc_request(request["host"], int(request["port"]), request["key"])
    state["remote"] = {"session": session, "server": server, "loaded": set(), "call_overhead_s": None}
    return {"server": server}


def _remote(state) -> dict:
    if "remote" not in state:
        raise RemoteServerLost("no session (connect first)")
    return state["remote"]


def _guarded(state, action):
    """``action()``; a failure after which the server no longer answers is :class:`RemoteServerLost`."""
    remote = _remote(state)
    try:
        return action()
    except Exception as error:
        if tvm_compat.rpc_is_alive(remote["session"]):
            raise
        state.pop("remote", None)
        raise RemoteServerLost(f"server {remote['server']} stopped answering ({describe_failure(error)})") from None


def _load_carried_remotely(remote: dict, carried) -> None:
    """Each native library in ``carried`` uploaded and loaded on the server once per session, under its digest."""
    for path in carried:
        data = Path(path).read_bytes()
        name = f"carried-{hashlib.sha256(data).hexdigest()[:16]}-{Path(path).name}"
        if name not in remote["loaded"]:
            tvm_compat.rpc_load_module(remote["session"], path, name)
            remote["loaded"].add(name)


def _load_remote_vm(state, library, carried):
    remote = _remote(state)
    _load_carried_remotely(remote, carried)
    name = f"library-{time.monotonic_ns()}.so"
    module = tvm_compat.rpc_load_module(remote["session"], library, name)
    device = tvm_compat.rpc_device(remote["session"], tvm_compat.make_target(state["remote_target"]))
    return relax.VirtualMachine(module, device), device


def _remote_library(state, request):
    """The request's ``library`` loaded on a server (a session opened first if none is held), with its backends'
    native libraries, and its ``inputs`` there: the VM, the device and the input tensors."""
    remote = request["remote"]
    state["remote_target"] = request["target"]
    if "remote" not in state:
        _remote_connect(state, remote)

    def load():
        vm, device = _load_remote_vm(state, request["library"], remote.get("carried", ()))
        return vm, device, _saved_tensors(request["inputs"], device)

    return _guarded(state, load)


def _remote_library_function(state, request):
    """``_library_function`` on a server: the library and its backends' native libraries uploaded there."""
    vm, _, args = _remote_library(state, request)
    function = vm[request.get("function", "main")]
    return lambda *tensors: _guarded(state, lambda: function(*tensors)), args


def _remote_call_overhead_s(state, settings, scratch: Path) -> float:
    """The VM's call overhead on the server (see :func:`_call_overhead_s`), timed once per session."""
    remote = _remote(state)
    if remote["call_overhead_s"] is None:
        param = relax.Var("x", relax.TensorType((1,), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [param]):
            bb.emit_func_output(param)
        target = tvm_compat.make_target(state["remote_target"])
        library = scratch / f"identity-{time.monotonic_ns()}.so"
        export_library(relax.build(bb.get(), target), library)
        try:
            vm, device = _load_remote_vm(state, library, ())
        finally:
            library.unlink(missing_ok=True)
        remote["call_overhead_s"] = _time_vm(vm, device, None, settings, [tvm_compat.to_tensor(np.zeros(1, "float32"), device)]).median_s
    return remote["call_overhead_s"]


def _time_remote(state, request):
    """Time a candidate's library (built by ``build_candidate``) on the server, as ``time_candidate`` does here."""
    settings = MeasureSettings.from_json(request["settings"])
    state["remote_target"] = request["target"]
    mod, _ = _load(request)
    library = Path(request["library"])

    def measure() -> Cost:
        vm, device = _load_remote_vm(state, library, request.get("carried", ()))
        cost = _time_vm(vm, device, mod, settings, judge_waiting=False)  # timed on the server: this process's waits say nothing
        return _net_of_call(cost, _remote_call_overhead_s(state, settings, library.parent))

    return {"cost": _guarded(state, measure).to_json(), "server": _remote(state)["server"]}


def _run_placement_remotely(state, request, settings: Optional[MeasureSettings], build_s: float):
    """``run_placement`` on the server: the library the worker just exported, run there on the given inputs
    (outputs kept, for verification) and timed as a placement is here."""
    remote = request["remote"]
    if "remote" not in state:
        _remote_connect(state, remote)

    def run():
        vm, device = _load_remote_vm(state, request["library"], remote.get("carried", ()))
        return _run_and_time(state, request, vm, device, settings, here=False)

    return {"cost": _guarded(state, run), "build_s": build_s, "server": _remote(state)["server"]}


HANDLERS = {
    "init": _init,
    "measure_candidate": _measure_candidate,
    "build_candidate": _build_candidate,
    "time_candidate": _time_candidate,
    "build_placement": _build_placement,
    "run_placement": _run_placement,
    "load_library": _load_library,
    "build_library": _build_library,
    "run_library": _run_library,
    "time_turn": _time_turn,
    "remote_connect": _remote_connect,
    "time_remote": _time_remote,
}

if __name__ == "__main__":
    main()
