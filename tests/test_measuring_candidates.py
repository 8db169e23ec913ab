"""Measuring candidates: a cost spread far above the goal is measured again and the steadier kept,
and one that stays noisy is named in the measurement report; a candidate far slower than a known way to
compute its operators is timed by one run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.cost_db import CostDatabase
from collage_core.measure.measurement import CANDIDATE_CUTOFF_FACTOR, KnownAlternatives, is_noisy, measure_candidates
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Candidate, Cost

TESTS = Path(__file__).resolve().parent
MODULE = "plugins_for_tests.noisy_cost_plugin"


def measured(monkeypatch, tmp_path, module: str, backend_names, node_sets, settings: MeasureSettings):
    """The candidates of test plugin ``module``'s backends over ``node_sets`` of tiny_resnet, and their measurement."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    pm = get_plugin_manager(extra_modules=[module])
    infos = discover_backends(pm)
    target = tvm_compat.host_cpu_target()
    model = load_model(str(TESTS.parent / "models" / "tiny_resnet.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    backends = {name: infos[name].backend for name in backend_names}
    candidates = []
    for name in backend_names:
        patterns = contribute_patterns(pm, infos[name].backend, target)
        candidates += [c for c in enumerate_candidates(graph, patterns) if c.nodes in node_sets]
    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        return candidates, measure_candidates(graph, candidates, backends, target, db, settings, [module], show_progress=False)


def test_a_noisy_cost_is_measured_again_and_one_that_stays_noisy_is_named(monkeypatch, tmp_path):
    from plugins_for_tests import noisy_cost_plugin as plugin

    settings = MeasureSettings(build_workers=1)
    assert is_noisy(plugin.NOISY, settings) and not is_noisy(plugin.STEADY, settings)
    candidates, report = measured(monkeypatch, tmp_path, MODULE, plugin.BACKENDS, ({0},), settings)
    by_backend = {c.backend: report.costs[c.key] for c in candidates}
    assert by_backend == {"noisyonce": plugin.STEADY, "alwaysnoisy": plugin.NOISY}
    assert report.noisy == tuple(c.key for c in candidates if c.backend == "alwaysnoisy")


def test_a_candidate_far_slower_than_a_known_way_to_compute_its_operators_is_timed_by_one_run(monkeypatch, tmp_path):
    from plugins_for_tests import cutoff_plugin as plugin

    log = tmp_path / "cutoffs.jsonl"
    monkeypatch.setenv("CUTOFF_LOG", str(log))
    candidates, report = measured(
        monkeypatch, tmp_path, "plugins_for_tests.cutoff_plugin", plugin.BACKENDS, ({0}, {1}), MeasureSettings(build_workers=1)
    )
    given = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert given == [("afast", None)] * 2 + [("zslow", CANDIDATE_CUTOFF_FACTOR * plugin.FAST_S)] * 2
    assert {report.costs[c.key].repeats for c in candidates if c.backend == "zslow"} == {1}


def test_the_cheapest_known_way_is_a_candidate_of_the_same_operators_or_single_operators_summed():
    def candidate(*nodes):
        return Candidate("b", "b.p", frozenset(nodes), f"k{sorted(nodes)}")

    known = KnownAlternatives()
    assert known.cheapest({0, 1}) is None
    known.add(candidate(0), Cost.measured(2e-3, 0.0, 3))
    assert known.cheapest({0, 1}) is None  # operator 1 has no way yet
    known.add(candidate(1), Cost.measured(3e-3, 0.0, 3))
    assert known.cheapest({0, 1}) == 5e-3
    known.add(candidate(0, 1), Cost.measured(4e-3, 0.0, 3))
    known.add(candidate(0, 1), Cost.invalid("failed"))
    assert known.cheapest({0, 1}) == 4e-3 and known.cutoff_s(candidate(0, 1)) == CANDIDATE_CUTOFF_FACTOR * 4e-3
