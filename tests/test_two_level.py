"""The two-level genetic search and genome decoding, on a deterministic end-to-end cost model."""

from __future__ import annotations

import attrs
import pytest

from collage_core.records import Cost, Partition
from collage_core.search.graph import OpGraph
from collage_core.search.regions import KEEP, OpGroup, decode, genome_key
from collage_core.search.two_level import TwoLevelSettings, history_text, operators_by_backend, search_two_level, seed_genomes


def chain_with_branches() -> OpGraph:
    """0 -> 1 -> {2, 3} -> 4 (joins) -> 5 -> 6; 7 reads 0 and 6 (a long residual)."""
    return OpGraph(
        ops=["conv", "relu", "conv", "conv", "add", "softmax", "matmul", "add"], preds=[[], [0], [1], [1], [2, 3], [4], [5], [0, 6]]
    )


def groups_for(graph: OpGraph, supported: dict[str, set[int]]) -> list[OpGroup]:
    groups = []
    for node in range(len(graph)):
        part = Partition("tvm", "tvm.op", [node], f"tvm.op:{node}", Cost.measured(1e-3 * (node + 1), 0.0, 1))
        choices = tuple(sorted(b for b, nodes in supported.items() if node in nodes))
        groups.append(OpGroup(part, choices))
    return groups


def deterministic_end_to_end_cost(parts) -> Cost:
    """A deterministic cost model for testing the search, never a default: op-level parts cost
    their measured cost; a graph-level region costs a fixed call overhead plus 40% of its operators'
    op-level costs (or 70% on the second backend), so merging regions pays."""
    seconds = 0.0
    for part in parts:
        if part.cost.is_measured:
            seconds += part.cost.median_s
        else:
            share = 0.4 if part.backend == "graphy" else 0.7
            seconds += 0.5e-3 + share * sum(1e-3 * (n + 1) for n in part.nodes)
    return Cost.measured(seconds, 0.0, 1)


def assert_valid_placement(graph: OpGraph, parts) -> None:
    covered = sorted(n for p in parts for n in p.nodes)
    assert covered == list(range(len(graph)))
    placed: set[int] = set()
    waiting = list(parts)
    while waiting:
        ready = [p for p in waiting if all(q in placed or q in p.nodes for n in p.nodes for q in graph.preds[n])]
        assert ready, "partitions depend on each other in a cycle"
        placed |= set(ready[0].nodes)
        waiting.remove(ready[0])


def test_adjacent_groups_on_one_backend_merge_and_branches_meet():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    parts = decode(graph, groups, [1] * 8)
    assert [(p.backend, p.nodes) for p in parts] == [("graphy", tuple(range(8)))]
    assert parts[0].pattern == "graphy.region" and not parts[0].cost.is_measured


def test_merging_never_makes_a_region_that_cannot_run():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    genome = [1, 1, KEEP, 1, 1, 1, 1, 1]  # node 2 stays op-level in the middle of a graphy region
    parts = decode(graph, groups, genome)
    assert_valid_placement(graph, parts)
    assert any(p.nodes == (2,) and p.backend == "tvm" for p in parts)


def test_unsupported_groups_keep_their_backend_and_seeds_cover_each_backend():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4}, "other": {4, 5, 6}})
    seeds = seed_genomes(groups)
    assert seeds[0] == (KEEP,) * 8
    for seed in seeds:
        assert_valid_placement(graph, decode(graph, groups, seed))
    assert len(seeds) == 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_beats_both_seeds_and_is_reproducible(seed):
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4, 7}, "other": set(range(8))})
    measured: list[str] = []

    def evaluate(parts):
        measured.append(genome_key(parts))
        return deterministic_end_to_end_cost(parts)

    settings = TwoLevelSettings(population=8, generations=6, seed=seed)
    result = search_two_level(graph, groups, evaluate, settings)
    assert_valid_placement(graph, result.parts)
    for genome in seed_genomes(groups):
        assert result.latency.seconds <= deterministic_end_to_end_cost(decode(graph, groups, genome)).seconds
    assert len(measured) == len(set(measured)) == result.measured
    again = search_two_level(graph, groups, deterministic_end_to_end_cost, settings)
    assert again.genome == result.genome and again.latency == result.latency


def test_a_model_of_one_group_is_searched_without_crossover():
    """A genome of one group cannot be cut in two; the search still mutates it and returns the faster choice."""
    graph = OpGraph(ops=["matmul"], preds=[[]])
    groups = groups_for(graph, {"graphy": {0}})
    result = search_two_level(graph, groups, deterministic_end_to_end_cost, TwoLevelSettings(population=4, generations=3, seed=1))
    assert_valid_placement(graph, result.parts)
    assert result.latency.seconds == min(deterministic_end_to_end_cost(decode(graph, groups, g)).seconds for g in seed_genomes(groups))


@pytest.mark.parametrize("operators", [1, 8])
def test_a_model_no_group_of_which_can_go_to_a_graph_level_backend_returns_its_op_level_placement(operators):
    """Every genome is then the op-level placement: nothing to evolve (DEAP's variation needs two distinct parents,
    and stopped the run with a traceback), so the search ends after scoring the seeds."""
    graph = chain_with_branches() if operators == 8 else OpGraph(ops=["cumsum"], preds=[[]])
    groups = groups_for(graph, {})
    result = search_two_level(graph, groups, deterministic_end_to_end_cost, TwoLevelSettings(population=4, generations=5, seed=0))
    assert_valid_placement(graph, result.parts)
    assert all(part.backend == "tvm" for part in result.parts)
    assert result.latency.seconds == deterministic_end_to_end_cost(decode(graph, groups, seed_genomes(groups)[0])).seconds


def test_best_placement_is_reported_as_it_improves():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    reported = []
    result = search_two_level(
        graph,
        groups,
        deterministic_end_to_end_cost,
        TwoLevelSettings(population=6, generations=3),
        on_best=lambda parts, cost: reported.append(cost.seconds),
    )
    assert reported == sorted(reported, reverse=True) and reported[-1] == result.latency.seconds


def test_budget_stops_the_search_after_the_seeds():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    result = search_two_level(graph, groups, deterministic_end_to_end_cost, TwoLevelSettings(budget_s=0.0))
    assert result.generations == 0 and result.measured <= TwoLevelSettings().population


def test_search_stops_after_generations_without_improvement():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    result = search_two_level(graph, groups, deterministic_end_to_end_cost, TwoLevelSettings(population=6, generations=50, patience=2))
    assert result.generations < 50


def test_nothing_measurable_falls_back_to_the_op_level_placement():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    result = search_two_level(graph, groups, lambda parts: Cost.invalid("build failed"), TwoLevelSettings(population=4, generations=1))
    assert not result.latency.is_measured and result.genome == (KEEP,) * 8
    assert [p.backend for p in result.parts] == ["tvm"] * 8


def test_a_search_charged_with_recorded_effort_replays_from_a_warm_database():
    """The budget is charged what each measurement took, a stored one at what it took when measured:
    the second search reads every placement from the "database", measures none, stops at the same
    generation and returns the same placement."""
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4, 7}, "other": set(range(8))})
    database: dict[str, tuple[Cost, float]] = {}

    class Evaluator:
        def __init__(self):
            self.spent_s, self.measured = 0.0, 0

        def __call__(self, parts):
            key = genome_key(parts)
            if key not in database:
                self.measured += 1
                database[key] = (deterministic_end_to_end_cost(parts), 1.0)  # each measurement "takes" 1 s
            cost, effort_s = database[key]
            self.spent_s += effort_s
            return cost

    settings = TwoLevelSettings(population=6, generations=20, patience=20, budget_s=14.0, predict_margin=None)
    cold, warm = Evaluator(), Evaluator()
    first = search_two_level(graph, groups, cold, settings, spent=lambda: cold.spent_s)
    again = search_two_level(graph, groups, warm, settings, spent=lambda: warm.spent_s)
    assert 0 < first.generations < settings.generations  # the budget stopped it
    assert cold.measured == first.measured > 0 and warm.measured == 0
    assert (again.genome, again.generations, again.latency) == (first.genome, first.generations, first.latency)


def test_each_generation_records_which_backends_gained_ground():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4, 7}, "other": set(range(8))})
    seen = []
    result = search_two_level(
        graph, groups, deterministic_end_to_end_cost, TwoLevelSettings(population=6, generations=4), on_generation=seen.append
    )
    assert seen == list(result.history) and [r.generation for r in seen] == list(range(result.generations + 1))
    assert seen[0].gained == {}
    for before, after in zip(seen, seen[1:]):
        assert after.best_s <= before.best_s
        assert after.gained == {
            b: n
            for b in set(before.operators_by_backend) | set(after.operators_by_backend)
            if (n := after.operators_by_backend.get(b, 0) - before.operators_by_backend.get(b, 0))
        }
        assert sum(after.operators_by_backend.values()) == len(graph.ops)
    assert seen[-1].operators_by_backend == {b: n for b, n in operators_by_backend(result.parts).items()}
    assert any(record.gained for record in seen[1:])  # this search moves an operator from tvm to "other"
    assert history_text(seen).startswith("0: ")


def test_the_search_is_drawn_one_bar_per_generation_split_by_backend():
    from xml.etree import ElementTree

    from collage_core.outputs.search_history import BAR_WIDTH, history_svg
    from collage_core.search.two_level import GenerationRecord

    history = [
        GenerationRecord(0, 0.004, 10.0, {"onnxruntime": 6, "tvm": 2}, {}),
        GenerationRecord(1, 0.003, 5.0, {"onnxruntime": 4, "openvino": 4}, {"onnxruntime": -2, "openvino": 4, "tvm": -2}),
    ]
    root = ElementTree.fromstring(history_svg(history, {"onnxruntime": "#8dd3c7", "tvm": "#ffffb3"}))
    ns = {"svg": "http://www.w3.org/2000/svg"}
    bars = root.findall("svg:g[@class='generation']", ns)
    assert [bar.get("data-generation") for bar in bars] == ["0", "1"]
    for bar, record in zip(bars, history):
        rects = bar.findall("svg:rect", ns)
        assert {r.get("data-backend"): int(r.get("data-operators")) for r in rects} == record.operators_by_backend
        assert sum(float(r.get("width")) for r in rects) == pytest.approx(BAR_WIDTH, abs=0.05)
        assert f"{record.best_s * 1e3:.3f} ms" in "".join(bar.itertext())
    fills = {r.get("data-backend"): r.get("fill") for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("data-backend")}
    assert fills["onnxruntime"] == "#8dd3c7" and fills["openvino"] not in ("#8dd3c7", "#ffffb3")


def test_the_pictures_caption_says_when_the_searchs_best_was_not_returned():
    from xml.etree import ElementTree

    from collage_core.outputs.search_history import CAPTION_CHARACTERS, history_svg
    from collage_core.search.two_level import GenerationRecord

    history = [GenerationRecord(0, 0.004, 10.0, {"openvino": 8}, {})]
    ns = {"svg": "http://www.w3.org/2000/svg"}
    plain = ElementTree.fromstring(history_svg(history, {}))
    assert plain.findall("svg:text[@class='caption']", ns) == []
    why = (
        "The search's best (the last bar) was not returned: onnxruntime alone won the contest in turns: 0.214 ms "
        "against the searched placement's 0.631 ms, 2.95x"
    )
    captioned = ElementTree.fromstring(history_svg(history, {}, caption=why))
    lines = ["".join(text.itertext()) for text in captioned.findall("svg:text[@class='caption']", ns)]
    assert " ".join(lines) == why and len(lines) == 2 and all(len(line) <= CAPTION_CHARACTERS for line in lines)
    assert int(captioned.get("height")) > int(plain.get("height"))  # the bars move down, under the caption


def test_gains_within_the_measurements_spread_do_not_keep_the_search_going():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4}, "other": {3, 4, 5, 6, 7}})  # the fastest mixes them

    def shrunk(spread_s):
        def cost(parts) -> Cost:  # the model's differences shrunk to microseconds on a 10 ms run
            return Cost.measured(0.01 + 1e-3 * deterministic_end_to_end_cost(parts).median_s, spread_s, 5)

        return cost

    settings = TwoLevelSettings(
        population=6,
        generations=20,
        patience=2,
        seed=1,  # seed 1: improves for 8 generations
        predict_margin=None,
    )  # every genome built, as the spread is what is tested
    noisy = search_two_level(graph, groups, shrunk(2e-4), settings)
    assert noisy.generations == settings.patience  # nothing beat the seeds by more than the 0.2 ms spread
    exact = search_two_level(graph, groups, shrunk(0.0), attrs.evolve(settings, min_gain=0.0))
    # Without a spread, each microsecond counts: the same search goes on, and finds the faster mix.
    assert exact.generations > settings.patience and exact.latency.median_s < noisy.latency.median_s


def test_a_placement_whose_run_outlasts_the_cutoff_is_stopped_and_not_measured_again(tmp_path):
    from collage_core.measure.cost_db import CostDatabase
    from collage_core.measure.job import CUTOFF_FACTOR, RUN_LIMIT_FLOOR_S, EndToEndEvaluator
    from collage_core.measure.timing import STOPPED_PREFIX
    from collage_core.measure.worker_client import StageTooSlow

    fast = [Partition("tvm", "tvm.op", [0], "fast", Cost.unknown())]
    slow = [Partition("tvm", "tvm.op", [1], "slow", Cost.unknown())]

    class Job:  # what the evaluator asks of a job; the slow placement's worker is stopped by its run limit
        def __init__(self):
            self.runs, self.said, self.measured_end_to_end = [], [], {}

        def end_to_end_key(self, parts):
            return genome_key(parts)

        def run_built(self, parts, library, cutoff_s=None, run_limit_s=None, prebuilt=None):
            self.runs.append((parts[0].key, cutoff_s, run_limit_s))
            if parts is slow:
                raise StageTooSlow("set up", run_limit_s)
            return [], Cost.measured(0.2, 0.01, 5)

        def say(self, message):
            self.said.append(message)

    job = Job()
    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        evaluate = EndToEndEvaluator(job, db, cut_off=True)
        assert evaluate(fast).median_s == 0.2
        stopped = evaluate(slow)
        assert not stopped.is_measured and stopped.reason.startswith(STOPPED_PREFIX)
        assert evaluate(slow) == stopped  # read from the database, not run again
    assert job.runs == [("fast", None, None), ("slow", CUTOFF_FACTOR * 0.2, max(CUTOFF_FACTOR * 0.2, RUN_LIMIT_FLOOR_S))]
    assert "stopped, a run took longer than 1 s" in job.said[-1]


def charged_end_to_end_cost(parts) -> Cost:
    """The deterministic model above with a charge of 0.2 ms per op-level partition as well (for testing only)."""
    kept = sum(1 for p in parts if p.cost.is_measured)
    return Cost.measured(deterministic_end_to_end_cost(parts).median_s + 0.2e-3 * kept, 0.0, 1)


def test_the_predictor_learns_the_op_level_charge_each_backends_scale_and_the_charge_per_region():
    from collage_core.search.genome_prediction import LatencyPredictor

    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    predictor = LatencyPredictor(groups)
    op_level = decode(graph, groups, [KEEP] * 8)
    whole = decode(graph, groups, [1] * 8)
    split = decode(graph, groups, [1, 1, KEEP, 1, 1, KEEP, 1, 1])
    other_split = decode(graph, groups, [1, KEEP, 1, 1, 1, 1, KEEP, 1])
    assert predictor.predict(op_level) is None  # nothing measured yet
    predictor.learn(op_level, charged_end_to_end_cost(op_level))
    assert predictor.kept_charge_s == pytest.approx(0.2e-3)
    assert predictor.predict(op_level) == pytest.approx(charged_end_to_end_cost(op_level).median_s)
    assert predictor.predict(whole) is None  # graphy has no scale yet
    predictor.learn(whole, charged_end_to_end_cost(whole))
    assert predictor.predict(whole) == pytest.approx(charged_end_to_end_cost(whole).median_s)
    before = abs(predictor.predict(other_split) - charged_end_to_end_cost(other_split).median_s)
    predictor.learn(split, charged_end_to_end_cost(split))  # several regions, each paying its call
    after = abs(predictor.predict(other_split) - charged_end_to_end_cost(other_split).median_s)
    assert predictor.region_charge_s > 0 and after < before / 2
    predictor.learn(split, Cost.invalid("failed"))  # teaches nothing
    assert abs(predictor.predict(other_split) - charged_end_to_end_cost(other_split).median_s) == after


def test_a_placement_stopped_at_its_run_limit_teaches_the_region_charge_at_that_limit():
    """A placement stopped because a run outlasted its limit took at least that long: the charge per
    region learns from the limit, so the genomes like it that follow are predicted slower."""
    from collage_core.measure.timing import stopped
    from collage_core.search.genome_prediction import LatencyPredictor

    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": set(range(8))})
    op_level, whole = decode(graph, groups, [KEEP] * 8), decode(graph, groups, [1] * 8)
    split = decode(graph, groups, [1, 1, KEEP, 1, 1, KEEP, 1, 1])
    other_split = decode(graph, groups, [1, KEEP, 1, 1, 1, 1, KEEP, 1])
    predictor = LatencyPredictor(groups)
    predictor.learn(op_level, charged_end_to_end_cost(op_level))
    predictor.learn(whole, charged_end_to_end_cost(whole))
    before = predictor.predict(other_split)
    limit_s = 3 * charged_end_to_end_cost(split).median_s  # each region far dearer than the model says
    predictor.learn(split, stopped(limit_s))
    assert predictor.region_charge_s > 0
    assert predictor.predict(other_split) > before + 1e-3
    # a stopped seed, the only placement a backend's scale could come from, sets no scale
    fresh = LatencyPredictor(groups)
    fresh.learn(op_level, charged_end_to_end_cost(op_level))
    fresh.learn(whole, stopped(1.0))
    assert fresh.predict(whole) is None and not fresh.scale


def test_genomes_predicted_slower_than_the_best_are_not_built_and_the_search_finds_as_fast_a_placement():
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4, 7}, "other": set(range(8))})
    built, predicted = {True: 0, False: 0}, 0
    for seed in range(5):
        results = {}
        for predicting in (True, False):
            calls: list = []

            def evaluate(parts, calls=calls):
                calls.append(genome_key(parts))
                return charged_end_to_end_cost(parts)

            settings = TwoLevelSettings(population=8, generations=6, seed=seed, predict_margin=0.1 if predicting else None)
            results[predicting] = search_two_level(graph, groups, evaluate, settings)
            assert results[predicting].measured == len(calls)
            built[predicting] += len(calls)
        assert results[False].predicted == 0
        predicted += results[True].predicted
        assert results[True].latency.median_s <= 1.05 * results[False].latency.median_s
    assert built[True] < 0.6 * built[False] and predicted > 0


def test_each_batch_about_to_be_measured_is_handed_to_prepare_first_and_changes_nothing():
    """``prepare`` (an evaluator building placements at once) sees every placement before it is measured, and
    the placements it sees are those measured next, less any predicted slower once the batch's first ones
    are in; with it the search measures the same placements and returns the same one."""
    graph = chain_with_branches()
    groups = groups_for(graph, {"graphy": {0, 1, 2, 3, 4, 7}, "other": set(range(8))})
    settings = TwoLevelSettings(population=8, generations=6, seed=1)
    events: list = []

    def evaluate(parts):
        events.append(("measured", genome_key(parts)))
        return charged_end_to_end_cost(parts)

    def prepare(placements):
        keys = [genome_key(parts) for parts in placements]
        assert len(keys) == len(set(keys))
        events.append(("prepared", keys))

    prepared = search_two_level(graph, groups, evaluate, settings, prepare=prepare)
    measured_with = [key for kind, key in events if kind == "measured"]
    events_without: list = []
    plain = search_two_level(
        graph, groups, lambda parts: events_without.append(genome_key(parts)) or charged_end_to_end_cost(parts), settings
    )
    assert measured_with == events_without and prepared.genome == plain.genome and prepared.latency == plain.latency
    handed: set = set()
    batches = 0
    for kind, value in events:
        if kind == "prepared":
            handed |= set(value)
            batches += 1
        else:
            assert value in handed, "a placement was measured that prepare was not handed first"
    assert batches >= 3 and len(handed) >= len(measured_with)


def test_the_evaluator_builds_what_is_not_measured_yet_at_once_and_times_each_from_its_library(tmp_path):
    from collage_core.errors import CollageError
    from collage_core.measure.cost_db import CostDatabase
    from collage_core.measure.job import EndToEndEvaluator
    from collage_core.measure.timing import MeasureSettings

    placements = {name: [Partition("tvm", "tvm.op", [n], name, Cost.unknown())] for n, name in enumerate("abcd")}

    class Job:  # builds ahead into files; "c" fails to build ahead, "d"'s library fails to load
        remote = None

        def __init__(self, workers):
            self.settings, self.runs, self.built, self.measured_end_to_end = MeasureSettings(build_workers=workers), [], [], {}

        def end_to_end_key(self, parts):
            return genome_key(parts)

        def prebuild(self, batch, workers, run_limit_s=None):
            self.built.append(([p[0].key for p in batch], workers))
            libraries = []
            for parts in batch:
                library = tmp_path / f"{parts[0].key}.so"
                library.write_text("built")
                libraries.append(None if parts[0].key == "c" else library)
            return libraries

        def run_built(self, parts, library, cutoff_s=None, run_limit_s=None, prebuilt=None):
            self.runs.append((parts[0].key, prebuilt.name if prebuilt else None))
            if prebuilt is not None and parts[0].key == "d":
                raise CollageError("cannot load it")
            return [], Cost.measured(0.1, 0.0, 5)

        def say(self, message):
            pass

    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        evaluate = EndToEndEvaluator(Job(1), db, cut_off=False)
        assert evaluate.prepare(list(placements.values())) == 0 and not evaluate.job.built  # one build worker: nothing ahead
        evaluate = EndToEndEvaluator(Job(3), db, cut_off=False)
        evaluate(placements["a"])  # measured: not built again
        assert evaluate.prepare([placements[k] for k in "abcdb"]) == 2
        assert evaluate.job.built == [(["b", "c", "d"], 3)]
        for key in "bcd":
            evaluate(placements[key])
        assert evaluate.job.runs == [("a", None), ("b", "b.so"), ("c", None), ("d", "d.so"), ("d", None)]
        assert not (tmp_path / "b.so").exists() and not (tmp_path / "d.so").exists()  # removed once timed
        assert evaluate.spent_s > 0
        evaluate.prepare([placements[k] for k in "abcd"])  # all measured now
        assert len(evaluate.job.built) == 1
        db.put_end_to_end(genome_key(placements["a"]), Cost.measured(0.1, 0.0, 5))
        other = {k: [Partition("tvm", "tvm.op", [7, n], k, Cost.unknown())] for n, k in enumerate("xy")}
        assert evaluate.prepare(list(other.values())) == 2
        evaluate.discard_prebuilt()  # the search stopped before measuring them
        assert not (tmp_path / "x.so").exists() and not (tmp_path / "y.so").exists() and not evaluate.prebuilt
