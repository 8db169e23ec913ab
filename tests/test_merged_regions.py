"""A placement's adjacent partitions on a backend that compiles regions, merged (search/regions.py), and calibration
measuring that merged placement beside the one it came from (search/calibration.py), on a deterministic cost model."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from collage_core import tvm_compat
from collage_core.backends import discover_backends, select_backends
from collage_core.candidates.enumeration import candidates_for
from collage_core.measure.job import Job
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Candidate, Cost, Partition
from collage_core.search.baselines import searched_parts
from collage_core.search.calibration import MERGED_SUFFIX, calibrate, signature
from collage_core.search.graph import OpGraph
from collage_core.search.regions import execution_order, merged_regions

MODELS = Path(__file__).resolve().parents[1] / "models"
CPU = tvm_compat.make_target(tvm_compat.host_cpu_target())

#   0 cast -> 1 matmul -> 2 cast -> 3 add -> 4 tanh -> 5 mul(3, 4) -> 6 matmul -> 7 cast
# A "lib" backend runs the two products; "tvm" runs the rest, one operator per partition.
GRAPH = OpGraph(ops=["cast", "matmul", "cast", "add", "tanh", "mul", "matmul", "cast"], preds=[[], [0], [1], [2], [3], [3, 4], [5], [6]])
LIBRARY_NODES = (1, 6)


def placed(node: int) -> Partition:
    backend = "lib" if node in LIBRARY_NODES else "tvm"
    return Partition(backend, f"{backend}.op", {node}, f"{backend}{node}", Cost.measured(1e-3, 0.0, 3))


PARTS = [placed(node) for node in range(len(GRAPH))]


def by_nodes(parts) -> dict:
    return {p.nodes: p for p in parts}


def test_adjacent_partitions_of_the_backend_become_one_region_and_the_rest_stay_as_placed():
    merged = by_nodes(merged_regions(GRAPH, PARTS, {"tvm"}))
    assert set(merged) == {(0,), (1,), (2, 3, 4, 5), (6,), (7,)}
    region = merged[(2, 3, 4, 5)]
    assert (region.backend, region.pattern) == ("tvm", "tvm.region")
    assert region.cost == Cost.measured(4e-3, 0.0, 3)  # its four partitions' costs, summed
    for node in (0, 1, 6, 7):  # alone or on another backend: the candidate and its measured cost are kept
        assert merged[(node,)] == placed(node)


def test_a_region_never_swallows_a_path_through_another_backend():
    # 0 -> 1 (lib) -> 2 and 0 -> 2: merging 0 and 2 around the library's partition would not be convex.
    graph = OpGraph(ops=["cast", "matmul", "add"], preds=[[], [0], [0, 1]])
    parts = [placed(0), placed(1), Partition("tvm", "tvm.op", {2}, "tvm2", Cost.measured(1e-3, 0.0, 3))]
    assert signature(merged_regions(graph, parts, {"tvm"})) == signature(parts)


def test_backends_not_named_are_left_alone():
    assert signature(merged_regions(GRAPH, PARTS, {"other"})) == signature(PARTS)


def test_the_order_of_the_partitions_given_does_not_change_the_regions():
    shuffled = list(PARTS)
    random.Random(3).shuffle(shuffled)
    assert signature(merged_regions(GRAPH, shuffled, {"tvm"})) == signature(merged_regions(GRAPH, PARTS, {"tvm"}))
    order = [p.nodes for p in execution_order(GRAPH, shuffled)]
    assert order == [(n,) for n in range(len(GRAPH))]


def test_partitions_that_read_each_other_in_a_cycle_are_refused():
    graph = OpGraph(ops=["a", "b", "c"], preds=[[], [0], [1]])
    parts = [Partition("tvm", "tvm.op", {0, 2}, "x", Cost.unknown()), Partition("lib", "lib.op", {1}, "y", Cost.unknown())]
    with pytest.raises(ValueError, match="cycle"):
        execution_order(graph, parts)


class PerPartitionEndToEnd:
    """A deterministic cost model for testing calibration, never a default: every partition costs
    ``per_partition_s`` end to end whatever it holds; it records the placements measured."""

    def __init__(self, per_partition_s: float):
        self.per_partition_s = per_partition_s
        self.measured: list[tuple] = []

    def __call__(self, parts) -> Cost:
        self.measured.append(signature(parts))
        return Cost.measured(self.per_partition_s * len(parts), 0.0, 3)


CANDIDATES = [Candidate(p.backend, p.pattern, p.nodes, p.key) for p in PARTS]
COSTS = {p.key: p.cost for p in PARTS}


def merge(parts):
    return merged_regions(GRAPH, parts, {"tvm"})


def test_calibration_keeps_the_merged_placement_when_it_measures_faster():
    evaluate = PerPartitionEndToEnd(1e-3)
    result = calibrate(GRAPH, CANDIDATES, COSTS, PARTS, evaluate, rounds=0, merge=merge)
    assert signature(result.parts) == signature(merge(PARTS))
    assert result.alternative == "the op-level placement" + MERGED_SUFFIX
    assert result.merged == (5, Cost.measured(5e-3, 0.0, 3))
    assert result.latency.median_s == pytest.approx(5e-3)


def test_calibration_keeps_the_placement_when_merging_measures_slower():
    def slower_merged(parts):
        return Cost.measured((10e-3 if any(p.pattern == "tvm.region" for p in parts) else 1e-3), 0.0, 3)

    result = calibrate(GRAPH, CANDIDATES, COSTS, PARTS, slower_merged, rounds=0, merge=merge)
    assert signature(result.parts) == signature(PARTS)
    assert result.alternative == ""
    assert result.merged[0] == 5 and result.merged[1].median_s == pytest.approx(10e-3)


def test_calibration_measures_nothing_more_when_nothing_merges():
    evaluate = PerPartitionEndToEnd(1e-3)
    result = calibrate(GRAPH, CANDIDATES, COSTS, PARTS, evaluate, rounds=0, merge=lambda parts: parts)
    assert evaluate.measured == [signature(PARTS)]
    assert result.merged is None


@pytest.fixture(scope="module")
def gpt2_job(tmp_path_factory):
    pm = get_plugin_manager()
    found = discover_backends(pm)
    if not found["dnnl"].availability.available:
        pytest.skip(f"dnnl: {found['dnnl'].availability.reason}")
    chosen = select_backends(found, ["tvm", "dnnl"])
    imported = load_model(MODELS / "tiny_gpt2.onnx")
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    settings = MeasureSettings(build_workers=1, min_repeat_ms=1.0, max_repeats=3)
    return Job(imported, graph, CPU, pm, chosen, settings, tmp_path_factory.mktemp("job"), lambda message: None, False)


def test_tvm_compiles_its_merged_regions_of_a_real_placement_and_they_compute_the_same(gpt2_job):
    """oneDNN takes the products and TVM the rest (a deterministic cost model picks that placement, never a default);
    TVM's partitions between the products merge into regions, which TVM builds and runs as they would alone."""
    job = gpt2_job
    candidates = candidates_for(job.pm, job.graph, job.chosen, CPU, job.imported.precision)
    library_first = {c.key: Cost.measured(1e-6 if c.backend == "dnnl" else 1e-3, 0.0, 1) for c in candidates}
    parts = searched_parts(job.graph, candidates, library_first)
    assert {p.backend for p in parts} == {"dnnl", "tvm"}
    merged = merged_regions(job.graph.graph, parts, {"tvm"})
    regions = [p for p in merged if p.pattern == "tvm.region"]
    assert regions and len(merged) < len(parts) and all(len(p.nodes) > 1 for p in regions)
    assert [p for p in merged if p.backend == "dnnl"] == [p for p in parts if p.backend == "dnnl"]
    reference = job.imported.reference(job.inputs)
    as_placed, _ = job.run_built(parts, None)
    outputs, cost = job.run_built(merged, None)
    assert cost.is_measured
    for got, placed_output, expected in zip(outputs, as_placed, reference):
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)  # against ONNX Runtime on the original file
        np.testing.assert_allclose(got, placed_output, rtol=1e-5, atol=1e-6)


def test_a_region_of_the_whole_model_is_left_to_the_baselines_when_they_are_compared():
    """One region of every operator on the backend that builds whole models (TVM) is its unpartitioned build, which the
    baselines measure anyway; a region-compiling backend that does not build whole models keeps its whole region."""
    from types import SimpleNamespace

    from collage_core.records import OP_LEVEL, Backend
    from collage_core.search.stage import merge

    tvm_backend = Backend("tvm", OP_LEVEL, ("cpu",), "v", compiles_regions=True, builds_whole_models=True)
    job = SimpleNamespace(chosen=[SimpleNamespace(name="tvm", backend=tvm_backend)], graph=SimpleNamespace(graph=GRAPH))
    everything_on_tvm = [Partition("tvm", "tvm.op", {n}, f"t{n}", Cost.measured(1e-3, 0.0, 3)) for n in range(len(GRAPH))]
    assert [p.pattern for p in merge(job, whole_measured_later=False)(everything_on_tvm)] == ["tvm.region"]
    assert merge(job, whole_measured_later=True)(everything_on_tvm) == everything_on_tvm
    assert signature(merge(job, whole_measured_later=True)(PARTS)) == signature(merged_regions(GRAPH, PARTS, {"tvm"}))
    job.chosen[0].backend = Backend("tvm", OP_LEVEL, ("cpu",), "v", compiles_regions=True)  # no unpartitioned baseline
    assert [p.pattern for p in merge(job, whole_measured_later=True)(everything_on_tvm)] == ["tvm.region"]
    job.chosen[0].backend = Backend("tvm", OP_LEVEL, ("cpu",), "v")  # a backend that does not compile regions
    assert merge(job, whole_measured_later=False) is None


def test_a_merged_region_is_explained_as_merged_by_calibration_not_as_a_graph_level_region():
    from collage_core.outputs.explain import why

    region = next(p for p in merged_regions(GRAPH, PARTS, {"tvm"}) if p.pattern == "tvm.region")
    (line,) = why(region, PARTS)
    assert "tvm's partitions merged into one region" in line and "graph-level" not in line
