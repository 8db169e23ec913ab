"""Measurement survives backends that raise, crash or hang: their candidates get invalid costs, the rest is measured."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import tvm
from plugins_for_tests.faulty_backends import CRASHING, FAULTS, HANGING, POISONING, POISONING_MESSAGE, RAISED_MESSAGE, RAISING
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.cost_db import CostDatabase
from collage_core.measure.measurement import _measure_one, measure_candidates
from collage_core.measure.timing import MeasureSettings
from collage_core.measure.worker_client import MeasurementWorker
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph

PLUGIN = "plugins_for_tests.faulty_backends"
TESTS = Path(__file__).resolve().parents[1]
# A worker builds and times one of these tiny candidates in well under a second even on a busy
# machine; the hanging backend's one distinct candidate waits this out once.
TIMEOUT_S = 3.0
QUICK = MeasureSettings(warmup=1, min_repeats=1, max_repeats=2, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=TIMEOUT_S)


@pytest.fixture
def plugins(load_test_plugin):
    """The faulty backends and TVM, loaded here and, through PYTHONPATH, in the measurement workers."""
    return load_test_plugin(PLUGIN)


def relu_of_relu() -> tvm.IRModule:
    """Two ReLUs of one shape: a backend's two single-operator candidates share a key, so each fault happens once."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.nn.relu(x))))
        bb.emit_func_output(output)
    return bb.get()


@pytest.fixture
def graph():
    return RelaxGraph.from_function(relu_of_relu()["main"])


def candidates_of(plugins, graph, backend_names):
    pm, backends = plugins
    target = tvm_compat.host_cpu_target()
    patterns = [pattern for name in backend_names for pattern in contribute_patterns(pm, backends[name], target)]
    return enumerate_candidates(graph, patterns)


def measure(graph, candidates, backends, db, settings=QUICK):
    target = tvm_compat.host_cpu_target()
    return measure_candidates(graph, candidates, backends, target, db, settings, plugin_modules=[PLUGIN], disabled=(), show_progress=False)


@pytest.mark.parametrize("build_workers", [1, 2], ids=["built and timed in turn", "built two at once, then timed"])
def test_faulty_backends_get_invalid_costs_and_the_rest_is_measured_and_stored(plugins, graph, tmp_path, build_workers):
    _, backends = plugins
    if build_workers > 1:  # every backend's candidates go through the parallel builds
        backends = {name: attrs.evolve(b, lowering_uses_device=False) for name, b in backends.items()}
    settings = attrs.evolve(QUICK, build_workers=build_workers)
    candidates = candidates_of(plugins, graph, ["tvm", *FAULTS])
    with CostDatabase.open(tmp_path / "c.sqlite") as db:
        report = measure(graph, candidates, backends, db, settings)

        cost_of = {c.backend: report.costs[c.key] for c in candidates if c.backend in FAULTS}
        assert not any(cost.is_measured for cost in cost_of.values())
        assert f"RuntimeError: {RAISED_MESSAGE}" in cost_of[RAISING].reason
        assert "crashed with SIGABRT" in cost_of[CRASHING].reason
        assert f"timed out after {TIMEOUT_S:.0f} s" in cost_of[HANGING].reason
        tvm_patterns = {c.pattern for c in candidates if c.backend == "tvm"}
        assert tvm_patterns == {"tvm.op", "tvm.elementwise2"}
        assert all(report.costs[c.key].is_measured for c in candidates if c.backend == "tvm")
        assert (report.distinct, report.measured, report.invalid) == (5, 5, 3)
        assert len(db) == 5

        again = measure(graph, candidates, backends, db)
        assert (again.measured, again.from_database) == (0, 5)
        assert again.costs == report.costs


def test_worker_is_restarted_after_a_crash_and_measures_the_next_candidate(plugins, graph, tmp_path):
    candidates = candidates_of(plugins, graph, ["tvm", CRASHING])
    tvm_single, tvm_pair = (next(c for c in candidates if c.pattern == name) for name in ("tvm.op", "tvm.elementwise2"))
    crashing = next(c for c in candidates if c.backend == CRASHING)
    target = tvm_compat.host_cpu_target()
    with MeasurementWorker([PLUGIN], disabled=[]) as worker:
        assert _measure_one(worker, graph, tvm_single, target, QUICK, tmp_path).is_measured
        crashed_pid = worker.process.pid
        assert "crashed with SIGABRT" in _measure_one(worker, graph, crashing, target, QUICK, tmp_path).reason
        assert _measure_one(worker, graph, tvm_pair, target, QUICK, tmp_path).is_measured
        assert worker.process.pid != crashed_pid


def test_a_candidate_whose_fault_poisons_its_process_costs_itself_alone(plugins, tmp_path):
    """The next candidate gets a fresh worker: a faulting GPU kernel leaves its CUDA context unusable."""
    pm, backends = plugins
    model = load_model(str(TESTS.parent / "models" / "tiny_resnet.onnx"))
    tiny_resnet = RelaxGraph.from_function(model.mod["main"], model.mod)
    candidates = [c for c in candidates_of(plugins, tiny_resnet, [POISONING]) if len(c.nodes) == 1][:12]
    faulting = {c.key for c in candidates if tiny_resnet.graph.ops[next(iter(c.nodes))] == "relax.nn.conv2d"}
    assert faulting and len(faulting) < len({c.key for c in candidates})
    with CostDatabase.open(tmp_path / "c.sqlite") as db:
        report = measure(tiny_resnet, candidates, {POISONING: backends[POISONING]}, db, attrs.evolve(QUICK, build_workers=1))
    for key, cost in report.costs.items():
        if key in faulting:
            assert not cost.is_measured and POISONING_MESSAGE in cost.reason
        else:
            assert cost.is_measured, (key, cost)
