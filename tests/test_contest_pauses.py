"""The contest times each library warm, back to back, and after a pause, keeps the two apart in every
row timed in turns and in the report, and chooses by the warm figure, or with ``--latency after-pause`` by the
figure after a pause (see collage_core.measure.in_turns).

The backends here are a test plugin's (tests/plugins_for_tests/pause_sensitive.py) whose runs sleep set
times, so which library is faster each way does not depend on this machine's load."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import pytest
from tvm import relax

import collage_core
from collage_core.outputs.end_to_end import PLACEMENT, SEARCHED
from collage_core.search.baselines import IN_TURNS


def _contest(tmp_path_factory, **options):
    """A one-relu model over both test backends: the search places it on ``pausesensitive`` (faster warm),
    and ``steady alone`` (faster after a pause) meets it in the contest, every turn after a 0.3 s pause."""
    from collage_core import optimizer
    from collage_core.build import stage as build_stage
    from collage_core.measure import in_turns
    from collage_core.plugins import get_plugin_manager

    tests = str(Path(__file__).resolve().parent)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.syspath_prepend(tests)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
        from plugins_for_tests import pause_sensitive

        module = "plugins_for_tests.pause_sensitive"
        monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: get_plugin_manager(extra_modules=[module]))
        settings = in_turns.TurnSettings(rounds=3, burst_s=0.05, workers_per_library=1, pause_s=1.5 * pause_sensitive.IDLE_S)
        monkeypatch.setattr(build_stage, "time_in_turns", functools.partial(in_turns.time_in_turns, settings=settings))
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((4, 16), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                output = bb.emit_output(relax.op.nn.relu(x))
            bb.emit_func_output(output)
        out = tmp_path_factory.mktemp("contest-pauses")
        result = collage_core.optimize(
            bb.get(),
            backends=[pause_sensitive.PAUSE_SENSITIVE, pause_sensitive.STEADY],
            cost_db=out / "costs.sqlite",
            output_dir=out / "out",
            calibration_rounds=0,
            show_progress=False,
            **options,
        )
    return result, out / "out", pause_sensitive


@pytest.fixture(scope="module")
def contest(tmp_path_factory):
    return _contest(tmp_path_factory)


@pytest.fixture(scope="module")
def contest_after_pause(tmp_path_factory):
    return _contest(tmp_path_factory, latency="after-pause")


def test_the_contest_records_both_figures_and_chooses_by_the_warm_one(contest):
    result, _, plugin = contest
    rows = {entry.name: entry for entry in result.end_to_end if entry.timed_in_turns}
    placed, steady = rows[PLACEMENT], rows[f"{plugin.STEADY} alone, {IN_TURNS}"]
    assert placed.operators_by_backend == {plugin.PAUSE_SENSITIVE: 1}  # kept: the faster warm, back to back
    assert placed.cost.median_s < plugin.STEADY_S <= steady.cost.median_s
    assert placed.after_pause.median_s >= plugin.AFTER_PAUSE_S > steady.after_pause.median_s  # yet slower after a pause
    assert placed.paused_s >= 1.5 * plugin.IDLE_S and steady.paused_s >= 1.5 * plugin.IDLE_S
    why = result.placement.why_chosen
    assert why.startswith("found by the op-level search; it won the contest in turns: ")
    # ... and says what ran faster after a pause, and how to choose by that
    assert re.search(
        rf"; after a pause {plugin.STEADY} alone ran faster, [0-9.]+ ms against [0-9.]+ ms: "
        r"`--latency after-pause` chooses by the latency after a pause$",
        why,
    ), why


def test_with_latency_after_a_pause_the_contest_returns_what_runs_faster_after_one(contest_after_pause):
    result, out, plugin = contest_after_pause
    rows = {entry.name: entry for entry in result.end_to_end if entry.timed_in_turns}
    returned = rows[PLACEMENT]
    assert returned.operators_by_backend == {plugin.STEADY: 1}  # slower warm, faster after a pause
    assert returned.after_pause.median_s < plugin.AFTER_PAUSE_S <= rows[f"{SEARCHED}, {IN_TURNS}"].after_pause.median_s
    why = result.placement.why_chosen
    assert why.startswith(f"{plugin.STEADY} alone won the contest in turns after a pause: ") and "--latency" not in why
    assert json.loads((out / "placement.json").read_text())["why_chosen"] == why
    assert json.loads((out / "results.json").read_text())["chosen_by"] == "after-pause"
    assert "(the choice was made on the latencies after a pause; " in (out / "report.txt").read_text()


def test_latency_after_a_pause_needs_the_contest():
    from collage_core.api_checks import ArgumentError

    with pytest.raises(ArgumentError, match=r"^--latency after-pause chooses in the contest with the baselines, .*: add --compare$"):
        collage_core.OptimizeOptions(latency="after-pause", compare_backends=False)
    with pytest.raises(ArgumentError, match="add --compare"):
        collage_core.OptimizeOptions(latency="after-pause", placement="placement.json")  # a replay does not compare
    assert collage_core.OptimizeOptions(latency="after-pause", placement="placement.json", compare_backends=True).latency == "after-pause"


def test_the_report_and_results_give_the_latency_after_a_pause_beside_the_warm_one(contest):
    result, out, _ = contest
    report = (out / "report.txt").read_text().splitlines()
    assert " warm, back to back, timed in turns with 1 rival build; " in report[1] and " s idle" in report[1]
    header = next(line for line in report if line.startswith("end to end") and "after a pause" in line)
    assert re.split(r"\s{2,}", header)[:3] == ["end to end", "median latency, warm", "after a pause"]
    assert json.loads((out / "results.json").read_text())["chosen_by"] == "warm"
    rows = json.loads((out / "results.json").read_text())["end_to_end"]
    placed = next(row for row in rows if row["name"] == PLACEMENT)
    assert placed["after_pause"]["median_s"] > placed["cost"]["median_s"] and placed["paused_s"] > 0


def test_with_latency_after_a_pause_a_baseline_measured_only_warm_does_not_replace_the_placement():
    """Where no contest in turns could run (here: the placement's one run is over ``single_run_s``), baselines are
    known only warm, one after another: by the latency after a pause none can be said to be faster."""
    from types import SimpleNamespace

    from collage_core.build.stage import Built, finish
    from collage_core.measure.timing import MeasureSettings
    from collage_core.outputs.end_to_end import EndToEnd
    from collage_core.records import Cost, Partition

    parts = [Partition("tvm", "tvm.op", (0,), "tvm", Cost.unknown())]
    faster = [Partition("onnxruntime", "onnxruntime.region", (0,), "onnxruntime", Cost.unknown())]
    job = SimpleNamespace(settings=MeasureSettings(single_run_s=0.001))
    built = Built(None, [], Cost.measured(0.002, 1e-5, 5))
    baselines = [(EndToEnd("onnxruntime alone", Cost.measured(0.0005, 1e-5, 5), {"onnxruntime": 1}), faster)]
    outcome = finish(job, None, "found by the op-level search", parts, built, baselines, latency="after-pause")
    assert outcome.replacement is None and outcome.chosen_by is None
    assert outcome.why == "found by the op-level search; none was timed after a pause, so none replaces it (none timed in turns)"


@pytest.mark.parametrize("may_replace", [True, False], ids=["a search", "a replay"])
def test_a_rival_faster_after_a_pause_is_named_where_choosing_by_that_could_return_it(may_replace):
    from collage_core.build.stage import Built, Contest, after_contest
    from collage_core.measure.in_turns import LibraryTurns
    from collage_core.outputs.end_to_end import EndToEnd
    from collage_core.records import Cost, Partition

    def ms(value):
        return Cost.measured(value / 1e3, 1e-6, 9)

    rival = (EndToEnd("onnxruntime alone", ms(0.5), {"onnxruntime": 1}), [Partition("onnxruntime", "o", (0,), "o", Cost.unknown())])
    turns = {PLACEMENT: LibraryTurns(ms(0.4), ms(9.0), 1.2), "onnxruntime alone": LibraryTurns(ms(0.5), ms(0.8), 1.2)}
    parts = [Partition("tvm", "tvm.op", (0,), "tvm", Cost.unknown())]
    built = Built(None, [], ms(0.4))
    why = after_contest("found", parts, built, [rival], [rival], Contest(turns), may_replace=may_replace).why
    hint = "; after a pause onnxruntime alone ran faster, 0.800 ms against 9.000 ms: `--latency after-pause` chooses by"
    assert (hint in why) == may_replace, why
