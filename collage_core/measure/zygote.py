"""Fresh measurement workers in milliseconds: one process imports TVM and the plugins once, then
forks each worker from that state.

Every build and timing runs in a fresh process (ONNX Runtime timed in a process where TVM kernels
ran before measured 124 ms instead of 46 ms), and starting one is slow: importing TVM and the
plugins' libraries (ONNX Runtime, OpenVINO, oneDNN) took 3.5-4 s on 2 cores, longer than building
and timing a small placement. The zygote pays that once. It then
only forks: it runs no kernel, starts no thread pool and initialises no GPU, so each child starts
where a fresh process stands after its imports.

A child gets its stdin, stdout and stderr from the parent over the control socket (SCM_RIGHTS),
starts its own session (so the parent can kill it and whatever it started), and serves
:func:`collage_core.measure.worker.main`. The zygote reaps its children and answers the parent's
``wait`` with their exit status, as ``Popen.wait`` would.

``COLLAGE_FRESH_WORKERS=exec`` starts every worker with its own interpreter instead.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Optional, Sequence

from collage_core import tvm_compat
from collage_core.backends import preload
from collage_core.measure import threads, worker
from collage_core.model.relax_graph import RelaxGraph

MESSAGE_BYTES = 1 << 16
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 30.0
SETTING = "COLLAGE_FRESH_WORKERS"


class ZygoteUnusable(Exception):
    """The zygote cannot fork workers (it died, or it holds state a child must not inherit)."""


# ---------------------------------------------------------------------------------------------
# The zygote process


def serve(control: socket.socket) -> None:
    """Answer the parent's requests on ``control`` until it closes: ``init``, ``fork``, ``wait``."""
    state: dict = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 3)
        except ConnectionError:
            return
        if not data:
            return
        request = json.loads(data)
        try:
            if request["op"] == "init":
                reply = _init(state, request)
            elif request["op"] == "hold":
                reply = _hold(state, request)
            elif request["op"] == "fork":
                reply = {"pid": _fork(state, control, fds, request.get("tmpdir"))}
            else:
                reply = {"status": _wait(int(request["pid"]), float(request["timeout_s"]))}
        except Exception as error:  # reported to the parent, which starts workers the slow way
            reply = {"error": f"{type(error).__name__}: {error}"}
        finally:
            for fd in fds:
                os.close(fd)
        control.send(json.dumps(reply).encode())


def _init(state: dict, request: dict) -> dict:
    reply = worker._init(state, request)
    preload(state["pm"], state["backends"])  # CPU libraries only: no GPU is touched before a fork
    held = _gpu_files()
    if held:  # a CUDA context does not survive fork: children would fail on the GPU
        raise ZygoteUnusable(f"loading the plugins opened {held[0]}; workers cannot be forked from this state")
    return reply


def _hold(state: dict, request: dict) -> dict:
    """Load the model in ``request["module"]`` (IR JSON) and keep it, in place of any before, under ``request["key"]``: workers
    forked afterwards build placements of it from their inherited copy (``run_placement`` with
    ``held``), so a placement reaches a worker as a list of partitions, not as the model again."""
    with open(request["module"]) as file:
        mod = tvm_compat.load_ir_json(file.read())
    state["held"] = {request["key"]: RelaxGraph.from_function(mod["main"], mod)}  # the latest model only
    state["widenable"] = {}
    if request.get("original"):  # a 16-bit model and its float32 original: workers may widen units of it
        with open(request["original"]) as file:
            state["widenable"][request["key"]] = (mod, tvm_compat.load_ir_json(file.read()))
    return {"ok": True}


def _gpu_files() -> list[str]:
    """The NVIDIA device files this process holds open (a CUDA driver was initialised)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith("/dev/nvidia"):
            held.append(path)
    return held


def _fork(state: dict, control: socket.socket, fds: Sequence[int], tmpdir: Optional[str] = None) -> int:
    if len(fds) != 3:
        raise ValueError(f"a fork needs stdin, stdout and stderr; got {len(fds)} descriptors")
    if "pm" not in state:
        raise ZygoteUnusable("the zygote was not initialised")
    run_pid = os.getppid()  # the run that started this zygote: its workers end with it
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:  # the child: a measurement worker
        os.setsid()
        control.close()
        if tmpdir:  # the temporary folder of the run that asked for the worker (it may not be the zygote's)
            os.environ["TMPDIR"] = tempfile.tempdir = tmpdir
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)

        worker.main(state, run_pid)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> Optional[int]:
    """``pid``'s exit status as ``Popen.returncode`` gives it (minus the signal that killed it), or
    None if it still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return -9  # reaped before: it is gone
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


# ---------------------------------------------------------------------------------------------
# The parent's side


class ForkedProcess:
    """A worker forked by a zygote, with the part of ``subprocess.Popen``'s interface workers use."""

    def __init__(self, zygote: "Zygote", pid: int, stdin, stdout):
        self.zygote, self.pid, self.stdin, self.stdout = zygote, pid, stdin, stdout
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self.wait(timeout=0.0, raising=False)

    def wait(self, timeout: Optional[float] = None, raising: bool = True) -> Optional[int]:
        if self.returncode is None:
            try:
                self.returncode = self.zygote.wait(self.pid, REQUEST_TIMEOUT_S if timeout is None else timeout)
            except ZygoteUnusable:
                self.returncode = -9
        if self.returncode is None and raising:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode


class Zygote:
    """A started zygote for one set of plugins, environment and working directory."""

    def __init__(self, plugin_modules: Sequence[str], disabled: Sequence[str]):
        self.lock = threading.Lock()
        self.held: set[str] = set()
        self.stderr_file = tempfile.TemporaryFile(mode="w+b")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collage_core.measure.zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=self.stderr_file,
            stderr=self.stderr_file,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env=threads.environment_for_partitions(),
        )
        theirs.close()
        reply = self._call({"op": "init", "plugins": list(plugin_modules), "disabled": list(disabled)}, (), START_TIMEOUT_S)
        if "error" in reply:
            self.close()
            raise ZygoteUnusable(reply["error"])

    def fork(self, stderr_fd: int) -> ForkedProcess:
        """A fresh worker whose stderr goes to ``stderr_fd``."""
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            reply = self._call({"op": "fork", "tmpdir": tempfile.gettempdir()}, (stdin_read, stdout_write, stderr_fd), REQUEST_TIMEOUT_S)
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        if "error" in reply:
            os.close(stdin_write)
            os.close(stdout_read)
            raise ZygoteUnusable(reply["error"])
        return ForkedProcess(self, reply["pid"], os.fdopen(stdin_write, "w"), os.fdopen(stdout_read, "r"))

    def hold(self, key: str, saved) -> bool:
        """Have the zygote keep the model ``saved`` (its IR JSON file, or ``{"module": file, "original": file}``
        for a 16-bit model that workers may widen) under ``key`` (once); False if it could not."""
        if key in self.held:
            return True
        paths = saved if isinstance(saved, dict) else {"module": saved}
        try:
            reply = self._call({"op": "hold", "key": key, **{name: str(path) for name, path in paths.items()}}, (), START_TIMEOUT_S)
        except ZygoteUnusable:
            return False
        if "error" in reply:
            return False
        self.held = {key}
        return True

    def wait(self, pid: int, timeout_s: float) -> Optional[int]:
        reply = self._call({"op": "wait", "pid": pid, "timeout_s": timeout_s}, (), timeout_s + REQUEST_TIMEOUT_S)
        if "error" in reply:
            raise ZygoteUnusable(reply["error"])
        return reply["status"]

    def alive(self) -> bool:
        return self.process.poll() is None

    def _call(self, message: dict, fds: Sequence[int], timeout_s: float) -> dict:
        with self.lock:
            try:
                self.control.settimeout(timeout_s)
                socket.send_fds(self.control, [json.dumps(message).encode()], list(fds))
                data = self.control.recv(MESSAGE_BYTES)
            except OSError as error:  # socket.timeout included
                self._kill()
                raise ZygoteUnusable(f"the zygote did not answer: {error}") from None
        if not data:
            self._kill()
            raise ZygoteUnusable(f"the zygote exited{self._stderr_tail()}")
        return json.loads(data)

    def _stderr_tail(self) -> str:
        self.stderr_file.seek(0)
        lines = [line.strip() for line in self.stderr_file.read().decode(errors="replace").splitlines() if line.strip()]
        return f" ({lines[-1][:300]})" if lines else ""

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def close(self) -> None:
        self.control.close()  # the zygote reads the end of its socket and exits
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
        self.stderr_file.close()


_zygotes: dict[tuple, Zygote] = {}
_refused: set[tuple] = set()
_registry_lock = threading.Lock()
# Variables that change while nothing a worker does depends on them (pytest names the running test in one).
# TMPDIR travels in each fork request instead: a run's temporary files go to its own scratch folder.
IGNORED_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", "TMPDIR"})
# Zygotes kept at once; the least recently started goes when another is needed (tests change the environment).
KEPT = 2


def _current_key(plugin_modules: Sequence[str], disabled: Sequence[str]) -> Optional[tuple]:
    """The zygote key of these plugins, this environment and this directory; None when workers are
    not forked here (see ``SETTING``)."""
    if os.environ.get(SETTING, "fork") == "exec" or not hasattr(socket, "send_fds") or not sys.platform.startswith("linux"):
        return None
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k not in IGNORED_VARIABLES))
    return (tuple(plugin_modules), tuple(disabled), os.getcwd(), environment)


def _zygote_for(key: tuple) -> Optional[Zygote]:
    """The running zygote for ``key``, started when there is none; None if one cannot be."""
    with _registry_lock:
        if key in _refused:
            return None
        zygote = _zygotes.get(key)
        if zygote is not None and not zygote.alive():
            _zygotes.pop(key).close()
            zygote = None
        if zygote is None:
            while len(_zygotes) >= KEPT:
                _zygotes.pop(next(iter(_zygotes))).close()
            try:
                zygote = _zygotes[key] = Zygote(*key[:2])
            except ZygoteUnusable:
                _refused.add(key)
                return None
        return zygote


def forked_worker(plugin_modules: Sequence[str], disabled: Sequence[str], stderr_fd: int) -> Optional[ForkedProcess]:
    """A worker forked from the zygote for these plugins, this environment and this directory,
    starting the zygote when there is none; None when workers are not forked here (see ``SETTING``)."""
    key = _current_key(plugin_modules, disabled)
    zygote = None if key is None else _zygote_for(key)
    if zygote is None:
        return None
    try:
        return zygote.fork(stderr_fd)
    except ZygoteUnusable:
        with _registry_lock:
            if _zygotes.get(key) is zygote:
                _zygotes.pop(key).close()
        return None


def hold_model(plugin_modules: Sequence[str], disabled: Sequence[str], key: str, write_module) -> bool:
    """Have the zygote that forks these plugins' workers keep a model under ``key``; ``write_module()``
    saves it as IR JSON and returns the path, or ``{"module": path, "original": path}`` with the float32
    original of a 16-bit model (called only when the zygote does not hold it yet).
    True when workers forked from now on have it (``run_placement`` with ``held``)."""
    zygote_key = _current_key(plugin_modules, disabled)
    zygote = None if zygote_key is None else _zygote_for(zygote_key)
    if zygote is None:
        return False
    return key in zygote.held or zygote.hold(key, write_module())


@atexit.register
def close_all() -> None:
    """Stop every zygote this process started."""
    with _registry_lock:
        while _zygotes:
            _zygotes.popitem()[1].close()


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
