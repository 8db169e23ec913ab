"""Measuring on other machines: candidates and placements built here, cross-compiled for the CPU (or the NVIDIA GPU)
of the servers a TVM RPC tracker holds under one key, and timed there, every free server at once.

A server needs what a deployment needs: TVM's runtime and the native libraries of the backends placed (uploaded with
each session, as exports carry them: ``collage_runtime_libraries``). Backends whose partitions call Python at run
time (graph-level engines) cannot run there and are left out, each with one line.

Costs measured on a server are keyed by its target and device as local ones are, so a remote and a local CPU of one
kind share them (a server's GPU is described in its target's ``model``, read from the server); the thread settings
of this process are not the server's, which runs with its machine's defaults.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.measure.cost_db import TRANSIENT_REASON
from collage_core.measure.worker import LOST
from collage_core.measure.worker_client import START_TIMEOUT_S, MeasurementWorker, WorkerFailure
from collage_core.plugins import first_result
from collage_core.records import Cost

log = logging.getLogger("collage")

# How long to wait for the tracker to answer when checking it, before anything is built.
TRACKER_TIMEOUT_S = 5.0
# A server that fails this many times is left out of the run.
FAILURES_LEFT_OUT = 2
# How long a worker that lost its server, or a run about to time its placement, waits for the tracker to list a server
# of the key before it takes none to be left (a server a supervisor restarts registers again within it).
LISTED_WAIT_S = 30.0


class RemoteError(CollageError):
    """The tracker or its servers cannot be used; one line saying why and what to do."""


@attrs.frozen
class RemoteServers:
    """The servers registered under ``key`` at the tracker ``host:port``, and the target they run (read from
    one of them, or given)."""

    host: str
    port: int
    key: str
    target: Any = attrs.field(eq=False)
    servers: tuple = ()
    # The native libraries each backend's partitions call, by backend name (:func:`carried_libraries`).
    carried: dict = attrs.field(factory=dict, eq=False)

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"

    def request(self, carried: Sequence[Path] = ()) -> dict:
        """What a worker needs to open a session (``remote_connect``), with the native libraries to load there."""
        return {"host": self.host, "port": self.port, "key": self.key, "carried": [str(path) for path in carried]}

    def request_for_every_backend(self) -> dict:
        """:meth:`request` with the native libraries of every backend of the run: for work that may run any of them
        (a contest's rivals, an accuracy probe's placement)."""
        return self.request(sorted({path for paths in self.carried.values() for path in paths}))

    def listed(self) -> bool:
        """Whether the tracker lists a server of the key, waiting up to LISTED_WAIT_S for one (it may be coming
        back); True when the tracker cannot be asked (the session request then says what is wrong). TVM's server
        whose session died (a kernel that faulted there) does not come back to the tracker."""
        deadline = time.monotonic() + LISTED_WAIT_S
        while True:
            try:
                if servers_of(tracker_summary(self.tracker)[2], self.key):
                    return True
            except (RemoteError, OSError, ValueError):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(3.0, LISTED_WAIT_S))

    def free_servers(self) -> int:
        """How many servers of the key the tracker says are free now (at least 1: a busy one frees later)."""
        try:
            summary = tvm_compat.rpc_tracker_summary(self.host, self.port)
        except (OSError, RuntimeError):
            return 1
        return max(1, int(summary.get("queue_info", {}).get(self.key, {}).get("free", 0)))


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit():
        raise RemoteError(f"--rpc-tracker {text!r}: expected HOST:PORT, such as 127.0.0.1:9190")
    return host, int(port)


def server_at_fault(failure: WorkerFailure) -> bool:
    """Whether a request failed for its server (lost, or out of time: hung) or its worker here, not for itself."""
    return any(sign in str(failure) for sign in (LOST, "timed out", "crashed"))


def servers_of(summary: dict, key: str) -> list[str]:
    """The addresses of the servers registered under ``key`` in a tracker's summary."""
    return sorted(
        ":".join(map(str, item["addr"])) for item in summary.get("server_info", []) if item.get("key", "").split(":", 1)[-1] == key
    )


def shared_hosts(servers: Sequence[str]) -> dict[str, int]:
    """The hosts that several of ``servers`` (``host:port``) run on, with how many: their timings disturb each other
    unless each server is pinned to cores of its own."""
    counts = collections.Counter(server.rpartition(":")[0] for server in servers)
    return {host: count for host, count in sorted(counts.items()) if count > 1}


def tracker_summary(tracker: str) -> tuple[str, int, dict]:
    """The tracker's host, port and summary; :class:`RemoteError` in one line when it cannot be reached."""
    host, port = parse_tracker(tracker)
    if not tvm_compat.rpc_tracker_reachable(host, port, TRACKER_TIMEOUT_S):
        raise RemoteError(
            f"the RPC tracker at {tracker} cannot be reached: start it with "
            f"`python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {port}` (docs/usage.md#measuring-on-other-machines)"
        )
    try:
        return host, port, tvm_compat.rpc_tracker_summary(host, port)
    except (OSError, RuntimeError) as error:
        raise RemoteError(f"the RPC tracker at {tracker} did not answer: {error}") from None


def connect(tracker: str, key: str, target=None) -> RemoteServers:
    """The servers of ``key`` at ``tracker`` and their target (``target`` as given, else read from a server:
    its CPU as LLVM names it, as ``Target.from_device`` reads this one's). A CUDA target is completed from a
    server's first GPU (:func:`remote_cuda_target`)."""
    host, port, summary = tracker_summary(tracker)
    servers = servers_of(summary, key)
    if not servers:
        keys = sorted({item.get("key", "").split(":", 1)[-1] for item in summary.get("server_info", [])})
        raise RemoteError(
            f"no server is registered under key {key!r} at the RPC tracker {tracker} "
            f"({'keys there: ' + ', '.join(keys) if keys else 'none is registered'})"
        )
    if target is None:
        target = remote_target(host, port, key, tracker)
    elif tvm_compat.make_target(target).kind.name == "cuda":
        target = remote_cuda_target(host, port, key, target)
    else:
        target = tvm_compat.make_target(target)
    if target.kind.name not in ("llvm", "cuda"):
        raise RemoteError(f"measuring on other machines takes CPU (llvm) and CUDA targets, not {target.kind.name}")
    return RemoteServers(host, port, key, target, tuple(servers))


def remote_cuda_target(host: str, port: int, key: str, given):
    """A CUDA target for the servers of ``key``, read from one of them: its GPU's architecture (unless ``given``
    names one) and, as the target's ``model``, its description, which the cost keys carry; the host code is built
    for the server's CPU (the target's ``host``, else read from the server, whose TVM must then have its compiler)."""
    spec = tvm_compat.target_to_dict(tvm_compat.make_target(given))
    if isinstance(given, str) and given.lstrip().startswith("{"):
        asked = json.loads(given)
    elif isinstance(given, dict):
        asked = given
    else:  # a name ("cuda") asks for the server's; a Target names what it holds
        asked = spec if not isinstance(given, str) else {}
    session, server = tvm_compat.rpc_request(host, port, key)
    try:
        try:
            arch, description = tvm_compat.rpc_gpu(session)
        except Exception as error:  # noqa: BLE001 - one line naming the server
            raise RemoteError(f"server {server} (key {key!r}) cannot run a CUDA target: {_first_line(error)}") from None
        host_spec = asked.get("host")
        if host_spec is None:
            try:
                host_spec = tvm_compat.rpc_cpu_target_spec(session)
            except Exception:  # noqa: BLE001 - a runtime-only TVM cannot say its CPU
                raise RemoteError(
                    f"server {server} (key {key!r}) cannot say its CPU (its TVM is runtime-only): give the host code's target, "
                    '\'{"kind": "cuda", "host": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "..."}}\''
                ) from None
    finally:
        del session
    for generated in ("keys", "tag", "max_num_threads", "thread_warp_size"):
        spec.pop(generated, None)
    spec.update(arch=asked.get("arch") or arch, model=description, host=host_spec)
    return tvm_compat.make_target(spec)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def remote_target(host: str, port: int, key: str, tracker: str):
    session, server = tvm_compat.rpc_request(host, port, key)
    try:
        spec = tvm_compat.rpc_cpu_target_spec(session)
    except Exception:
        raise RemoteError(
            f"server {server} (key {key!r}) cannot say its CPU (its TVM is runtime-only): pass --target, such as "
            '\'{"kind": "llvm", "mcpu": "skylake-avx512", "mtriple": "x86_64-linux-gnu"}\''
        ) from None
    finally:
        del session
    return tvm_compat.make_target(spec)


def measurable_remotely(pm, chosen, say: Callable[[str], None]) -> list:
    """The chosen backends (BackendInfo records) whose partitions a server runs with TVM's runtime and the native
    libraries uploaded to it; each other one is left out with one line."""
    kept = []
    for info in chosen:
        paths, _ = first_result(pm.hook.collage_runtime_libraries, backend=info.backend)
        if paths is None:
            say(f"{info.name}: its partitions call Python at run time, so it cannot be measured remotely; left out")
        else:
            kept.append(info)
    return kept


def carried_libraries(pm, backends) -> dict[str, list[Path]]:
    """The native libraries each backend's partitions call, uploaded to a server before its libraries."""
    found = {}
    for backend in backends:
        paths, _ = first_result(pm.hook.collage_runtime_libraries, backend=backend)
        found[backend.name] = [Path(path) for path in paths or ()]
    return found


def describe(tracker: str, key: Optional[str]) -> str:
    """``collage backends --rpc-tracker``: the servers at ``tracker`` (of ``key``, or all), and the CPU (and the GPU,
    if it has one) of each key."""
    host, port, summary = tracker_summary(tracker)
    lines = []
    keys = sorted({item.get("key", "").split(":", 1)[-1] for item in summary.get("server_info", [])})
    for each in [key] if key else keys:
        servers = servers_of(summary, each)
        queue = summary.get("queue_info", {}).get(each, {})
        lines.append(f"key {each}: {len(servers)} server(s), {queue.get('free', 0)} free: {', '.join(servers) or 'none'}")
        if servers:
            try:
                target = remote_target(host, port, each, tracker)
                lines.append(f"  runs {tvm_compat.device_name(target)} ({tvm_compat.target_to_json(target)})")
            except RemoteError as error:
                lines.append(f"  {error}")
            gpu = _gpu_line(host, port, each)
            if gpu:
                lines.append(f"  {gpu}")
    return "\n".join(lines) if lines else f"no server is registered at the RPC tracker {tracker}"


def _gpu_line(host: str, port: int, key: str) -> Optional[str]:
    """What a server of ``key`` says of its first CUDA GPU (for ``--target cuda``), or why it cannot use it; None
    when it has none."""
    try:
        session, _ = tvm_compat.rpc_request(host, port, key)
    except Exception:  # noqa: BLE001 - the CPU line above already said why no session opens
        return None
    try:
        arch, description = tvm_compat.rpc_gpu(session)
        return f"GPU {description} ({arch}): --target cuda measures there"
    except RuntimeError as error:
        return None if "no CUDA GPU" in str(error) else f"GPU: {_first_line(error)}"
    except Exception as error:  # noqa: BLE001 - one line, whatever the RPC raised
        return f"GPU: {_first_line(error)}"
    finally:
        del session


@attrs.define
class RemotePool:
    """Work handed to every server of the key at once: one local worker per server, each holding a session on its
    server. A request whose server dies, hangs or drops the connection goes back to the queue and is measured on
    another; one that two servers were lost on is taken as its own doing (a kernel that faults) and costs invalid,
    saying so; a server that fails FAILURES_LEFT_OUT times is left out with one line. A worker that lost its
    server looks for another only while the tracker lists a server of the key (:meth:`RemoteServers.listed`): with
    none left, what is still queued is left to a later run at once. Items may be
    added while the pool runs (:meth:`add`) until :meth:`close_input`."""

    remote: RemoteServers
    plugin_modules: Sequence[str]
    disabled: Sequence[str]
    # (item) -> the worker request measuring it; called when a server takes it.
    request_for: Callable[[Any], dict]
    # (item, response or None, reason) under the pool's lock: None when no server could measure it.
    on_done: Callable[[Any, Optional[dict], str], None]
    timeout_s: float
    _queue: collections.deque = attrs.field(init=False, factory=collections.deque)
    _in_flight: int = attrs.field(init=False, default=0)
    _open: bool = attrs.field(init=False, default=True)
    _failures: collections.Counter = attrs.field(init=False, factory=collections.Counter)
    _left_out: set = attrs.field(init=False, factory=set)
    _first_fault: dict = attrs.field(init=False, factory=dict)  # id(item) -> the server it took down first
    _lock: threading.Condition = attrs.field(init=False, factory=threading.Condition)
    _threads: list = attrs.field(init=False, factory=list)

    def start(self, servers: Optional[int] = None) -> "RemotePool":
        for _ in range(servers or self.remote.free_servers()):
            thread = threading.Thread(target=self._serve, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def add(self, item) -> None:
        with self._lock:
            self._queue.append(item)
            self._lock.notify_all()

    def close_input(self) -> None:
        with self._lock:
            self._open = False
            self._lock.notify_all()

    def join(self) -> None:
        """Wait until every item is measured; those left when no server is, get ``on_done(item, None, why)``."""
        self.close_input()
        for thread in self._threads:
            thread.join()
        with self._lock:
            while self._queue:
                self.on_done(self._queue.popleft(), None, f"{TRANSIENT_REASON} (no server of key {self.remote.key!r} left to measure it)")

    def _next(self):
        """The next item (counted in flight), or None when there is none and none can come."""
        with self._lock:
            while not self._queue and (self._open or self._in_flight):
                self._lock.wait(0.5)
            if not self._queue:
                return None
            self._in_flight += 1
            return self._queue.popleft()

    def _done(self, item, response: Optional[dict], reason: str = "", requeue: bool = False) -> None:
        with self._lock:
            self._in_flight -= 1
            if requeue:
                self._queue.appendleft(item)
            else:
                self.on_done(item, response, reason)
            self._lock.notify_all()

    def _more_to_do(self) -> bool:
        with self._lock:
            while not self._queue and self._open:
                self._lock.wait(0.5)
            return bool(self._queue) or self._in_flight > 0

    def _serve(self) -> None:
        with MeasurementWorker(self.plugin_modules, self.disabled) as worker:
            server = None
            while True:
                if server is None:
                    server = self._session(worker) if self._more_to_do() else None
                    if server is None:
                        return
                item = self._next()
                if item is None:
                    return
                try:
                    response = worker.request(self.request_for(item), self.timeout_s)
                except WorkerFailure as failure:
                    if not server_at_fault(failure):
                        self._done(item, {"cost": Cost.invalid(str(failure)).to_json()})
                        continue
                    worker.close()
                    # a second server lost on it (not out of time, nor a worker here): the item's own doing
                    before = self._first_fault.setdefault(id(item), server) if LOST in str(failure) else server
                    if before != server:
                        reason = f"{failure}; it took down server {before} before: taken as its own doing"
                        self._done(item, {"cost": Cost.invalid(reason).to_json()})
                        log.warning("server %s (key %r): %s", server, self.remote.key, reason)
                    else:
                        self._done(item, None, requeue=True)
                        log.warning(
                            "server %s (key %r): %s; what it was measuring goes back to the queue", server, self.remote.key, failure
                        )
                    if self._failed(server):
                        return
                    server = None
                    continue
                except BaseException as error:  # never leave an item in flight: the others would wait for it
                    self._done(item, {"cost": Cost.invalid(f"{type(error).__name__}: {error}").to_json()})
                    raise
                self._done(item, response)

    def _session(self, worker: MeasurementWorker) -> Optional[str]:
        """The server ``worker`` now holds a session on, or None when it got none, one left out, or the tracker
        lists no server of the key (waiting for one would wait out the whole timeout)."""
        if not self.remote.listed():
            log.warning("no server of key %r is listed at the RPC tracker %s any more", self.remote.key, self.remote.tracker)
            return None
        try:
            server = worker.request({"op": "remote_connect", **self.remote.request()}, self.timeout_s + START_TIMEOUT_S)["server"]
        except WorkerFailure as failure:
            log.warning("no session on a server of key %r at %s: %s", self.remote.key, self.remote.tracker, failure)
            return None
        return None if server in self._left_out else server  # one left out: this worker's share goes to the others

    def _failed(self, server: str) -> bool:
        """Count a failure of ``server``; whether it is now left out (said once)."""
        with self._lock:
            self._failures[server] += 1
            if self._failures[server] < FAILURES_LEFT_OUT or server in self._left_out:
                return server in self._left_out
            self._left_out.add(server)
        log.warning("server %s (key %r) failed %d times: left out of this run", server, self.remote.key, FAILURES_LEFT_OUT)
        return True
