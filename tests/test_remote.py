"""Measuring on other machines (``--rpc-tracker``): each test starts its own TVM RPC tracker and servers on
127.0.0.1, on free ports, and stops them however it ends."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import attrs
import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import collage_core
from collage_core import optimize_shapes, tvm_compat
from collage_core.backends import discover_backends
from collage_core.build.cuda_libraries import gpu_description
from collage_core.measure import remote
from collage_core.measure.rpc_cluster import LocalCluster, free_port
from collage_core.measure.timing import MeasureSettings
from collage_core.model import precision
from collage_core.plugins import get_plugin_manager

pytest.importorskip("tornado", reason="the RPC tracker needs tornado: pip install 'collage-core[rpc]'")

KEY = "collage-test"
DYNAMIC_BERT = Path(__file__).resolve().parents[1] / "models" / "tiny_bert_dynamic.onnx"
# Few, short repeats: these tests check where and how candidates are measured, not how fast they are.
QUICK = MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=1.0, time_bound_s=1.0, build_workers=2)
THREAD_VARIABLES = ("COLLAGE_NUM_THREADS", "TVM_NUM_THREADS", "OMP_NUM_THREADS")


@pytest.fixture
def cluster(request):
    """A tracker and two servers of KEY of the test's own (it kills, stops or adds servers), stopped when it ends."""
    started = LocalCluster()
    request.addfinalizer(started.stop)
    started.start()
    started.add_servers(KEY, 2)
    return started


@pytest.fixture(scope="module")
def shared_cluster(request):
    """A tracker and two servers of KEY for the tests that leave them as they found them (starting one takes
    about 14 s on 2 cores), stopped when the module's tests end."""
    started = LocalCluster()
    request.addfinalizer(started.stop)
    started.start()
    started.add_servers(KEY, 2)
    return started


def dense_model(folder) -> str:
    """Two dense layers as an ONNX file (ONNX Runtime is the reference): a handful of TVM and DNNL candidates."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return onnx.numpy_helper.from_array(rng.uniform(-1, 1, shape).astype("float32"), name)

    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]),
            onnx.helper.make_node("Add", ["h", "b1"], ["hb"]),
            onnx.helper.make_node("Relu", ["hb"], ["r"]),
            onnx.helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "dense",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 64])],
        [weight("w1", 64, 64), weight("b1", 64), weight("w2", 64, 64)],
    )
    path = folder / "dense.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def structure(result) -> list:
    return [(part.backend, part.pattern, tuple(part.nodes)) for part in result.placement.partitions]


def optimize(tmp_path, name, **options):
    """The dense model optimized into ``tmp_path / name`` (quick repeats, tvm and dnnl, no baselines unless asked)."""
    options = {"settings": QUICK, "backends": ["tvm", "dnnl"], "cost_db": tmp_path / "costs.sqlite", "compare_backends": False, **options}
    return collage_core.optimize(dense_model(tmp_path), output_dir=tmp_path / name, calibration_rounds=0, show_progress=False, **options)


def test_the_placement_measured_remotely_is_the_local_one_given_the_same_costs_and_passes_numerics_there(
    shared_cluster, tmp_path, monkeypatch
):
    for name in THREAD_VARIABLES:  # the machine's defaults here, as on the servers: the same cost keys
        monkeypatch.delenv(name, raising=False)
    local = optimize(tmp_path, "local")
    # Into the same folder: the end of the local run (verified and timed here) is not taken for the servers'.
    remotely = optimize(tmp_path, "local", rpc_tracker=shared_cluster.address, rpc_key=KEY)
    assert "reusing the run before" not in remotely.phases_s
    assert remotely.measurement.measured == 0  # every cost read from those measured here: the keys are shared
    assert structure(remotely) == structure(local)
    assert remotely.verification.passed and remotely.latency().is_measured
    assert remotely.placement.target == local.placement.target
    replayed = optimize(
        tmp_path, "replay", rpc_tracker=shared_cluster.address, rpc_key=KEY, placement=tmp_path / "local" / "placement.json"
    )
    assert structure(replayed) == structure(local) and replayed.verification.passed


@pytest.mark.slow
def test_a_server_killed_mid_run_costs_only_the_measurement_in_flight(cluster, tmp_path, caplog):
    killer = kill_after_the_first_cost(cluster, tmp_path, cluster.servers[0])
    # Long enough a measurement that the kill finds the servers busy.
    slower = attrs.evolve(QUICK, min_repeats=4, max_repeats=4, min_repeat_ms=60.0)
    result = optimize(tmp_path, "out", rpc_tracker=cluster.address, rpc_key=KEY, settings=slower)
    killer.join()
    assert result.measurement.measured == result.measurement.distinct > 2
    assert result.measurement.invalid == 0
    assert result.verification.passed
    assert any("stopped answering" in record.getMessage() for record in caplog.records)


def kill_after_the_first_cost(cluster, tmp_path, server, how=signal.SIGKILL) -> threading.Thread:
    """A thread that sends ``how`` to ``server`` and what it started once the first cost is in the database."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with sqlite3.connect(tmp_path / "costs.sqlite") as db:
                    if db.execute("SELECT COUNT(*) FROM costs").fetchone()[0] >= 1:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.05)
        os.killpg(server.pid, how)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # a server stopped mid-run: a cluster of its own
def test_a_server_that_hangs_costs_only_the_measurement_in_flight(cluster, tmp_path, caplog):
    # Stopped, it neither answers nor hangs up: the measurement in flight runs out of time and goes to the other.
    stopper = kill_after_the_first_cost(cluster, tmp_path, cluster.servers[0], signal.SIGSTOP)
    slower = attrs.evolve(QUICK, min_repeats=4, max_repeats=4, min_repeat_ms=60.0, timeout_s=8.0)
    result = optimize(tmp_path, "out", rpc_tracker=cluster.address, rpc_key=KEY, settings=slower)
    stopper.join()
    assert result.measurement.measured == result.measurement.distinct > 2
    assert result.measurement.invalid == 0
    assert result.verification.passed
    assert any("timed out" in record.getMessage() and "goes back to the queue" in record.getMessage() for record in caplog.records)


@pytest.mark.slow
def test_a_server_of_another_key_is_left_alone(cluster, tmp_path):
    (other,) = cluster.add_servers("another-key", 1)
    servers = remote.connect(cluster.address, KEY)
    assert len(servers.servers) == 2
    result = optimize(tmp_path, "out", rpc_tracker=cluster.address, rpc_key=KEY)
    assert set(result.measurement.servers) <= set(servers.servers)
    assert other.poll() is None
    with pytest.raises(remote.RemoteError, match="no server is registered under key 'missing'.*keys there: another-key, collage-test"):
        remote.connect(cluster.address, "missing")


@pytest.mark.slow  # two shapes of a model measured and checked on the servers: about a minute
def test_several_shapes_are_measured_on_the_servers_and_their_one_library_checked_there(shared_cluster, tmp_path, monkeypatch):
    asked = []
    run_in = optimize_shapes._run_in

    def recorded(*args):
        asked.append(args[-1])  # what the worker is told of the servers
        return run_in(*args)

    monkeypatch.setattr(optimize_shapes, "_run_in", recorded)
    result = collage_core.optimize(
        str(DYNAMIC_BERT),
        shapes="batch=1,2 sequence=8",
        backends=["tvm", "dnnl"],
        rpc_tracker=shared_cluster.address,
        rpc_key=KEY,
        cost_db=tmp_path / "costs.sqlite",
        output_dir=tmp_path / "out",
        calibration_rounds=0,
        settings=QUICK,
        show_progress=False,
    )
    assert result.verified and len(result.checks) == 3  # each shape, and one padded
    assert len(asked) == 3 and all(request and request["key"] == KEY for request in asked)  # each run on a server
    assert all(shape.measurement.measured > 0 for shape in result.shapes)
    ids, mask = np.ones((2, 8), np.int64), np.ones((2, 8), np.int64)
    (here,) = result.run(ids, mask)  # the library runs here too: the servers' CPU is this one
    assert here.shape == (2, 8, 64)


@pytest.mark.skipif(bool(gpu_description()), reason="the servers here have a GPU: the gpu test below measures on it")
def test_a_cuda_target_on_servers_without_a_gpu_is_one_line_naming_the_server(shared_cluster, tmp_path):
    with pytest.raises(remote.RemoteError) as refused:
        optimize(tmp_path, "out", rpc_tracker=shared_cluster.address, rpc_key=KEY, target="cuda", backends=["tvm"])
    said = str(refused.value)
    assert re.fullmatch(rf"server 127\.0\.0\.1:\d+ \(key '{KEY}'\) cannot run a CUDA target: it has no CUDA GPU.*", said)
    assert not (tmp_path / "out").exists()


def test_a_servers_gpu_named_in_its_target_keys_its_costs_apart_from_this_machines():
    served = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90", "model": "NVIDIA H100 80GB HBM3, compute capability 9.0, CUDA 13.0"})
    assert tvm_compat.device_name(served) == "cuda:sm_90 (NVIDIA H100 80GB HBM3, compute capability 9.0, CUDA 13.0)"
    assert tvm_compat.device_name(tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"})) == "cuda:sm_90" + (
        f" ({gpu_description()})" if gpu_description() else ""
    )


@pytest.mark.gpu
def test_a_cuda_placement_is_measured_and_verified_on_a_server_of_this_gpu(tmp_path):
    """On a GPU machine: a tracker and one server here, the candidates built for the server's GPU and timed there,
    the placement verified against ONNX Runtime with the outputs the server computed; its latency within the noise
    of the same search measured here (the default repeats, both)."""
    started = LocalCluster()
    gpu_options = dict(target="cuda", backends=["tvm", "cublas"], settings=MeasureSettings())
    try:
        started.start()
        started.add_servers(KEY, 1, fork=False)
        result = optimize(tmp_path, "out", rpc_tracker=started.address, rpc_key=KEY, **gpu_options)
    finally:
        started.stop()
    here = optimize(tmp_path, "here", cost_db=tmp_path / "costs-here.sqlite", **gpu_options)
    remote_s, here_s = result.latency().median_s, here.latency().median_s
    print(f"through RPC {remote_s * 1e6:.1f} us ({structure(result)}), here {here_s * 1e6:.1f} us ({structure(here)})")
    assert 2 / 3 < remote_s / here_s < 3 / 2
    gpu = tvm_compat.target_to_dict(tvm_compat.make_target(result.placement.target))
    assert gpu["kind"] == "cuda" and gpu["arch"].startswith("sm_") and "compute capability" in gpu["model"]
    assert result.measurement.measured > 0 and result.verification.passed and result.latency().is_measured
    with sqlite3.connect(tmp_path / "costs.sqlite") as db:
        devices = {row[0] for row in db.execute("SELECT device FROM costs")}
    assert devices and all(gpu["model"] in device for device in devices)


def test_a_tracker_that_cannot_be_reached_is_one_line_before_anything_is_built(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(remote.RemoteError) as refused:
        optimize(tmp_path, "out", rpc_tracker=address, rpc_key=KEY)
    assert time.monotonic() - started < 10
    assert str(refused.value).startswith(f"the RPC tracker at {address} cannot be reached")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_backends_that_call_python_at_run_time_are_left_out_in_one_line_each():
    pm = get_plugin_manager()
    found = discover_backends(pm)
    said = []
    kept = remote.measurable_remotely(pm, list(found.values()), said.append)
    kept_names = {info.name for info in kept}
    assert {"tvm", "dnnl"} & set(found) <= kept_names
    for engine in {"onnxruntime", "openvino", "inductor"} & set(found):
        assert engine not in kept_names
        assert f"{engine}: its partitions call Python at run time, so it cannot be measured remotely; left out" in said


@pytest.mark.slow
def test_collage_backends_lists_the_servers_and_what_they_run(shared_cluster, capsys):
    from collage_core import cli

    assert cli.main(["backends", "--rpc-tracker", shared_cluster.address, "--rpc-key", KEY]) == 0
    out = capsys.readouterr().out
    assert f"key {KEY}: 2 server(s)" in out
    assert "runs llvm:" in out
    servers = out.split("servers of the RPC tracker", 1)[1]
    assert ("\n  GPU" in servers) == bool(gpu_description())  # a server on a GPU machine says what of its GPU
    assert "backends measurable there (--target cuda" in out


class ScriptedWorker:
    """A stand-in for the local worker that holds a session on a server: each worker's sessions go to one server,
    the workers' to the servers in turn, and every request sent to a server named in ``failing`` is lost as a
    dropped connection loses it."""

    servers = ["good:1", "bad:2"]
    failing = {"bad:2"}
    taken = 0
    lost = 0
    lock = threading.Lock()

    def __init__(self, plugin_modules, disabled):
        self.server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        pass

    def request(self, message, timeout_s):
        if message["op"] == "remote_connect":
            with ScriptedWorker.lock:
                if self.server is None:
                    self.server = ScriptedWorker.servers[ScriptedWorker.taken % len(ScriptedWorker.servers)]
                    ScriptedWorker.taken += 1
            return {"server": self.server}
        if self.server in ScriptedWorker.failing:
            with ScriptedWorker.lock:
                ScriptedWorker.lost += 1
            raise remote.WorkerFailure(f"the server {remote.LOST}")
        deadline = time.monotonic() + 10  # the good server measures once the failing one has had items of its own
        while ScriptedWorker.lost < remote.FAILURES_LEFT_OUT and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"measured_on": self.server, "item": message["item"]}


def test_a_server_that_fails_twice_is_left_out_in_one_line_and_every_item_is_measured_by_the_others(monkeypatch, caplog):
    monkeypatch.setattr(remote, "MeasurementWorker", ScriptedWorker)
    monkeypatch.setattr(ScriptedWorker, "taken", 0)
    monkeypatch.setattr(ScriptedWorker, "lost", 0)
    servers = remote.RemoteServers("127.0.0.1", 9, KEY, target=None, servers=tuple(ScriptedWorker.servers))
    done = {}

    def on_done(item, response, reason):
        done[item] = (response, reason)

    pool = remote.RemotePool(servers, [], [], lambda item: {"op": "time_remote", "item": item}, on_done, timeout_s=5.0)
    for item in range(8):
        pool.add(item)
    pool.start(servers=2)
    pool.join()
    assert sorted(done) == list(range(8))
    assert {response["measured_on"] for response, _ in done.values()} == {"good:1"}
    left_out = [record.getMessage() for record in caplog.records if "left out of this run" in record.getMessage()]
    assert left_out == [f"server bad:2 (key {KEY!r}) failed {remote.FAILURES_LEFT_OUT} times: left out of this run"]


class PoisonWorker(ScriptedWorker):
    """Sessions on ScriptedWorker's two servers, both good here; the item "poison" takes down whichever server runs
    it (a faulting kernel)."""

    def request(self, message, timeout_s):
        if message["op"] != "remote_connect" and message["item"] == "poison":
            raise remote.WorkerFailure(f"the server {remote.LOST}")
        if message["op"] == "remote_connect":
            return super().request(message, timeout_s)
        return {"measured_on": self.server, "item": message["item"]}


def test_an_item_that_takes_down_two_servers_is_its_own_doing_and_the_rest_is_measured(monkeypatch):
    monkeypatch.setattr(remote, "MeasurementWorker", PoisonWorker)
    monkeypatch.setattr(PoisonWorker, "taken", 0)
    servers = remote.RemoteServers("127.0.0.1", 9, KEY, target=None, servers=tuple(ScriptedWorker.servers))
    done = {}
    pool = remote.RemotePool(
        servers, [], [], lambda item: {"op": "time_remote", "item": item}, lambda i, r, why: done.update({i: r}), timeout_s=5.0
    )
    for item in ["poison", *range(6)]:
        pool.add(item)
    pool.start(servers=2)
    pool.join()
    assert sorted(done, key=str) == sorted(["poison", *range(6)], key=str)
    poisoned = done["poison"]["cost"]
    assert poisoned["kind"] == "invalid" and "taken as its own doing" in poisoned["reason"]
    assert all(done[item]["measured_on"] in ScriptedWorker.servers for item in range(6))


def test_with_no_server_of_the_key_listed_any_more_the_queue_is_left_to_a_later_run_at_once(monkeypatch):
    monkeypatch.setattr(remote, "MeasurementWorker", ScriptedWorker)
    monkeypatch.setattr(remote, "tracker_summary", lambda tracker: ("127.0.0.1", 9, {"server_info": []}))
    monkeypatch.setattr(remote, "LISTED_WAIT_S", 0.5)
    servers = remote.RemoteServers("127.0.0.1", 9, KEY, target=None, servers=tuple(ScriptedWorker.servers))
    done = {}
    pool = remote.RemotePool(
        servers, [], [], lambda item: {"op": "time_remote", "item": item}, lambda i, r, why: done.update({i: why}), 5.0
    )
    pool.add("item")
    started = time.monotonic()
    pool.start(servers=2)
    pool.join()
    assert time.monotonic() - started < 10
    assert f"no server of key {KEY!r} left to measure it" in done["item"]


def test_servers_that_share_a_host_are_named_for_the_warning_that_they_time_each_others_load():
    servers = ["10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.1:9091", "10.0.0.1:9092", "[::1]:9090", "[::1]:9091"]
    assert remote.shared_hosts(servers) == {"10.0.0.1": 3, "[::1]": 2}
    assert remote.shared_hosts(["10.0.0.1:9090", "10.0.0.2:9090"]) == {}


@pytest.mark.slow  # 9 s on 2 cores: the placement measured on a server is run by default; the baselines and contest there add little
def test_with_compare_the_baselines_are_measured_and_the_contest_in_turns_runs_on_a_server(shared_cluster, tmp_path, monkeypatch):
    """``--compare`` through RPC: each baseline built here and timed on a server; the placement and its closest rivals
    then timed in turns in one session on one server, each run timed there."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    result = optimize(tmp_path, "out", compare_backends=True, rpc_tracker=shared_cluster.address, rpc_key=KEY)
    assert result.verification.passed
    rows = {row.name: row for row in result.end_to_end}
    print({name: (row.cost.median_s, row.timed_in_turns) for name, row in rows.items()})
    assert len(rows) >= 3 and all(row.cost.is_measured for row in rows.values())
    in_turns = [row for row in rows.values() if row.timed_in_turns]
    assert len(in_turns) >= 2 and all(row.after_pause is not None and row.after_pause.is_measured for row in in_turns)


@pytest.mark.slow  # tiny_bert's search, probes and verification through two servers: about a minute
def test_an_accuracy_budget_is_held_with_probes_run_on_the_servers(shared_cluster, tmp_path, monkeypatch):
    """At bf16 with ``--accuracy-budget``, each probe (a placement with some units in float32) built here and run on
    a server; the units kept in float32 hold the budget in the verification, which also ran there."""
    # TVM computes bfloat16 on any x86 CPU (slowly without bf16 units, which the check refuses): let it pass here.
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(tvm_compat, "llvm_target_has_any_feature", lambda target, features: True)
    budget = 1e-4  # tiny_bert measures about 3e-4 with every unit at bf16 (tests/test_accuracy_budget.py)
    held = collage_core.optimize(
        str(Path(__file__).resolve().parents[1] / "models" / "tiny_bert.onnx"),
        backends=["tvm"],
        precision="bf16",
        accuracy_budget=budget,
        accuracy_blocks=2,
        cost_db=tmp_path / "costs.sqlite",
        output_dir=tmp_path / "out",
        calibration_rounds=0,
        show_progress=False,
        settings=QUICK,
        rpc_tracker=shared_cluster.address,
        rpc_key=KEY,
    )
    assert held.accuracy.probes[0].float32_units == () and held.accuracy.probes[0].error > budget
    assert held.accuracy.float32_units and held.verification.passed and held.verification.max_rel_error <= budget
