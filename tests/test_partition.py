"""Candidates over a real graph, their keys, and placements applied, built and checked against ONNX Runtime."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.build.executable import build
from collage_core.build.partition import PartitionError, partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.verify import compare_outputs
from collage_core.plugins import get_plugin_manager
from collage_core.records import Candidate, Cost
from collage_core.search.op_level import search_op_level

TINY_RESNET = Path(__file__).parent.parent / "models" / "tiny_resnet.onnx"
# Registers ``twin``, a second backend lowered by TVM, so that a placement can mix two backends.
TWIN_PLUGIN = "plugins_for_tests.deterministic_cost_plugin"
TWIN = "twin"
PLACEMENT_SEED = 3
# float32 kernels of TVM and ONNX Runtime differ in summation order only: errors near 1e-7 of the output scale.
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def plugins():
    pm = get_plugin_manager(disabled=(), extra_modules=[TWIN_PLUGIN])
    assert not pm.failures
    return pm, {name: info.backend for name, info in discover_backends(pm).items()}


def patterns_of(plugins, *backend_names):
    pm, backends = plugins
    target = tvm_compat.host_cpu_target()
    return [pattern for name in backend_names for pattern in contribute_patterns(pm, backends[name], target)]


@pytest.fixture(scope="module")
def tiny_resnet():
    return load_model(TINY_RESNET)


@pytest.fixture(scope="module")
def resnet_graph(tiny_resnet):
    return RelaxGraph.from_function(tiny_resnet.mod["main"])


@pytest.fixture(scope="module")
def tvm_candidates(plugins, resnet_graph):
    return enumerate_candidates(resnet_graph, patterns_of(plugins, "tvm"))


def descendants(graph) -> list[frozenset[int]]:
    found: list[frozenset[int]] = [frozenset()] * len(graph)
    for node in reversed(range(len(graph))):
        found[node] = frozenset(graph.succs[node]).union(*(found[succ] for succ in graph.succs[node]))
    return found


def test_every_candidate_is_convex_and_contains_its_root(plugins, resnet_graph, tvm_candidates):
    graph = resnet_graph.graph
    below = descendants(graph)
    patterns = {pattern.name: pattern for pattern in patterns_of(plugins, "tvm")}
    var2val = relax.analysis.get_var2val(resnet_graph.func)
    assert len({c.pattern for c in tvm_candidates}) > 3, "expected fused groups, not only single operators"
    for candidate in tvm_candidates:
        between = {node for member in candidate.nodes for node in below[member]} - candidate.nodes
        assert not any(below[node] & candidate.nodes for node in between), f"{candidate} is not convex"
        # The pattern is rooted at the group's last operator, which every other member feeds.
        root = max(candidate.nodes)
        assert all(root in below[member] for member in candidate.nodes - {root}), candidate
        assert patterns[candidate.pattern].dpl.match(resnet_graph.call(root), var2val), candidate


def test_single_operator_candidates_cover_every_operator(resnet_graph, tvm_candidates):
    singletons = {candidate.nodes for candidate in tvm_candidates if candidate.pattern == "tvm.op"}
    assert singletons == {frozenset([node]) for node in range(len(resnet_graph.graph))}


def residual_block(bb, x, rng):
    """conv2d, bias add, relu, residual add, relu: five operators with weights drawn from ``rng``."""
    channels = int(x.ty.shape[1])
    weight = relax.const(rng.uniform(-1, 1, size=(channels, channels, 3, 3)).astype("float32"))
    bias = relax.const(rng.uniform(-1, 1, size=(1, channels, 1, 1)).astype("float32"))
    conv = bb.emit(relax.op.nn.conv2d(x, weight, padding=1))
    activated = bb.emit(relax.op.nn.relu(relax.op.add(conv, bias)))
    return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(activated, x))))


def two_equal_blocks_and_a_larger_one():
    """Two blocks of the same shapes and different weights in a chain, then one on a larger image."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((1, 4, 16, 16), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            second = residual_block(bb, residual_block(bb, x, rng), rng)
            larger = residual_block(bb, y, rng)
            output = bb.emit_output(relax.Tuple([second, larger]))
        bb.emit_func_output(output)
    return bb.get()


def test_structurally_equal_blocks_share_candidate_keys_and_other_shapes_do_not(plugins):
    graph = RelaxGraph.from_function(two_equal_blocks_and_a_larger_one()["main"])
    block_size = 5
    assert len(graph.graph) == 3 * block_size
    first_block, _ = graph.region_function(range(block_size))
    second_block, _ = graph.region_function(range(block_size, 2 * block_size))
    assert not tvm_compat.structural_equal(first_block, second_block), "the weights should differ"

    candidates = enumerate_candidates(graph, patterns_of(plugins, "tvm"))
    by_place = {(c.pattern, c.nodes): c.key for c in candidates}
    in_first_block = [c for c in candidates if max(c.nodes) < block_size]
    assert any(len(c.nodes) == block_size for c in in_first_block), "the whole block should be one candidate"
    for candidate in in_first_block:
        second = by_place[(candidate.pattern, frozenset(n + block_size for n in candidate.nodes))]
        larger = by_place[(candidate.pattern, frozenset(n + 2 * block_size for n in candidate.nodes))]
        assert candidate.key == second, candidate
        assert candidate.key != larger, candidate


def random_placement(graph, candidates, seed: int):
    """A valid placement chosen by the search under seeded random costs."""
    rng = random.Random(seed)
    costs = {key: Cost.measured(rng.uniform(0.0, 1.0), 0.0, 1) for key in sorted({c.key for c in candidates})}
    return search_op_level(graph.graph, candidates, costs)


def test_random_mixed_placement_builds_and_matches_onnx_runtime(plugins, tiny_resnet, resnet_graph):
    pm, backends = plugins
    candidates = enumerate_candidates(resnet_graph, patterns_of(plugins, "tvm", TWIN))
    placement = random_placement(resnet_graph, candidates, PLACEMENT_SEED)
    assert {part.backend for part in placement} == {"tvm", TWIN}
    assert any(len(part.nodes) > 1 for part in placement)

    target = tvm_compat.host_cpu_target()
    executable = build(pm, partition_module(resnet_graph, placement), backends, target)
    device = tvm_compat.device_for(target)
    inputs = tiny_resnet.random_inputs(seed=2)
    result = relax.VirtualMachine(executable, device)["main"](*[tvm_compat.to_tensor(a, device) for a in inputs])
    outputs = [tvm_compat.to_numpy(result)]
    verification = compare_outputs(outputs, tiny_resnet.reference(inputs), tiny_resnet.reference_name, RTOL, ATOL)
    assert verification.passed, verification.describe()


def singletons(candidates, backend: str = "tvm"):
    return sorted((c for c in candidates if c.pattern == f"{backend}.op"), key=lambda c: c.sort_key)


def test_operator_placed_twice_is_refused_naming_it(plugins, resnet_graph, tvm_candidates):
    twin_candidates = enumerate_candidates(resnet_graph, patterns_of(plugins, TWIN))
    twin_relu = next(c for c in singletons(twin_candidates, TWIN) if c.nodes == {2})
    with pytest.raises(PartitionError, match=r"operator 2 \(relax.nn.relu\) is placed twice"):
        partition_module(resnet_graph, [*singletons(tvm_candidates), twin_relu])


def test_operator_left_out_is_refused_naming_it(resnet_graph, tvm_candidates):
    parts = [c for c in singletons(tvm_candidates) if c.nodes != {7}]
    with pytest.raises(PartitionError, match=r"operator 7 \(relax.add\) is not placed"):
        partition_module(resnet_graph, parts)


def test_groups_keep_the_primfuncs_their_call_tir_calls():
    """TVM's ONNX importer emits some operators (Clip with inputs) as call_tir of a PrimFunc."""
    from tvm import topi

    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            clipped = bb.emit_te(topi.maximum, x, 0.0)
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(clipped, x)))
        bb.emit_func_output(out)
    mod = bb.get()
    graph = RelaxGraph.from_function(mod["main"], mod)
    assert graph.graph.ops[0] == "relax.call_tir"
    standalone = graph.standalone_module([0])
    assert sorted(gv.name_hint for gv in standalone.functions.keys()) == ["main", "maximum"]

    pm = get_plugin_manager()
    backends = {name: info.backend for name, info in discover_backends(pm).items() if name == "tvm"}
    parts = [Candidate("tvm", "tvm.op", [node], f"k{node}") for node in range(len(graph.graph))]
    executable = build(pm, partition_module(graph, parts), backends, tvm_compat.host_cpu_target())
    data = np.random.default_rng(0).uniform(-1, 1, size=(2, 8)).astype("float32")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, np.maximum(np.maximum(data, 0) + data, 0), rtol=1e-6, atol=1e-6)
