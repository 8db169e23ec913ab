"""A measurement worker's side of measuring on another machine: a session on one server of a TVM RPC tracker,
and candidates and placements built here timed there with the policy of local timing (``timing.time_callable``).

The worker holds one session at a time. Before a library, the native kernels its backends call (DNNL's kernel
library, ...) are uploaded and loaded on the server once per session: their static initializers register the
functions the library calls. A failure that leaves the server unable to answer (it died, hung up, dropped the
connection) is :class:`RemoteServerLost`, so that the parent measures the request on another server; any other
failure is the candidate's own.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
from tvm import relax

from collage_core import tvm_compat
from collage_core.measure import worker
from collage_core.measure.timing import MeasureSettings
from collage_core.outputs.output_folder import export_library
from collage_core.records import Cost

# How a lost server's error starts (its type's name: see worker.describe_failure), so the parent tells it from a candidate's own.
LOST = "RemoteServerLost"


class RemoteServerLost(Exception):
    """The server stopped answering; the request itself may be fine."""


def _connect(state, request):
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
        raise RemoteServerLost(f"server {remote['server']} stopped answering ({worker.describe_failure(error)})") from None


def _load_carried(remote: dict, carried) -> None:
    """Each native library in ``carried`` uploaded and loaded on the server once per session, under its digest."""
    for path in carried:
        data = Path(path).read_bytes()
        name = f"carried-{hashlib.sha256(data).hexdigest()[:16]}-{Path(path).name}"
        if name not in remote["loaded"]:
            tvm_compat.rpc_load_module(remote["session"], path, name)
            remote["loaded"].add(name)


def _load_vm(state, library, carried):
    remote = _remote(state)
    _load_carried(remote, carried)
    name = f"library-{time.monotonic_ns()}.so"
    module = tvm_compat.rpc_load_module(remote["session"], library, name)
    device = tvm_compat.rpc_cpu(remote["session"])
    return relax.VirtualMachine(module, device), device


def _call_overhead_s(state, settings, scratch: Path) -> float:
    """The VM's call overhead on the server (see ``worker._call_overhead_s``), timed once per session."""
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
            vm, device = _load_vm(state, library, ())
        finally:
            library.unlink(missing_ok=True)
        remote["call_overhead_s"] = worker._time_vm(
            vm, device, None, settings, [tvm_compat.to_tensor(np.zeros(1, "float32"), device)]
        ).median_s
    return remote["call_overhead_s"]


def _time_remote(state, request):
    """Time a candidate's library (built by ``build_candidate``) on the server, as ``time_candidate`` does here."""
    settings = MeasureSettings.from_json(request["settings"])
    state["remote_target"] = request["target"]
    mod, _ = worker._load(request)
    library = Path(request["library"])

    def measure() -> Cost:
        vm, device = _load_vm(state, library, request.get("carried", ()))
        cost = worker._time_vm(vm, device, mod, settings)
        return worker._net_of_call(cost, _call_overhead_s(state, settings, library.parent))

    return {"cost": _guarded(state, measure).to_json(), "server": _remote(state)["server"]}


def run_placement_remotely(state, request, build_s: float):
    """``run_placement`` on the server: the library the worker just exported there, run on the given inputs
    (outputs kept, for verification) and timed as a placement is here."""
    settings = MeasureSettings.from_json(request["settings"]) if request.get("settings") else None
    remote = request["remote"]
    if "remote" not in state:
        _connect(state, remote)

    def run():
        vm, device = _load_vm(state, request["library"], remote.get("carried", ()))
        with np.load(request["inputs"], allow_pickle=False) as saved:
            args = [tvm_compat.to_tensor(saved[f"arr_{i}"], device) for i in range(len(saved.files))]
        state["progress"]("built")
        timed = request.get("timed", True)
        first = vm["main"](*args)
        state["progress"]("set up")
        started = time.perf_counter()
        result = vm["main"](*args) if timed else first
        device.sync()
        run_s = time.perf_counter() - started
        outputs = [tvm_compat.to_numpy(o) for o in (result if worker._is_sequence(result) else [result])]
        first_run_s = time.perf_counter() - started
        state["progress"]("ran once")
        np.savez(request["outputs"], *outputs)
        if settings is None or not timed:
            return None
        if first_run_s > settings.single_run_s:
            return Cost.measured(first_run_s, 0.0, 1).to_json()
        judged_s = run_s if run_s >= worker.REJUDGE_BELOW_S else worker._one_timed_run_s(vm, device, args)
        return worker._time_vm(vm, device, None, settings, args, warm_run_s=judged_s).to_json()

    return {"cost": _guarded(state, run), "build_s": build_s, "server": _remote(state)["server"]}


HANDLERS = {"remote_connect": _connect, "time_remote": _time_remote}
