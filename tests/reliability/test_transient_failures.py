"""Workers that fail for no fault of what they measure: killed from outside, or out of time while the
machine kept them waiting. Retried once; a failure that stays transient is stored as such and
measured again by the next run; a kill that repeats is the candidate's own."""

from __future__ import annotations

import logging

import pytest
import tvm
from plugins_for_tests.transient_faults import ATTEMPTS, BACKENDS, HELD_UP_TWICE, KILLED_ALWAYS, KILLED_ONCE, MEASURED, TERMINATED_ONCE
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.cost_db import CostDatabase, is_transient
from collage_core.measure.measurement import measure_candidates
from collage_core.measure.timing import MeasureSettings
from collage_core.model.relax_graph import RelaxGraph

PLUGIN = "plugins_for_tests.transient_faults"
# Long enough for a worker to measure a tiny candidate on a busy machine; the held-up backend waits it out twice.
TIMEOUT_S = 3.0
QUICK = MeasureSettings(warmup=1, min_repeats=1, max_repeats=2, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=TIMEOUT_S, build_workers=1)


@pytest.fixture
def plugins(load_test_plugin, monkeypatch, tmp_path):
    """The transient-fault backends, counting their attempts in a folder of this test."""
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    monkeypatch.setenv(ATTEMPTS, str(attempts))
    return load_test_plugin(PLUGIN)


def one_relu() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(output)
    return bb.get()


def measure(plugins, db):
    pm, backends = plugins
    graph = RelaxGraph.from_function(one_relu()["main"])
    target = tvm_compat.host_cpu_target()
    candidates = [c for name in BACKENDS for c in enumerate_candidates(graph, contribute_patterns(pm, backends[name], target))]
    report = measure_candidates(
        graph, candidates, {name: backends[name] for name in BACKENDS}, target, db, QUICK, plugin_modules=[PLUGIN], show_progress=False
    )
    return report, {c.backend: report.costs[c.key] for c in candidates}


def test_killed_workers_are_retried_and_a_held_up_one_is_measured_again_by_the_next_run(plugins, tmp_path, caplog):
    path = tmp_path / "costs.sqlite"
    with caplog.at_level(logging.WARNING, logger="collage"), CostDatabase.open(path) as db:
        report, cost_of = measure(plugins, db)
        assert cost_of[KILLED_ONCE] == MEASURED and cost_of[TERMINATED_ONCE] == MEASURED
        assert "crashed with SIGKILL, twice in a row" in cost_of[KILLED_ALWAYS].reason
        assert not is_transient(cost_of[KILLED_ALWAYS])
        held_up = cost_of[HELD_UP_TWICE]
        assert is_transient(held_up) and "waiting for a processor" in held_up.reason, held_up
        assert (report.measured, report.invalid) == (4, 2)
        # In the run that stored it, a transient failure is known like any other cost.
        assert measure(plugins, db)[0].measured == 0
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    for backend, said in [
        (KILLED_ONCE, "crashed with SIGKILL"),
        (TERMINATED_ONCE, "crashed with SIGTERM"),
        (HELD_UP_TWICE, "a later run measures it again"),
    ]:
        assert any(message.startswith(f"{backend} candidate ") and said in message for message in warnings), backend

    with CostDatabase.open(path) as db:
        again, cost_of = measure(plugins, db)
    assert (again.measured, again.from_database) == (1, 3)
    assert cost_of[HELD_UP_TWICE] == MEASURED  # its third attempt, in the next run
    assert "twice in a row" in cost_of[KILLED_ALWAYS].reason  # the candidate's own: kept


@pytest.mark.slow
def test_remeasure_invalid_measures_every_invalid_cost_again(plugins, tmp_path):
    path = tmp_path / "costs.sqlite"
    with CostDatabase.open(path) as db:
        measure(plugins, db)
    with CostDatabase.open(path, remeasure_invalid=True) as db:
        again, cost_of = measure(plugins, db)
        assert again.measured == 2  # the candidate killed every time, and the held-up one
        assert cost_of[HELD_UP_TWICE] == MEASURED and "twice in a row" in cost_of[KILLED_ALWAYS].reason
        assert measure(plugins, db)[0].measured == 0  # what this run measured is not measured again in it


@pytest.mark.slow
def test_placements_killed_from_outside_are_retried_and_a_held_up_one_is_measured_again_by_the_next_run(
    plugins, tmp_path, caplog, monkeypatch
):
    from collage_core.backends import discover_backends, select_backends
    from collage_core.measure import job as job_module
    from collage_core.measure.job import Job
    from collage_core.model.model_import import load_model
    from collage_core.records import Cost, Partition

    monkeypatch.setattr(job_module, "BUILD_TIMEOUT_S", 0.0)  # a placement of one ReLU builds within TIMEOUT_S
    pm, _ = plugins
    model = load_model(one_relu())
    chosen = select_backends(discover_backends(pm), list(BACKENDS))
    job = Job(
        model,
        RelaxGraph.from_function(model.mod["main"], model.mod),
        tvm_compat.host_cpu_target(),
        pm,
        chosen,
        QUICK,
        tmp_path,
        lambda message: None,
        False,
    )

    def placed_on(backend):
        return [Partition(backend, f"{backend}.op", (0,), "", Cost.unknown())]

    path = tmp_path / "costs.sqlite"
    with caplog.at_level(logging.WARNING, logger="collage"), CostDatabase.open(path) as db:
        evaluate = job.end_to_end_evaluator(db, cut_off=False)
        assert evaluate(placed_on(KILLED_ONCE)).is_measured
        assert "crashed with SIGKILL, twice in a row" in evaluate(placed_on(KILLED_ALWAYS)).reason
        held_up = evaluate(placed_on(HELD_UP_TWICE))
        assert is_transient(held_up), held_up
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(message.startswith(f"placement of 1 partition on {KILLED_ONCE}: worker crashed with SIGKILL") for message in warnings), (
        warnings
    )
    assert any(message.startswith(f"placement of 1 partition on {HELD_UP_TWICE}: transient failure") for message in warnings), warnings

    with CostDatabase.open(path) as db:
        evaluate = job.end_to_end_evaluator(db, cut_off=False)
        assert evaluate(placed_on(HELD_UP_TWICE)).is_measured  # measured again: its third attempt lowers
        assert "twice in a row" in evaluate(placed_on(KILLED_ALWAYS)).reason
        assert evaluate.from_database == 1  # the placement killed every time: the placement's own


def test_collage_optimize_remeasure_invalid_measures_a_stored_failure_again(load_test_plugin, tmp_path, monkeypatch):
    """``--remeasure-invalid`` reaches the cost database: a candidate whose stored cost is a failure is read
    as stored by a plain run and measured again by one with the option."""
    import collage_core
    from collage_core import cli, optimizer
    from collage_core.errors import CollageError

    pm, _ = load_test_plugin("plugins_for_tests.faulty_backends")
    monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: pm)
    path = tmp_path / "costs.sqlite"

    def run(**options):
        return collage_core.optimize(
            one_relu(),
            backends=["raising", "tvm"],
            cost_db=path,
            settings=QUICK,
            search="op-level",
            calibration_rounds=0,
            compare_backends=False,
            show_progress=False,
            **options,
        ).measurement

    first = run()
    assert first.invalid == 1 and first.measured == 2
    assert (run().measured, run(remeasure_invalid=True).measured) == (0, 1)

    def refused(model, *, options):
        raise CollageError(f"remeasure_invalid={options.remeasure_invalid}")

    monkeypatch.setattr(optimizer, "optimize", refused)
    for flag, passed in (([], False), (["--remeasure-invalid"], True)):
        with pytest.raises(CollageError, match=f"remeasure_invalid={passed}"):
            cli._optimize(cli._parser().parse_args(["optimize", "model.onnx", "-o", str(tmp_path / "out"), *flag]))


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "Command line: /usr/bin/g++ -shared -o lib.so a.o\nCompilation error:\n/usr/bin/ld: final link failed: No space left on device"
        ),
        OSError(28, "No space left on device"),
    ],
    ids=["linker", "python"],
)
def test_a_full_disk_is_a_transient_failure_that_a_later_run_measures_again(error):
    """A build that fails because the disk is full says so, and is stored as the machine's doing, not the candidate's."""
    from collage_core.measure.worker import describe_failure
    from collage_core.records import Cost

    reason = describe_failure(error)
    assert "the disk is full" in reason and "\n" not in reason
    assert is_transient(Cost.invalid(f"building or running the placement failed: {reason}"))
    assert not is_transient(Cost.invalid(describe_failure(RuntimeError("Command line: g++\nerror: 'x' was not declared"))))
