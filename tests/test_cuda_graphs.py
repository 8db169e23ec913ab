"""Placements built for a CUDA target replay as CUDA graphs: partitions inlined into ``main`` after
each was fused on its own, kernel and library calls captured, what reads inputs or writes outputs
left outside.

The lowering and the build need no GPU (TVM generates CUDA code here); running the graphs does,
and those tests are marked ``gpu``: outputs equal to launching kernel by kernel and to ONNX
Runtime on inputs that change from call to call, within 1e-4 (float32, TF32 off).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.build.executable import build, lower_partitions
from collage_core.build.partition import partition_module
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager

MODELS = Path(__file__).resolve().parents[1] / "models"
CUDA = {"kind": "cuda", "arch": "sm_90"}
CAPTURE = "vm.builtin.cuda_graph.run_or_capture"


def largest_first_placement(pm, infos, graph, backends, target):
    """A placement without measuring: each backend's largest candidates first (in ``backends``'
    order), TVM's single operators for the rest. Only to have partitions of several backends to build."""
    patterns = [p for name in backends for p in contribute_patterns(pm, infos[name].backend, target)]
    candidates = enumerate_candidates(graph, patterns)
    taken, parts = set(), []
    for name in backends:
        for candidate in sorted((c for c in candidates if c.backend == name), key=lambda c: (-len(c.nodes), c.nodes)):
            if name == "tvm" and candidate.pattern != "tvm.op":
                continue
            if not taken & set(candidate.nodes):
                parts.append(candidate)
                taken |= set(candidate.nodes)
    return parts


@pytest.fixture(scope="module")
def tiny_bert_on_tvm():
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    target = tvm_compat.make_target(CUDA)
    model = load_model(str(MODELS / "tiny_bert.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    parts = largest_first_placement(pm, infos, graph, ["tvm"], target)
    backends = {"tvm": infos["tvm"].backend}
    return pm, backends, target, partition_module(graph, parts)


def _kernels(func) -> list[str]:
    """The PrimFuncs and packed functions ``func`` calls, in order."""
    return re.findall(r"^\s*(?:\w+: [^=]+= )?([A-Za-z_]\w*)\(", func.script(), flags=re.M)


def test_partitions_are_inlined_and_main_replays_its_kernels_as_one_cuda_graph(tiny_bert_on_tvm):
    pm, backends, target, mod = tiny_bert_on_tvm
    partitions = [gvar.name_hint for gvar in mod.functions if gvar.name_hint.startswith("collage_")]
    assert len(partitions) > 20
    lowered = tvm_compat.lowered_for_cuda_graphs(lower_partitions(pm, mod, backends, target), target)
    main = lowered["main"].script()
    assert main.count(CAPTURE) == 1
    # No partition is called: TVM's kernels carry their partition's name (collage_tvm_3_fused_...), its call does not.
    assert not [name for name in partitions if re.search(rf"\b{re.escape(name)}\(", main)]
    captured = next(func for gvar, func in lowered.functions.items() if gvar.name_hint.endswith("_cuda_graph_capture"))
    inside = [name for name in _kernels(captured) if name not in ("R",)]
    outside = [name for name in _kernels(lowered["main"]) if name not in ("R",)]
    # Only what reads the token ids (embedding lookups) and what writes the output stays outside.
    assert len(outside) <= 5, outside
    assert len(inside) >= 6 * len(outside), (inside, outside)


def test_tvm_fusion_still_stops_at_partition_boundaries(tiny_bert_on_tvm):
    pm, backends, target, mod = tiny_bert_on_tvm
    lowered = lower_partitions(pm, mod, backends, target)
    replaying = tvm_compat.lowered_for_cuda_graphs(lowered, target)
    with target:
        plain = relax.get_default_pipeline(target)(lowered)

    def kernels(module):
        return sorted(gvar.name_hint for gvar, func in module.functions.items() if isinstance(func, tvm.tirx.PrimFunc))

    assert kernels(replaying) == kernels(plain)


def test_a_cuda_build_calls_the_capture_builtin_only_with_cuda_graphs_on(tiny_bert_on_tvm):
    pm, backends, target, mod = tiny_bert_on_tvm
    assert CAPTURE in build(pm, mod, backends, target, cuda_graphs=True).as_text()
    assert CAPTURE not in build(pm, mod, backends, target, cuda_graphs=False).as_text()


def test_a_cpu_build_ignores_cuda_graphs():
    model = load_model(str(MODELS / "tiny_resnet.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    target = tvm_compat.host_cpu_target()
    parts = largest_first_placement(pm, infos, graph, ["tvm"], target)
    executable = build(pm, partition_module(graph, parts), {"tvm": infos["tvm"].backend}, target, cuda_graphs=True)
    assert CAPTURE not in executable.as_text()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, backends", [("tiny_bert", ["cublas", "tvm"]), ("tiny_resnet", ["cudnn", "tvm"]), ("tiny_gpt2", ["cublas", "tvm"])]
)
def test_replayed_graphs_compute_what_kernel_by_kernel_launches_compute_as_inputs_change(name, backends):
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    target = tvm_compat.make_target("cuda")
    model = load_model(str(MODELS / f"{name}.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    parts = largest_first_placement(pm, infos, graph, backends, target)
    assert any(part.backend != "tvm" for part in parts)
    placed = partition_module(graph, parts)
    chosen = {backend: infos[backend].backend for backend in backends}
    device = tvm_compat.device_for(target)
    replaying = relax.VirtualMachine(build(pm, placed, chosen, target, cuda_graphs=True), device)
    launching = relax.VirtualMachine(build(pm, placed, chosen, target, cuda_graphs=False), device)
    for seed in (1, 2, 3, 4):  # the first call captures; the later ones replay on new inputs
        inputs = model.random_inputs(seed=seed)
        args = [tvm_compat.to_tensor(x, device) for x in inputs]
        replayed = _first(replaying["main"](*args))
        launched = _first(launching["main"](*args))
        np.testing.assert_allclose(replayed, launched, rtol=1e-5, atol=1e-5, equal_nan=False)
        np.testing.assert_allclose(replayed, model.reference(inputs)[0], rtol=1e-4, atol=1e-4)


def _first(result) -> np.ndarray:
    return tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])
