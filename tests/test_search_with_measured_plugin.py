"""The whole measure-then-search path, driven by the deterministic cost plugin, checked by brute force."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tvm
from test_search import assert_executable_exact_cover, brute_force_minimum
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.build.executable import build
from collage_core.build.partition import partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.cost_db import CostDatabase
from collage_core.measure.measurement import measure_candidates
from collage_core.measure.timing import MeasureSettings
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.search.op_level import search_op_level

PLUGIN = "plugins_for_tests.deterministic_cost_plugin"
TESTS = Path(__file__).parent


def _const(rng, *shape):
    return relax.const(rng.uniform(-1, 1, size=shape).astype("float32"))


def residual_graph() -> tvm.IRModule:
    """matmul+add+relu, a residual add, two branches concatenated, and two outputs."""
    rng = np.random.default_rng(7)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, _const(rng, 8, 8)))
            h = bb.emit(relax.op.add(h, _const(rng, 8)))
            h = bb.emit(relax.op.nn.relu(h))
            residual = bb.emit(relax.op.add(h, x))
            branches = [bb.emit(relax.op.nn.relu(relax.op.add(residual, _const(rng, 8)))) for _ in range(2)]
            joined = bb.emit(relax.op.concat(branches, axis=1))
            first = bb.emit_output(relax.op.multiply(joined, _const(rng, 16)))
            second = bb.emit_output(relax.op.nn.relu(residual))
        bb.emit_func_output(relax.Tuple([first, second]))
    return bb.get()


@pytest.fixture
def plugin_env(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def test_measured_search_is_optimal_and_builds(plugin_env, tmp_path):
    pm = get_plugin_manager(extra_modules=[PLUGIN])
    infos = discover_backends(pm)
    backends = {name: info.backend for name, info in infos.items() if name in ("tvm", "twin")}
    target = tvm_compat.host_cpu_target()
    graph = RelaxGraph.from_function(relax.transform.ConvertToDataflow()(residual_graph())["main"])
    patterns = [p for b in backends.values() for p in contribute_patterns(pm, b, target)]
    candidates = enumerate_candidates(graph, patterns)
    assert {c.backend for c in candidates} == {"tvm", "twin"}
    assert any(len(c.nodes) > 1 for c in candidates)

    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        report = measure_candidates(
            graph, candidates, backends, target, db, MeasureSettings(), pm.module_plugin_names(), show_progress=False
        )
        assert report.measured == report.distinct and report.invalid == 0
        again = measure_candidates(
            graph, candidates, backends, target, db, MeasureSettings(), pm.module_plugin_names(), show_progress=False
        )
        assert again.measured == 0 and again.from_database == report.distinct

    placement = search_op_level(graph.graph, candidates, report.costs)
    assert_executable_exact_cover(graph.graph, placement)
    total = sum(report.costs[c.key].seconds for c in placement)
    assert total == pytest.approx(brute_force_minimum(graph.graph, candidates, report.costs), rel=1e-12)

    executable = build(pm, partition_module(graph, placement), backends, target)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    x = np.random.default_rng(0).uniform(-1, 1, size=(4, 8)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x))
    for out, ref in zip(got, numpy_reference(x)):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def numpy_reference(x):
    """residual_graph in numpy, drawing the constants in the same order."""
    rng = np.random.default_rng(7)
    draw = lambda *shape: rng.uniform(-1, 1, size=shape).astype("float32")  # noqa: E731
    h = np.maximum(x @ draw(8, 8) + draw(8), 0)
    residual = h + x
    joined = np.concatenate([np.maximum(residual + draw(8), 0) for _ in range(2)], axis=1)
    return joined * draw(16), np.maximum(residual, 0)
