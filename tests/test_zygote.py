"""Measurement workers forked from a zygote: each a fresh process of its own, started from the
environment the parent has now, killed and reaped like a started one, and started the slow way
when asked or when the zygote cannot fork."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from collage_core import zygote
from collage_core.timing import MeasureSettings
from collage_core.worker_client import MeasurementWorker, WorkerFailure


def environment_of(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as file:
        pairs = [item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item]
    return {key.decode(): value.decode() for key, value in pairs}


def started(worker: MeasurementWorker):
    worker._start()
    return worker.process


def test_workers_are_forked_fresh_processes_that_answer():
    with MeasurementWorker([], []) as first, MeasurementWorker([], []) as second:
        one, two = started(first), started(second)
        assert isinstance(one, zygote.ForkedProcess) and isinstance(two, zygote.ForkedProcess)
        assert one.pid != two.pid and os.getpgid(one.pid) == one.pid  # each leads its own session
        settings = MeasureSettings(warmup=0, min_repeats=1, max_repeats=1)
        with pytest.raises(WorkerFailure, match="No such file"):  # it ran the request: no such module
            first.request({"op": "measure_candidate", "module": "/nonexistent/module.json", "backend": "tvm",
                           "pattern": "p", "target": "{}", "settings": settings.to_json()}, 60)
        assert second.request({"op": "init", "plugins": [], "disabled": []}, 60)["pid"] == two.pid
    for process in (one, two):
        assert process.returncode is not None  # killed and reaped by the zygote: no zombie left
        assert not os.path.exists(f"/proc/{process.pid}")


def test_a_changed_environment_gets_a_zygote_that_has_it(monkeypatch):
    monkeypatch.setenv("COLLAGE_TEST_MARK", "first")
    with MeasurementWorker([], []) as worker:
        assert environment_of(started(worker).pid)["COLLAGE_TEST_MARK"] == "first"
    monkeypatch.setenv("COLLAGE_TEST_MARK", "second")
    with MeasurementWorker([], []) as worker:
        assert environment_of(started(worker).pid)["COLLAGE_TEST_MARK"] == "second"


def test_a_worker_that_dies_is_reported_with_its_signal():
    with MeasurementWorker([], []) as worker:
        pid = worker.request({"op": "init", "plugins": [], "disabled": []}, 60)["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerFailure, match="crashed with SIGKILL"):
            worker.request({"op": "time_turn", "count": 1}, 30)


def test_exec_setting_and_explicit_environments_start_workers_with_their_own_interpreter(monkeypatch):
    with MeasurementWorker([], [], env=dict(os.environ)) as worker:
        assert isinstance(started(worker), subprocess.Popen)
    monkeypatch.setenv(zygote.SETTING, "exec")
    with MeasurementWorker([], []) as worker:
        assert isinstance(started(worker), subprocess.Popen)


def test_a_zygote_that_opened_the_gpu_refuses_to_fork(monkeypatch):
    monkeypatch.setattr(zygote, "_gpu_files", lambda: ["/dev/nvidiactl"])
    with pytest.raises(zygote.ZygoteUnusable, match="/dev/nvidiactl"):
        zygote._init({}, {"plugins": [], "disabled": []})

