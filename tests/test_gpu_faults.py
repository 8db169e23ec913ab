"""Measuring on a GPU survives kernels that fault, hang or run out of memory: each costs its candidate alone.

Marked ``gpu``. The kernels are real (tests/plugins_for_tests/gpu_faults.py): an illegal memory
access leaves its process's CUDA context unusable, so the next candidate must get a fresh worker
and a healthy GPU; a spinning kernel is stopped by the measurement's timeout; 4 TiB of device
memory is refused by the driver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.measure.cost_db import CostDatabase
from collage_core.measure.measurement import measure_candidates
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parent
PLUGIN = "plugins_for_tests.gpu_faults"
# A healthy single-operator candidate is built and timed within seconds; the spinning kernel waits this out.
TIMEOUT_S = 45.0
QUICK = MeasureSettings(warmup=1, min_repeats=3, max_repeats=5, min_repeat_ms=1.0, time_bound_s=1.0, timeout_s=TIMEOUT_S, build_workers=1)


@pytest.fixture
def plugins(load_test_plugin):
    pm, backends = load_test_plugin(PLUGIN)
    from plugins_for_tests.gpu_faults import BACKENDS

    return pm, {name: backend for name, backend in backends.items() if name in BACKENDS}


def test_faulting_hanging_and_oversized_kernels_cost_their_candidates_alone(plugins, tmp_path):
    from plugins_for_tests.gpu_faults import FAULTING, HANGING, OUT_OF_MEMORY

    pm, backends = plugins
    target = tvm_compat.make_target("cuda")
    model = load_model(str(TESTS.parent / "models" / "tiny_resnet.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    ops = graph.graph.ops
    chosen = []
    for name in (FAULTING, OUT_OF_MEMORY, HANGING):  # per backend: its first conv2d, then two other operators
        single = [c for c in enumerate_candidates(graph, contribute_patterns(pm, backends[name], target)) if len(c.nodes) == 1]
        conv = next(c for c in single if ops[next(iter(c.nodes))] == "relax.nn.conv2d")
        others = [c for c in single if ops[next(iter(c.nodes))] in ("relax.nn.relu", "relax.add")][:2]
        chosen += [conv, *others]
    with CostDatabase.open(tmp_path / "costs.sqlite") as db:
        report = measure_candidates(graph, chosen, backends, target, db, QUICK, plugin_modules=[PLUGIN], disabled=(), show_progress=False)
    costs = {c.key: report.costs[c.key] for c in chosen}
    conv_cost = {c.backend: costs[c.key] for c in chosen if "conv2d" in ops[next(iter(c.nodes))]}
    assert "illegal memory access" in conv_cost[FAULTING].reason, conv_cost[FAULTING]
    assert conv_cost[OUT_OF_MEMORY].reason.startswith("out of GPU memory"), conv_cost[OUT_OF_MEMORY]
    assert f"timed out after {TIMEOUT_S:.0f} s" in conv_cost[HANGING].reason, conv_cost[HANGING]
    healthy = [c for c in chosen if "conv2d" not in ops[next(iter(c.nodes))]]
    assert len(healthy) == 6
    for candidate in healthy:  # measured on a healthy GPU, whichever fault came before
        assert costs[candidate.key].is_measured, (candidate.backend, candidate.pattern, costs[candidate.key])
