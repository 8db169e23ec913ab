"""Timing in turns costs a library by its fastest worker, and stops early once the fastest library
is clear, not before.

The workers here are stand-ins that return given run times, so the stopping rule is checked
without processes; tests/test_optimize.py times real libraries in turns."""

from __future__ import annotations

import itertools

import pytest

from collage_core.measure import in_turns
from collage_core.measure.in_turns import TurnSettings, leader_is_clear, time_in_turns


def test_a_leader_is_clear_only_when_its_runs_and_every_others_do_not_overlap():
    assert leader_is_clear({"placement": [1.0, 1.1, 1.0, 1.05], "onnxruntime": [1.5, 1.6, 1.4, 1.55]})
    assert not leader_is_clear({"placement": [1.0, 1.3, 1.0, 1.35], "onnxruntime": [1.2, 1.6, 1.25, 1.55]})
    # clear of one rival, not of the other
    assert not leader_is_clear({"a": [1.0, 1.0, 1.01], "b": [2.0, 2.0, 2.0], "c": [1.0, 1.02, 1.01]})
    assert leader_is_clear({"alone": [1.0]})
    assert not leader_is_clear({"a": [1.0, 1.0], "b": []})  # a library with no runs yet decides nothing


class StandInWorker:
    """Answers ``load_library`` and ``time_turn`` with run times drawn in turn from ``runs_s[library]``,
    or, where that holds a list of run times per worker, from the list of the library's n-th worker;
    where it holds ``{"after_pause": seconds, "warm": seconds}``, the first run of each turn takes the one
    and every other run the other."""

    runs_s: dict = {}
    turns: list = []
    loaded: dict = {}
    requests: list = []

    def __init__(self, plugin_modules, disabled):
        self.library = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def request(self, request, timeout_s):
        StandInWorker.requests.append(request)
        runs = self.runs_s[request.get("library", self.library)]
        if isinstance(runs, dict):
            self.library = request.get("library", self.library)
            if request["op"] == "load_library":
                return {"once_s": runs["warm"]}
            StandInWorker.turns.append(self.library)
            return {"samples_s": [runs["after_pause"]] + [runs["warm"]] * (request["count"] - 1), "paused_s": request["pause_s"]}
        if request["op"] == "load_library":
            self.library = request["library"]
            copy = StandInWorker.loaded.get(self.library, 0)
            StandInWorker.loaded[self.library] = copy + 1
            self.runs = itertools.cycle(runs[copy] if isinstance(runs[0], list) else runs)
            return {"once_s": next(self.runs)}
        StandInWorker.turns.append(self.library)
        return {"samples_s": [next(self.runs) for _ in range(request["count"])], "paused_s": request["pause_s"]}


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(in_turns, "MeasurementWorker", StandInWorker)
    StandInWorker.turns, StandInWorker.loaded, StandInWorker.requests = [], {}, []
    return StandInWorker


def timed(stand_ins, runs_s, settings):
    stand_ins.runs_s = runs_s
    return time_in_turns({name: name for name in runs_s}, "inputs.npz", "{}", [], [], settings)


def test_turns_stop_after_the_minimum_rounds_when_the_leader_is_clear(stand_ins):
    settings = TurnSettings(rounds=7, min_rounds=3, burst_s=0.0, workers_per_library=2)
    costs = timed(stand_ins, {"placement": [1.0, 1.02, 0.98], "onnxruntime": [2.0, 2.1, 1.9]}, settings)
    assert len(stand_ins.turns) == 3 * 2 * 2  # three rounds of four workers
    assert costs["placement"].warm.repeats == costs["onnxruntime"].warm.repeats == 3  # the fastest worker's runs
    assert costs["placement"].warm.seconds == pytest.approx(1.0) and costs["onnxruntime"].warm.seconds == pytest.approx(2.0)


def test_turns_run_every_round_while_the_libraries_overlap(stand_ins):
    settings = TurnSettings(rounds=7, min_rounds=3, burst_s=0.0, workers_per_library=2)
    costs = timed(stand_ins, {"placement": [1.0, 1.3, 1.1], "onnxruntime": [1.05, 1.25, 1.0]}, settings)
    assert len(stand_ins.turns) == 7 * 2 * 2
    assert costs["placement"].warm.repeats == costs["placement"].after_pause.repeats == 7


def test_the_minimum_rounds_are_run_even_for_a_clear_leader(stand_ins):
    settings = TurnSettings(rounds=7, min_rounds=5, burst_s=0.0, workers_per_library=1)
    timed(stand_ins, {"placement": [1.0], "tvm": [3.0]}, settings)
    assert len(stand_ins.turns) == 5 * 2


def test_a_library_is_costed_by_its_fastest_worker_not_by_an_unlucky_one(stand_ins):
    # As GPT-2 b8 in OpenVINO ran in turns: one process slowed round after round, the other ran as alone.
    settings = TurnSettings(rounds=7, min_rounds=3, burst_s=0.0, workers_per_library=2)
    costs = timed(
        stand_ins, {"openvino": [[1.27, 1.33, 1.24], [0.92, 0.93, 0.91]], "onnxruntime": [[1.05, 1.07, 1.06], [1.09, 1.10, 1.11]]}, settings
    )
    assert costs["openvino"].warm.seconds == pytest.approx(0.92) and costs["onnxruntime"].warm.seconds == pytest.approx(1.06)
    assert costs["openvino"].warm.spread_s == pytest.approx(0.01)  # the fastest worker's quartiles, not both workers'
    assert len(stand_ins.turns) == 3 * 4  # and with its fastest worker the leader is clear after three rounds


def test_each_turn_is_a_run_after_a_pause_then_runs_back_to_back_and_the_two_are_kept_apart(stand_ins):
    """A library slow after a pause and fast warm, as OpenVINO can be, against a steady one: each figure
    is its own, neither pooled into the other, and how many runs fit a burst comes from the warm runs."""
    settings = TurnSettings(rounds=3, min_rounds=3, burst_s=0.03, workers_per_library=1, warmup_runs=3, pause_s=1.5)
    costs = timed(stand_ins, {"pausy": {"after_pause": 0.05, "warm": 0.01}, "steady": {"after_pause": 0.02, "warm": 0.02}}, settings)
    assert (costs["pausy"].warm.seconds, costs["pausy"].after_pause.seconds) == (0.01, 0.05)
    assert (costs["steady"].warm.seconds, costs["steady"].after_pause.seconds) == (0.02, 0.02)
    assert costs["pausy"].warm.repeats == 3 * 3 and costs["steady"].warm.repeats == 3  # a burst of 0.03 s of warm runs
    assert costs["pausy"].after_pause.repeats == costs["steady"].after_pause.repeats == 3  # one a turn
    assert costs["pausy"].paused_s == 1.5
    loads = [r for r in stand_ins.requests if r["op"] == "load_library"]
    assert all(r["warmup_runs"] == 3 for r in loads)
    assert all(r["pause_s"] == 1.5 and r["count"] >= 2 for r in stand_ins.requests if r["op"] == "time_turn")
