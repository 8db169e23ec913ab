"""Measurement workers forked from a zygote: each a fresh process of its own, started from the
environment the parent has now, killed and reaped like a started one, and started the slow way
when asked or when the zygote cannot fork."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest

from collage_core.measure import zygote
from collage_core.measure.timing import MeasureSettings
from collage_core.measure.worker_client import MeasurementWorker, WorkerFailure


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
            first.request(
                {
                    "op": "measure_candidate",
                    "module": "/nonexistent/module.json",
                    "backend": "tvm",
                    "pattern": "p",
                    "target": "{}",
                    "settings": settings.to_json(),
                },
                60,
            )
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


def small_model():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    weight = relax.const(np.random.default_rng(1).uniform(-1, 1, (8, 8)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            hidden = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, weight))))
            output = bb.emit_output(relax.op.add(hidden, x))
        bb.emit_func_output(output)
    return bb.get()


def run_placement(tmp_path, name: str, **how) -> list:
    from collage_core import tvm_compat

    request = {
        "op": "run_placement",
        "target": tvm_compat.target_to_json(tvm_compat.host_cpu_target()),
        "inputs": str(tmp_path / "inputs.npz"),
        "outputs": str(tmp_path / f"{name}.npz"),
        "settings": None,
        "library": None,
        **how,
    }
    with MeasurementWorker([], []) as worker:
        worker.request(request, 300)
    with np.load(tmp_path / f"{name}.npz") as saved:
        return [saved[key] for key in sorted(saved.files)]


def test_a_held_model_builds_the_placement_the_parent_would_send(tmp_path):
    from collage_core import tvm_compat
    from collage_core.build.partition import partition_module
    from collage_core.model.relax_graph import RelaxGraph
    from collage_core.records import Candidate

    mod = small_model()
    graph = RelaxGraph.from_function(mod["main"], mod)
    parts = [Candidate("tvm", "tvm.op", [node], key="") for node in range(len(graph.graph))]
    np.savez(tmp_path / "inputs.npz", np.random.default_rng(2).uniform(-1, 1, (4, 8)).astype("float32"))
    model_path, placed_path = tmp_path / "model.json", tmp_path / "placed.json"
    model_path.write_text(tvm_compat.save_ir_json(mod))
    placed_path.write_text(tvm_compat.save_ir_json(partition_module(graph, parts)))
    assert zygote.hold_model([], [], "small-model", lambda: model_path)
    model_path.unlink()  # read once, when the zygote took it
    assert zygote.hold_model([], [], "small-model", lambda: pytest.fail("held already: not written again"))
    held = run_placement(
        tmp_path, "held", held="small-model", parts=[{"backend": p.backend, "pattern": p.pattern, "nodes": list(p.nodes)} for p in parts]
    )
    sent = run_placement(tmp_path, "sent", module=str(placed_path))
    with np.load(tmp_path / "inputs.npz") as saved:
        x = saved["arr_0"]
    weight = np.random.default_rng(1).uniform(-1, 1, (8, 8)).astype("float32")
    np.testing.assert_allclose(held[0], np.maximum(x @ weight, 0) + x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(held[0], sent[0])
    with pytest.raises(WorkerFailure, match="does not hold model"):
        run_placement(tmp_path, "unknown", held="another-model", parts=[])


RUN_THAT_DIES = r"""
import os, sys
from collage_core.measure.worker_client import MeasurementWorker
worker = MeasurementWorker([], [], env=dict(os.environ) if sys.argv[1] == "exec" else None)
worker._start()
print(worker.process.pid, flush=True)
worker.request({"op": "init", "plugins": ["plugins_for_tests.slow_import"], "disabled": []}, 600)
"""


# The exec-started worker takes the same path after its start (5 s on 2 cores): it runs with --run-slow.
@pytest.mark.parametrize("started", ["forked", pytest.param("exec", marks=pytest.mark.slow)])
def test_a_busy_worker_ends_soon_after_its_run_is_killed(started, load_test_plugin, tmp_path):
    """A run killed by SIGKILL cannot stop its workers, and a busy worker does not read its closed
    stdin: it sees its run gone and ends within seconds (it would otherwise finish its request first)."""
    import sys
    import time

    from collage_core.measure.worker import process_start

    load_test_plugin("plugins_for_tests.slow_import")  # PYTHONPATH for the run and its workers
    env = {**os.environ, "SLOW_IMPORT_S": "120"}
    run = subprocess.Popen([sys.executable, "-c", RUN_THAT_DIES, started], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    worker_pid = int(run.stdout.readline())
    time.sleep(1.0)  # the worker is importing the slow plugin now
    assert process_start(worker_pid) is not None
    run.kill()
    run.wait()
    deadline = time.monotonic() + 20
    while process_start(worker_pid) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_start(worker_pid) is not None:
        os.kill(worker_pid, signal.SIGKILL)
        pytest.fail(f"the {started} worker outlived its run")


@pytest.mark.parametrize("started", ["forked", "exec"])
def test_a_process_a_library_forks_from_a_thread_while_the_worker_waits_ends(started, load_test_plugin, tmp_path, monkeypatch):
    """A library that forks from a thread while the worker waits for its next request (OpenVINO's
    telemetry on import) gets a child that ends: the worker does not hold stdin's lock as it waits."""
    import time

    load_test_plugin("plugins_for_tests.forks_from_a_thread")
    report = tmp_path / "child.txt"
    monkeypatch.setenv("FORKS_FROM_A_THREAD", str(report))
    env = dict(os.environ) if started == "exec" else None
    with MeasurementWorker([], [], env=env) as worker:
        worker.request({"op": "init", "plugins": ["plugins_for_tests.forks_from_a_thread"], "disabled": []}, 120)
        deadline = time.monotonic() + 40
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert report.exists() and report.read_text() == "0", report.read_text() if report.exists() else "no report"
