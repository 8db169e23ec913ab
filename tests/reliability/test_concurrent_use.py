"""Runs sharing one cost database at the same time: they divide the candidates and the placements
measured end to end between them, and a claim does not outlive the run that made it."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from collage_core.measure.cost_db import Claim, CostDatabase, CostKey
from collage_core.measure.timing import MeasureSettings
from collage_core.model.relax_graph import RelaxGraph
from collage_core.records import Cost

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"candidates: \d+; (\d+) distinct ones of op-level backends, costed one by one: measured (\d+) in [\d.]+ s, (\d+) from the cost database, (\d+) invalid"
)


def small_model(path: Path) -> Path:
    """Two dense layers and a softmax: a dozen candidates, so the two processes race over a few of them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)
        for name, shape in (("w1", (64, 64)), ("b1", (64,)), ("w2", (64, 32)), ("b2", (32,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["ob"]),
        helper.make_node("Softmax", ["ob"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "two_dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_two_processes_share_a_cost_database_and_both_finish(tmp_path):
    db = tmp_path / "costs.sqlite"
    model = small_model(tmp_path / "two_dense.onnx")
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "collage_core.cli",
                "optimize",
                str(model),
                "--backends",
                "tvm",
                "--search",
                "op-level",
                "--no-compare",
                "--calibration-rounds",
                "0",
                "--cost-db",
                str(db),
                "--output",
                str(tmp_path / f"out{i}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(2)
    ]
    results = [run.communicate(timeout=900) for run in runs]
    for run, (stdout, stderr) in zip(runs, results):
        assert run.returncode == 0, stderr[-2000:]
        assert "numerics passed" in stdout
    summaries = [SUMMARY.search(stdout) for stdout, _ in results]
    distinct = int(summaries[0].group(1))
    assert all(int(s.group(4)) == 0 for s in summaries)
    with sqlite3.connect(db) as connection:
        stored = connection.execute("SELECT COUNT(*) FROM costs").fetchone()[0]
    assert stored == distinct  # every candidate once, whichever process measured it
    assert all(int(s.group(2)) + int(s.group(3)) == distinct for s in summaries)
    assert sum(int(s.group(2)) for s in summaries) == distinct  # and measured once in all


RENDEZVOUS = "plugins_for_tests.rendezvous_cost_plugin"
UNARY_OPS = ("sigmoid", "tanh", "exp", "negative", "abs", "sin", "cos", "square", "floor", "ceil")


def chain_of_distinct_operators():
    """Ten different elementwise operators in a row: ten distinct single-operator candidates."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            for name in UNARY_OPS:
                value = bb.emit(getattr(relax.op, name)(value))
            output = bb.emit_output(value)
        bb.emit_func_output(output)
    return bb.get()


def measure_as(run: str, db_path: str, report_path: str) -> None:
    """A run in a process of its own: measures the chain's candidates on the rendezvous backend and
    writes how many it measured, how many are distinct and how many have a measured cost."""
    os.environ["RENDEZVOUS_RUN"] = run
    from collage_core import tvm_compat
    from collage_core.backends import contribute_patterns, discover_backends
    from collage_core.candidates.enumeration import enumerate_candidates
    from collage_core.measure.measurement import measure_candidates
    from collage_core.plugins import get_plugin_manager

    pm = get_plugin_manager(disabled=(), extra_modules=[RENDEZVOUS])
    backend = discover_backends(pm)["together"].backend
    target = tvm_compat.host_cpu_target()
    graph = RelaxGraph.from_function(chain_of_distinct_operators()["main"])
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backend, target))
    with CostDatabase.open(db_path) as db:
        report = measure_candidates(
            graph,
            candidates,
            {"together": backend},
            target,
            db,
            MeasureSettings(timeout_s=60.0, build_workers=1),
            [RENDEZVOUS],
            show_progress=False,
        )
    counts = [report.measured, report.distinct, sum(1 for cost in report.costs.values() if cost.is_measured)]
    Path(report_path).write_text(json.dumps(counts))


@pytest.mark.slow
def test_two_runs_measuring_at_once_measure_each_candidate_once_in_all(load_test_plugin, tmp_path, monkeypatch):
    """Each run's first measurement waits until the other run is measuring too, so both have looked
    their costs up before either stored one."""
    load_test_plugin(RENDEZVOUS)  # for PYTHONPATH, which the runs and their workers inherit
    (tmp_path / "rendezvous").mkdir()
    monkeypatch.setenv("RENDEZVOUS_DIR", str(tmp_path / "rendezvous"))
    monkeypatch.setenv("RENDEZVOUS_RUNS", "a,b")
    spawn = multiprocessing.get_context("spawn")
    runs = [spawn.Process(target=measure_as, args=(run, str(tmp_path / "costs.sqlite"), str(tmp_path / f"{run}.json"))) for run in "ab"]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=300)
        assert run.exitcode == 0
    reports = [json.loads((tmp_path / f"{run}.json").read_text()) for run in "ab"]
    distinct = len(UNARY_OPS)
    assert [counts[1:] for counts in reports] == [[distinct, distinct]] * 2  # both end with every cost
    assert sum(counts[0] for counts in reports) == distinct, reports  # each candidate measured by one of them


def key(candidate: int) -> CostKey:
    return CostKey("tvm", "0.27.0", '{"kind": "llvm"}', "cpu", f"{candidate:064x}")


MEASURED = Cost.measured(1.5e-3, 2e-5, 20)


def test_a_claim_holds_until_its_cost_is_stored_or_it_is_released(tmp_path):
    with CostDatabase.open(tmp_path / "c.sqlite") as first, CostDatabase.open(tmp_path / "c.sqlite") as second:
        assert first.claim(key(1), 3600).granted and first.claim(key(2), 3600).granted
        assert second.claim(key(1), 3600) == second.claim(key(2), 3600) == Claim()  # neither cost nor grant
        first.put(key(1), MEASURED)
        assert second.claim(key(1), 3600).cost == MEASURED  # looked up again
        first.release(key(2))
        assert second.claim(key(2), 3600).granted


def test_a_claim_past_its_lifetime_is_free_again(tmp_path):
    with CostDatabase.open(tmp_path / "c.sqlite") as first, CostDatabase.open(tmp_path / "c.sqlite") as second:
        assert first.claim(key(1), -1.0).granted  # it lapsed the moment it was made
        assert second.claim(key(1), 3600).granted


def claim_and_wait(db_path: str, claimed) -> None:
    """A run that claims candidate 1 and then hangs until it is killed."""
    with CostDatabase.open(db_path) as db:
        assert db.claim(key(1), 3600).granted
        claimed.set()
        signal.pause()


def test_a_claim_of_a_process_that_no_longer_exists_is_free_again(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    claimed = spawn.Event()
    holder = spawn.Process(target=claim_and_wait, args=(str(tmp_path / "c.sqlite"), claimed))
    holder.start()
    try:
        assert claimed.wait(timeout=60)
        with CostDatabase.open(tmp_path / "c.sqlite") as db:
            assert not db.claim(key(1), 3600).granted  # its run is still measuring it
            os.kill(holder.pid, signal.SIGKILL)
            os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie is no live run
            assert db.claim(key(1), 3600).granted
    finally:
        holder.kill()
        holder.join()


def test_a_claim_of_another_process_under_a_reused_pid_is_free_again(tmp_path):
    with CostDatabase.open(tmp_path / "c.sqlite") as first, CostDatabase.open(tmp_path / "c.sqlite") as second:
        assert first.claim(key(1), 3600).granted
        with contextlib.closing(sqlite3.connect(tmp_path / "c.sqlite", isolation_level=None)) as raw:
            raw.execute("UPDATE collage_claims SET process_started = '1'")  # as if the pid had been another's then
        assert second.claim(key(1), 3600).granted


FIXED = "plugins_for_tests.fixed_cost_plugin"
# A placement of one tiny operator builds and runs well within these, however busy the machine.
QUICK = MeasureSettings(warmup=1, min_repeats=1, max_repeats=2, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=60.0)
# Past this, a run measures without waiting for the other (one that never came).
RENDEZVOUS_LIMIT_S = 120.0


def three_operators():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = x
            for name in UNARY_OPS[:3]:
                value = bb.emit(getattr(relax.op, name)(value))
            output = bb.emit_output(value)
        bb.emit_func_output(output)
    return bb.get()


def placements() -> list:
    """One operator on the fixed-cost backend, the others on TVM: three different placements."""
    from collage_core.records import Partition

    def on(backend, node):
        return Partition(backend, f"{backend}.op", (node,), "", Cost.unknown())

    return [[on("fixedcost" if node == chosen else "tvm", node) for node in range(3)] for chosen in range(3)]


def evaluate_as(run: str, db_path: str, folder: str, report_path: str) -> None:
    """A run in a process of its own: measures the three placements end to end, one after another.

    It says it has begun once its first claim is answered, and its first build waits until the
    other run has begun too: so the other has looked the first placement up before it is stored,
    however the machine schedules the two."""
    from collage_core import tvm_compat
    from collage_core.backends import discover_backends, select_backends
    from collage_core.measure.job import Job
    from collage_core.model.model_import import load_model
    from collage_core.plugins import get_plugin_manager
    from collage_core.search.regions import genome_key

    began, others = Path(folder) / run, [Path(folder) / other for other in "ab" if other != run]
    workdir = Path(folder) / f"work-{run}"
    workdir.mkdir()
    claim_end_to_end, run_built = CostDatabase.claim_end_to_end, Job.run_built

    def claimed(db, key, lifetime_s):
        claim = claim_end_to_end(db, key, lifetime_s)
        began.touch()
        return claim

    built = []

    def built_together(job, parts, *args, **kwargs):
        built.append(genome_key(parts))
        deadline = time.monotonic() + RENDEZVOUS_LIMIT_S
        while not all(other.exists() for other in others) and time.monotonic() < deadline:
            time.sleep(0.05)
        return run_built(job, parts, *args, **kwargs)

    CostDatabase.claim_end_to_end, Job.run_built = claimed, built_together
    pm = get_plugin_manager(disabled=(), extra_modules=[FIXED])
    model = load_model(three_operators())
    job = Job(
        model,
        RelaxGraph.from_function(model.mod["main"], model.mod),
        tvm_compat.host_cpu_target(),
        pm,
        select_backends(discover_backends(pm), ["fixedcost", "tvm"]),
        QUICK,
        workdir,
        lambda _: None,
        False,
    )
    with CostDatabase.open(db_path) as db:
        evaluate = job.end_to_end_evaluator(db, cut_off=False)
        costs = [evaluate(parts).to_json() for parts in placements()]
    Path(report_path).write_text(json.dumps({"built": built, "costs": costs, "from_database": evaluate.from_database}))


@pytest.mark.slow
def test_two_runs_measuring_placements_at_once_measure_each_once_in_all(load_test_plugin, tmp_path):
    load_test_plugin(FIXED)  # for PYTHONPATH, which the runs and their workers inherit
    spawn = multiprocessing.get_context("spawn")
    runs = [
        spawn.Process(target=evaluate_as, args=(run, str(tmp_path / "costs.sqlite"), str(tmp_path), str(tmp_path / f"{run}.json")))
        for run in "ab"
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=600)
        assert run.exitcode == 0
    reports = [json.loads((tmp_path / f"{run}.json").read_text()) for run in "ab"]
    built = [key for report in reports for key in report["built"]]
    assert sorted(built) == sorted(set(built)) and len(built) == len(placements()), reports  # each once in all
    assert reports[0]["costs"] == reports[1]["costs"]  # both end with every cost: the one measured
    assert all(Cost.from_json(cost).is_measured for cost in reports[0]["costs"]), reports
    assert sum(report["from_database"] for report in reports) == len(placements())
    with sqlite3.connect(tmp_path / "costs.sqlite") as connection:
        assert connection.execute("SELECT COUNT(*) FROM end_to_end_costs").fetchone()[0] == len(placements())
        assert connection.execute("SELECT COUNT(*) FROM collage_claims").fetchone()[0] == 0  # none left behind


def test_a_placement_claim_holds_until_its_cost_is_stored_or_it_is_released(tmp_path):
    with CostDatabase.open(tmp_path / "c.sqlite") as first, CostDatabase.open(tmp_path / "c.sqlite") as second:
        assert first.claim_end_to_end("p1", 3600).granted and first.claim_end_to_end("p2", 3600).granted
        assert second.claim_end_to_end("p1", 3600) == second.claim_end_to_end("p2", 3600) == Claim()
        assert second.claim(key(1), 3600).granted  # a candidate's claim is another thing
        first.put_end_to_end("p1", MEASURED, effort_s=2.5)
        assert second.claim_end_to_end("p1", 3600) == Claim(MEASURED, effort_s=2.5)
        first.release_end_to_end("p2")
        assert second.claim_end_to_end("p2", 3600).granted


def test_a_placement_claimed_by_a_dead_run_is_measured_and_one_held_too_long_is_measured_anyway(tmp_path):
    from collage_core.measure.job import EndToEndEvaluator
    from collage_core.records import Partition

    class Job:  # what the evaluator asks of a job
        def __init__(self):
            self.runs, self.said, self.measured_end_to_end = [], [], {}

        def end_to_end_key(self, parts):
            return parts[0].backend

        def run_built(self, parts, library, cutoff_s=None, run_limit_s=None):
            self.runs.append(parts[0].backend)
            return [], MEASURED

        def say(self, message):
            self.said.append(message)

    def placed_on(backend):
        return [Partition(backend, f"{backend}.op", (0,), "", Cost.unknown())]

    job = Job()
    with CostDatabase.open(tmp_path / "c.sqlite") as holder, CostDatabase.open(tmp_path / "c.sqlite") as db:
        assert holder.claim_end_to_end("held", 3600).granted and holder.claim_end_to_end("dead", 3600).granted
        with contextlib.closing(sqlite3.connect(tmp_path / "c.sqlite", isolation_level=None)) as raw:
            raw.execute("UPDATE collage_claims SET process_started = '1' WHERE key LIKE '%dead%'")  # its run is gone
        evaluate = EndToEndEvaluator(job, db, cut_off=False, claim_lifetime_s=0.5)
        started = time.monotonic()
        assert evaluate(placed_on("dead")) == MEASURED
        assert time.monotonic() - started < 0.5  # not waited for
        assert evaluate(placed_on("held")) == MEASURED  # waited for half a second, then measured here
        assert job.runs == ["dead", "held"]
        assert "another run is measuring it, waiting for its cost" in job.said[-2]
        assert evaluate(placed_on("held")) == MEASURED and evaluate.from_database == 1


def test_a_baseline_another_run_is_measuring_is_waited_for_not_measured_again(tmp_path):
    """The baselines (each backend alone, TVM's unpartitioned build) are claimed as placements are: a
    run finding one claimed waits for its cost; one whose build fails gives its claim up."""
    import threading

    from collage_core.build.stage import baseline_cost
    from collage_core.errors import CollageError
    from collage_core.measure.job import BASELINE_PROTOCOL

    class Job:  # what baseline_cost asks of a job
        settings = MeasureSettings()

        def __init__(self, fails=False):
            self.runs, self.said, self.fails = [], [], fails

        def end_to_end_key(self, parts, protocol, cuda_graphs):
            return f"{parts}-{protocol}"

        def run_built(self, parts, library, run_limit_s=None, cuda_graphs=None):
            self.runs.append(parts)
            if self.fails:
                raise CollageError("the build failed")
            return [], MEASURED

        def say(self, message):
            self.said.append(message)

    with CostDatabase.open(tmp_path / "c.sqlite") as other, CostDatabase.open(tmp_path / "c.sqlite") as db:
        key = Job().end_to_end_key("tvm alone", BASELINE_PROTOCOL, None)
        assert other.claim_end_to_end(key, 3600).granted

        def store():  # the other run's measurement ends (a connection of its own: this is another thread)
            with CostDatabase.open(tmp_path / "c.sqlite") as late:
                late.put_end_to_end(key, MEASURED, effort_s=1.0)

        storing = threading.Timer(0.3, store)
        storing.start()
        job = Job()
        assert baseline_cost(job, "tvm alone", "tvm alone", None, db) == MEASURED
        storing.join()
        assert job.runs == [] and any("another run is measuring it" in said for said in job.said)

        failing = Job(fails=True)
        assert baseline_cost(failing, "dnnl alone", "dnnl alone", None, db).kind == "invalid"
        assert failing.runs == ["dnnl alone"]
        assert other.claim_end_to_end(failing.end_to_end_key("dnnl alone", BASELINE_PROTOCOL, None), 3600).granted  # given up
