"""The op-level search calibrated end to end, on a deterministic end-to-end cost model."""

from __future__ import annotations

import pytest

from collage_core.records import Candidate, Cost, Partition
from collage_core.search.calibration import calibrate, charged, signature
from collage_core.search.graph import OpGraph
from collage_core.search.op_level import search_op_level

# conv -> add -> relu, twice: each conv group can run fused (one "fused" candidate of three ops)
# or as three single operators on "singles", which measure cheaper alone.
GRAPH = OpGraph(ops=["conv", "add", "relu"] * 2, preds=[[], [0], [1], [2], [3], [4]])
FUSED = [Candidate("fused", "fused.conv_add_relu", {0, 1, 2}, "f0"), Candidate("fused", "fused.conv_add_relu", {3, 4, 5}, "f1")]
SINGLES = [Candidate("singles", "singles.op", {n}, f"s{n}") for n in range(6)]
COSTS = {**{c.key: Cost.measured(3.0e-3, 0.0, 3) for c in FUSED}, **{c.key: Cost.measured(0.9e-3, 0.0, 3) for c in SINGLES}}
PER_PARTITION_S = 0.5e-3


class DeterministicEndToEnd:
    """A deterministic cost model for testing calibration, never a default: a placement costs its
    candidates' isolated costs, plus PER_PARTITION_S for every partition, plus ``hidden`` seconds
    for every partition of the backend it names; it counts how often each placement is measured."""

    def __init__(self, hidden: dict | None = None):
        self.hidden = hidden or {}
        self.calls: list[tuple] = []

    def __call__(self, parts) -> Cost:
        self.calls.append(signature(parts))
        seconds = sum(p.cost.median_s + PER_PARTITION_S + self.hidden.get(p.backend, 0.0) for p in parts)
        return Cost.measured(seconds, 0.0, 3)


def searched(costs=COSTS):
    chosen = search_op_level(GRAPH, FUSED + SINGLES, costs)
    return [Partition.from_candidate(c, COSTS[c.key]) for c in chosen]


def test_isolated_costs_prefer_single_operators():
    assert {p.backend for p in searched()} == {"singles"}


def test_per_partition_overhead_found_end_to_end_moves_the_search_to_fused_groups():
    model = DeterministicEndToEnd()
    result = calibrate(GRAPH, FUSED + SINGLES, COSTS, searched(), model)
    assert {p.backend for p in result.parts} == {"fused"}
    first, second = result.rounds
    assert first.partitions == 6 and first.charge_per_partition_s == pytest.approx(PER_PARTITION_S)
    assert second.partitions == 2 and result.latency.median_s == pytest.approx(2 * (3.0e-3 + PER_PARTITION_S))
    assert len(model.calls) == len(set(model.calls)) == 2


def test_a_re_searched_placement_that_measures_slower_is_not_kept():
    model = DeterministicEndToEnd(hidden={"fused": 2.0e-3})
    start = searched()
    result = calibrate(GRAPH, FUSED + SINGLES, COSTS, start, model)
    assert signature(result.parts) == signature(start)
    assert len(result.rounds) == 2 and result.rounds[1].latency.median_s > result.latency.median_s


def test_nothing_unexplained_means_no_second_measurement():
    def exact(parts):
        exact.calls += 1
        return Cost.measured(sum(p.cost.median_s for p in parts), 0.0, 3)

    exact.calls = 0
    result = calibrate(GRAPH, FUSED + SINGLES, COSTS, searched(), exact, rounds=3)
    assert exact.calls == 1 and result.rounds[0].charge_per_partition_s == 0.0


def test_a_placement_that_cannot_be_measured_is_returned_as_it_is():
    start = searched()
    result = calibrate(GRAPH, FUSED + SINGLES, COSTS, start, lambda parts: Cost.invalid("build failed"))
    assert signature(result.parts) == signature(start) and result.rounds == ()


def test_zero_rounds_measures_once_and_changes_nothing():
    model = DeterministicEndToEnd()
    start = searched()
    assert signature(calibrate(GRAPH, FUSED + SINGLES, COSTS, start, model, rounds=0).parts) == signature(start)
    assert len(model.calls) == 1


def test_charges_leave_invalid_costs_invalid():
    costs = {"a": Cost.measured(1.0, 0.1, 3), "b": Cost.invalid("crashed")}
    result = charged(costs, 0.5)
    assert result["a"].median_s == 1.5 and not result["b"].is_measured


def test_a_named_alternative_that_measures_faster_is_returned_with_its_name():
    model = DeterministicEndToEnd(hidden={"fused": 2.0e-3})
    only_singles_merged = [Partition("singles", "singles.op", [n], f"s{n}", COSTS[f"s{n}"]) for n in range(6)]
    fused = [Partition.from_candidate(c, COSTS[c.key]) for c in FUSED]
    result = calibrate(GRAPH, SINGLES, COSTS, only_singles_merged, model, alternatives=[("fused alone", fused)])
    assert result.alternative == "" and signature(result.parts) == signature(only_singles_merged)
    cheap = DeterministicEndToEnd(hidden={"singles": 1.0e-3})
    result = calibrate(GRAPH, SINGLES, COSTS, only_singles_merged, cheap, rounds=0, alternatives=[("fused alone", fused)])
    assert result.alternative == "fused alone" and signature(result.parts) == signature(fused)
    assert len(cheap.calls) == 2


def test_candidates_that_over_count_get_a_negative_charge_that_moves_the_search_to_more_partitions():
    """Isolated, every candidate pays a per-call cost that the built model pays once: the fused groups
    (two partitions) look cheaper than the singles (six). End to end, the singles run faster; the
    negative charge found on the fused placement re-searches to them."""
    per_call = 1.0e-3
    isolated = {
        **{c.key: Cost.measured(2.0e-3 + per_call, 0.0, 3) for c in FUSED},
        **{c.key: Cost.measured(0.2e-3 + per_call, 0.0, 3) for c in SINGLES},
    }

    def end_to_end(parts):
        end_to_end.calls += 1
        return Cost.measured(sum(p.cost.median_s - per_call for p in parts) + per_call, 0.0, 3)

    end_to_end.calls = 0
    chosen = search_op_level(GRAPH, FUSED + SINGLES, isolated)
    start = [Partition.from_candidate(c, isolated[c.key]) for c in chosen]
    assert {p.backend for p in start} == {"fused"}
    result = calibrate(GRAPH, FUSED + SINGLES, isolated, start, end_to_end)
    assert result.rounds[0].charge_per_partition_s == pytest.approx(-per_call / 2)
    assert {p.backend for p in result.parts} == {"singles"}
    assert result.latency.median_s == pytest.approx(6 * 0.2e-3 + per_call)


def test_a_negative_charge_never_takes_a_cost_below_its_floor():
    from collage_core.search.calibration import CHARGED_FLOOR

    result = charged({"a": Cost.measured(1.0e-3, 0.0, 3)}, -5.0e-3)
    assert result["a"].median_s == pytest.approx(CHARGED_FLOOR * 1.0e-3)


def test_an_alternative_whose_candidates_predict_a_loss_is_not_built_and_is_reported_with_its_prediction():
    model = DeterministicEndToEnd()
    singles = [Partition.from_candidate(c, COSTS[c.key]) for c in SINGLES]
    hopeless = [Partition("slow", "slow.op", [n], f"x{n}", Cost.measured(5e-3, 0.0, 3)) for n in range(6)]
    close = [Partition("near", "near.op", [n], f"n{n}", Cost.measured(1.0e-3, 0.0, 3)) for n in range(6)]
    result = calibrate(
        GRAPH, SINGLES, COSTS, singles, model, rounds=0, alternatives=[("slow everywhere", hopeless), ("near everywhere", close)]
    )
    # singles measure 6 x (0.9 + 0.5) = 8.4 ms, a charge of 0.5 ms per partition; "slow" predicts
    # 6 x 5.5 = 33 ms, over twice that, and is not built; "near" predicts 9 ms and is measured
    assert [name for name, _ in result.predicted] == ["slow everywhere"]
    assert result.predicted[0][1] == pytest.approx(33e-3)
    assert model.calls == [signature(singles), signature(close)]


def test_the_placement_without_each_backend_it_uses_is_measured_and_wins_when_that_backend_only_looked_cheap():
    """Three op-level backends cover every operator: "added" sums cheapest alone but pays hidden costs
    end to end, the way a newly added backend can; calibration measures the placement searched without
    it and returns that one, by its name."""
    from types import SimpleNamespace

    from collage_core.search.baselines import without_each_backend

    costs_of = {"base": 1.0e-3, "vendor": 0.8e-3, "added": 0.7e-3}
    candidates = [Candidate(b, f"{b}.op", {n}, f"{b}{n}") for b in costs_of for n in range(6)]
    costs = {c.key: Cost.measured(costs_of[c.backend], 0.0, 3) for c in candidates}
    start = [Partition.from_candidate(c, costs[c.key]) for c in search_op_level(GRAPH, candidates, costs)]
    assert {p.backend for p in start} == {"added"}
    alternatives = without_each_backend(SimpleNamespace(graph=GRAPH), candidates, costs, start)
    assert [name for name, _ in alternatives] == ["op-level placement without added"]
    assert {p.backend for p in alternatives[0][1]} == {"vendor"}
    model = DeterministicEndToEnd(hidden={"added": 0.3e-3})
    result = calibrate(GRAPH, candidates, costs, start, model, rounds=0, alternatives=alternatives)
    assert result.alternative == "op-level placement without added"
    assert result.latency.median_s == pytest.approx(6 * (0.8e-3 + PER_PARTITION_S))
    fair = DeterministicEndToEnd()
    kept = calibrate(GRAPH, candidates, costs, start, fair, rounds=0, alternatives=alternatives)
    assert kept.alternative == "" and signature(kept.parts) == signature(start)


def test_no_placement_without_a_backend_the_others_cannot_stand_in_for():
    from types import SimpleNamespace

    from collage_core.search.baselines import without_each_backend

    partial = [Candidate("partial", "partial.conv", {0}, "p0")]
    costs = {**COSTS, "p0": Cost.measured(0.1e-3, 0.0, 3)}
    start = [Partition.from_candidate(c, costs[c.key]) for c in search_op_level(GRAPH, SINGLES + partial, costs)]
    assert {p.backend for p in start} == {"singles", "partial"}
    alternatives = without_each_backend(SimpleNamespace(graph=GRAPH), SINGLES + partial, costs, start)
    assert [name for name, _ in alternatives] == ["op-level placement without partial"]


def test_the_alternatives_about_to_be_measured_are_handed_to_prepare_at_once_first():
    """An evaluator that builds placements at once (``prepare``) is handed every alternative that will be measured,
    before the first is, and not the one its candidates predict a loss for; what is measured does not change."""
    singles = [Partition.from_candidate(c, COSTS[c.key]) for c in SINGLES]
    hopeless = [Partition("slow", "slow.op", [n], f"x{n}", Cost.measured(5e-3, 0.0, 3)) for n in range(6)]
    close = [Partition("near", "near.op", [n], f"n{n}", Cost.measured(1.0e-3, 0.0, 3)) for n in range(6)]
    fused = [Partition.from_candidate(c, COSTS[c.key]) for c in FUSED]
    alternatives = [("slow everywhere", hopeless), ("near everywhere", close), ("again", singles), ("fused alone", fused)]
    events = []
    model = DeterministicEndToEnd()

    def evaluate(parts):
        events.append(("measured", signature(parts)))
        return model(parts)

    result = calibrate(
        GRAPH,
        SINGLES,
        COSTS,
        singles,
        evaluate,
        rounds=0,
        alternatives=alternatives,
        prepare=lambda batch: events.append(("prepared", batch)),
    )
    plain = DeterministicEndToEnd()
    assert calibrate(GRAPH, SINGLES, COSTS, singles, plain, rounds=0, alternatives=alternatives) == result
    assert [kind for kind, _ in events] == ["measured", "prepared", "measured", "measured"]
    assert [signature(parts) for parts in events[1][1]] == [signature(close), signature(fused)] == [s for _, s in events[2:]]
    assert plain.calls == [signature(singles), signature(close), signature(fused)]
