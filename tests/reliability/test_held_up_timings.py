"""Timings that other processes hold up: a candidate whose threads waited for a processor a quarter of its
timing or more is timed again after a pause; held up twice, its cost is used, stored marked held up, named
in a warning and the report, and measured again by ``--remeasure-held-up``.

The load is made deterministic: the timed thread shares one processor with three (or two) processes
spinning on it, so it waits most of the time whatever else the machine runs. Nothing here asserts that a
timing was *not* held up, which would depend on the machine's load."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from plugins_for_tests.held_up_timings import ATTEMPTS, BACKENDS, HELD_UP_ALWAYS, HELD_UP_ONCE, MEASURED
from test_output_folder import relu_model
from test_transient_failures import one_relu

import collage_core
from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure import zygote
from collage_core.measure.cost_db import CostDatabase, CostDatabaseError
from collage_core.measure.measurement import measure_candidates
from collage_core.measure.processor_wait import HELD_UP_SHARE, waiting
from collage_core.measure.timing import MeasureSettings, time_callable
from collage_core.model.relax_graph import RelaxGraph
from collage_core.records import Cost
from collage_core.search.stage import held_up_warning

PLUGIN = "plugins_for_tests.held_up_timings"
QUICK = MeasureSettings(warmup=1, min_repeats=1, max_repeats=2, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=60.0, build_workers=1)


@pytest.fixture
def plugins(load_test_plugin, monkeypatch, tmp_path):
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    monkeypatch.setenv(ATTEMPTS, str(attempts))
    return load_test_plugin(PLUGIN)


def attempts(tmp_path: Path, backend: str) -> int:
    return sum(1 for _ in (tmp_path / "attempts").glob(f"{backend}-*"))


def measure(plugins, db):
    pm, backends = plugins
    graph = RelaxGraph.from_function(one_relu()["main"])
    target = tvm_compat.host_cpu_target()
    candidates = [c for name in BACKENDS for c in enumerate_candidates(graph, contribute_patterns(pm, backends[name], target))]
    report = measure_candidates(
        graph, candidates, {name: backends[name] for name in BACKENDS}, target, db, QUICK, plugin_modules=[PLUGIN], show_progress=False
    )
    return report, {c.backend: c.key for c in candidates}


def test_a_held_up_timing_is_timed_again_and_one_held_up_twice_is_stored_marked_until_remeasured(plugins, tmp_path):
    path = tmp_path / "costs.sqlite"
    with CostDatabase.open(path) as db:
        report, key_of = measure(plugins, db)
    held_up = report.costs[key_of[HELD_UP_ALWAYS]]
    assert held_up.held_up and held_up.held_up_share >= HELD_UP_SHARE, held_up
    assert held_up.median_s == MEASURED.median_s  # used as measured
    assert key_of[HELD_UP_ALWAYS] in report.held_up
    assert key_of[HELD_UP_ONCE] not in report.held_up or report.costs[key_of[HELD_UP_ONCE]].held_up
    # Each held-up timing was timed once more, after a pause; no more than that.
    assert attempts(tmp_path, HELD_UP_ALWAYS) == 2 and attempts(tmp_path, HELD_UP_ONCE) == 2

    with CostDatabase.open(path) as db:
        again, _ = measure(plugins, db)
    assert again.measured == 0  # a later run reads held-up costs as they are, and says so
    assert again.costs[key_of[HELD_UP_ALWAYS]] == held_up and key_of[HELD_UP_ALWAYS] in again.held_up

    with CostDatabase.open(path, remeasure_held_up=True) as db:
        remeasured, _ = measure(plugins, db)
    assert remeasured.measured == len(report.held_up)  # exactly the held-up ones
    assert attempts(tmp_path, HELD_UP_ALWAYS) == 4


def test_a_held_up_cost_keeps_its_mark_through_json_and_the_database(tmp_path):
    cost = Cost.measured(1e-3, 1e-5, 5, held_up_share=0.62)
    assert Cost.from_json(json.loads(json.dumps(cost.to_json()))) == cost
    assert "held_up_share" not in Cost.measured(1e-3, 1e-5, 5).to_json()
    assert not Cost.invalid("no").with_held_up_share(0.5).held_up
    path = tmp_path / "costs.sqlite"
    with CostDatabase.open(path) as db:
        db.put_end_to_end("placement", cost)
    with CostDatabase.open(path) as db:
        assert db.get_end_to_end("placement") == cost
    with CostDatabase.open(path, remeasure_held_up=True) as db:
        assert db.get_end_to_end("placement") is None


def test_a_stored_held_up_mark_no_collage_wrote_is_refused_naming_the_file(tmp_path):
    import sqlite3

    path = tmp_path / "costs.sqlite"
    with CostDatabase.open(path) as db:
        db.put_end_to_end("placement", Cost.measured(1e-3, 1e-5, 5, held_up_share=0.5))
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("UPDATE end_to_end_costs SET reason = reason || 'x'")
    with CostDatabase.open(path) as db, pytest.raises(CostDatabaseError, match="costs.sqlite: a stored cost is not one Collage wrote"):
        db.get_end_to_end("placement")


@contextlib.contextmanager
def spinning_beside_this_process(count: int):
    """This process, and the workers it starts, on one processor, with ``count`` processes spinning on it. Workers
    are forked from a zygote that keeps the processors it started with: those running now are closed before and
    after, so that the workers start here and no later test inherits the one processor."""
    cores = os.sched_getaffinity(0)
    one = {min(cores)}
    # Each in a session of its own, as the workers are: Linux's autogroups share a processor between sessions first.
    spinners = [
        subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {one!r})\nwhile True: pass"], start_new_session=True)
        for _ in range(count)
    ]
    zygote.close_all()
    os.sched_setaffinity(0, one)
    try:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:  # the spinners have started spinning once this process waits beside them
            with waiting() as waited:
                sum(range(200_000))
            if waited.share > 0.0:
                break
        yield
    finally:
        os.sched_setaffinity(0, cores)
        zygote.close_all()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# 11 s on 2 cores, with busy processes beside real TVM timings; the test plugin's held-up timings above take the same
# path by default.
@pytest.mark.slow
def test_real_tvm_timings_beside_busy_processes_are_marked_reported_and_remeasured_on_request(tmp_path, capfd):
    model = tmp_path / "relu.onnx"
    model.write_bytes(relu_model().SerializeToString())
    db = tmp_path / "costs.sqlite"

    def run(out: str, **options):
        return collage_core.optimize(
            model,
            backends=["tvm"],
            search="op-level",
            compare_backends=False,
            calibration_rounds=0,
            verify=False,
            output_dir=tmp_path / out,
            cost_db=db,
            show_progress=True,
            **options,
        )

    with spinning_beside_this_process(2):
        busy = run("busy")
    assert busy.measurement.held_up and set(busy.measurement.held_up) <= set(busy.measurement.costs)
    assert all(busy.measurement.costs[key].held_up_share >= HELD_UP_SHARE for key in busy.measurement.held_up)
    assert held_up_warning(len(busy.measurement.held_up)) in capfd.readouterr().err
    results = json.loads((tmp_path / "busy" / "results.json").read_text())
    assert sorted(results["measurement"]["held_up"]) == sorted(busy.measurement.held_up)
    assert "held up (timed while other processes kept the processors busy" in (tmp_path / "busy" / "report.txt").read_text()

    again = run("again", remeasure_held_up=True)
    assert again.measurement.measured == len(busy.measurement.held_up)


def test_the_held_up_line_counts_in_words():
    assert held_up_warning(1).startswith("1 candidate's cost was timed while")
    assert held_up_warning(3).startswith("3 candidates' costs were timed while")


def test_a_finished_run_with_a_held_up_latency_is_not_reused_under_remeasure_held_up(tmp_path):
    from collage_core.outputs import reuse
    from collage_core.outputs.end_to_end import EndToEnd

    held_up = EndToEnd("placement", Cost.measured(1e-3, 1e-5, 5, held_up_share=0.6), {"tvm": 1})
    finished = SimpleNamespace(end_to_end=[held_up])
    said = []
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(reuse, "load_finished", lambda directory, library, key: reuse.Lookup(finished=finished))
        assert reuse.run_before(tmp_path, tmp_path / "m.so", None, said.append) is finished
        assert reuse.run_before(tmp_path, tmp_path / "m.so", None, said.append, remeasure_held_up=True) is None
    assert "is not reused: some of its latencies were timed while other processes kept the processors busy" in said[-1]


def spin_runs(number: int) -> float:
    """``number`` runs of a busy loop of 20 ms, several of the scheduler's time slices; seconds per run."""
    started = time.perf_counter()
    for _ in range(number):
        deadline = time.perf_counter() + 20e-3
        while time.perf_counter() < deadline:
            pass
    return (time.perf_counter() - started) / number


@pytest.mark.parametrize("cutoff_s", [None, 1e-4], ids=["repeated", "cut off after one run"])
def test_time_callable_marks_runs_after_the_warm_up_held_up_unless_they_run_elsewhere(cutoff_s):
    settings = MeasureSettings(warmup=1, min_repeats=3, max_repeats=3, min_repeat_ms=10.0, cutoff_s=cutoff_s)
    with spinning_beside_this_process(2):
        held_up = time_callable(spin_runs, settings)
        elsewhere = time_callable(spin_runs, settings, judge_waiting=False)
    assert held_up.held_up_share >= HELD_UP_SHARE and held_up.repeats == (1 if cutoff_s else 3), held_up
    assert not elsewhere.held_up and elsewhere.is_measured
