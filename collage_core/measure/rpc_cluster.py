"""A TVM RPC tracker and servers started on this machine, on free ports, for tests, benchmarks and trying
``--rpc-tracker`` out; each process in a session of its own, so that stopping it stops what it started
(TVM's server runs in a child process of the command)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.measure.remote import servers_of

# How long a tracker or a server may take to start (importing TVM on a busy machine).
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@attrs.define
class LocalCluster:
    """A tracker on 127.0.0.1 and the servers registered with it; :meth:`stop` ends them all."""

    port: int = attrs.field(factory=free_port)
    tracker: Optional[subprocess.Popen] = None
    servers: list = attrs.field(factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "LocalCluster":
        self.tracker = _spawn(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(self.port), "--port-end", str(self.port + 1)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not tvm_compat.rpc_tracker_reachable("127.0.0.1", self.port, 1.0):
            if time.monotonic() > deadline or self.tracker.poll() is not None:
                self.stop()
                raise RuntimeError(f"the RPC tracker on port {self.port} did not start")
            time.sleep(0.2)
        return self

    def add_servers(
        self, key: str, count: int = 1, cpus: Optional[Sequence[Sequence[int]]] = None, fork: bool = True
    ) -> list[subprocess.Popen]:
        """Start ``count`` servers of ``key`` (the i-th pinned to the cores ``cpus[i]``) and wait until the tracker
        lists them. ``fork=False`` starts each session in a fresh process (``--no-fork``), which CUDA needs: in a session
        TVM's server forks, CUDA fails to initialize (seen on an H100 with TVM 0.27)."""
        started = []
        for index in range(count):
            port = free_port()
            command = [
                "tvm.exec.rpc_server",
                "--tracker",
                self.address,
                "--key",
                key,
                "--host",
                "127.0.0.1",
                *([] if fork else ["--no-fork"]),
            ]
            pinned = None if cpus is None else set(cpus[index])
            started.append(_spawn([*command, "--port", str(port), "--port-end", str(port + 1)], pinned))
        self.servers += started
        self.wait_for(key, len(servers_of(self.summary(), key)) + count)
        return started

    def summary(self) -> dict:
        return tvm_compat.rpc_tracker_summary("127.0.0.1", self.port)

    def wait_for(self, key: str, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(servers_of(self.summary(), key)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} server(s) of key {key!r} did not register with the tracker on port {self.port}")
            time.sleep(0.2)

    def kill(self, process: subprocess.Popen) -> None:
        """End ``process`` and what it started, at once (SIGKILL: as a machine that dies)."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def stop(self) -> None:
        for process in [*self.servers, *([self.tracker] if self.tracker else [])]:
            self.kill(process)
        self.servers, self.tracker = [], None


def _spawn(module_args: list[str], cpus: Optional[set] = None) -> subprocess.Popen:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(
        [sys.executable, "-m", *module_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=pin if cpus else None,
    )
