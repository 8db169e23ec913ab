"""Measuring candidates: a cost spread far above the goal is measured again and the steadier kept,
and one that stays noisy is named in the measurement report."""

from __future__ import annotations

import os
from pathlib import Path

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.candidates import enumerate_candidates
from collage_core.cost_db import CostDatabase
from collage_core.measure import is_noisy, measure_candidates
from collage_core.model_import import load_model
from collage_core.plugins import get_plugin_manager
from collage_core.relax_graph import RelaxGraph
from collage_core.timing import MeasureSettings

TESTS = Path(__file__).resolve().parent
MODULE = "plugins_for_tests.noisy_cost_plugin"


def test_a_noisy_cost_is_measured_again_and_one_that_stays_noisy_is_named(monkeypatch, tmp_path):
    from plugins_for_tests import noisy_cost_plugin as plugin

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    settings = MeasureSettings(build_workers=1)
    assert is_noisy(plugin.NOISY, settings) and not is_noisy(plugin.STEADY, settings)
    pm = get_plugin_manager(extra_modules=[MODULE])
    infos = discover_backends(pm)
    target = tvm_compat.host_cpu_target()
    model = load_model(str(TESTS.parent / "models" / "tiny_resnet.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    backends = {name: infos[name].backend for name in plugin.BACKENDS}
    candidates = []
    for name in plugin.BACKENDS:
        patterns = contribute_patterns(pm, infos[name].backend, target)
        candidates += [c for c in enumerate_candidates(graph, patterns) if c.nodes == {0}]
    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        report = measure_candidates(graph, candidates, backends, target, db, settings, [MODULE], show_progress=False)
    by_backend = {c.backend: report.costs[c.key] for c in candidates}
    assert by_backend == {"noisyonce": plugin.STEADY, "alwaysnoisy": plugin.NOISY}
    assert report.noisy == tuple(c.key for c in candidates if c.backend == "alwaysnoisy")

