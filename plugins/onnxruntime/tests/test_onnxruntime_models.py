"""Whole models through the backend: the shipped models, and ``optimize`` with ONNX Runtime.

Numerics are compared with the model's own reference (ONNX Runtime on the original ONNX file) or
numpy, within RTOL/ATOL.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import relax

import collage_core
from collage_core.kit import RelaxGraph, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import MeasureSettings, TwoLevelSettings, build, contribute_patterns, partition_module
from collage_core.kit.testing.placement_cases import check_original_file_runs_whole

MODELS = Path(__file__).resolve().parents[3] / "models"
TARGET = tvm_compat.host_cpu_target()
DEVICE = tvm.cpu(0)
RTOL, ATOL = 1e-5, 1e-5


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_shipped_model_runs_whole_on_onnxruntime(pm, backends, name):
    model = load_model(MODELS / f"{name}.onnx")
    graph = RelaxGraph.from_function(model.mod["main"])
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backends["onnxruntime"], TARGET))
    assert sorted(n for c in candidates for n in c.nodes) == list(range(len(graph.graph)))

    everything = SimpleNamespace(backend="onnxruntime", pattern="onnxruntime.region", nodes=frozenset(range(len(graph.graph))))
    executable = build(pm, partition_module(graph, [everything]), backends, TARGET)
    inputs = model.random_inputs(seed=2)
    vm = relax.VirtualMachine(executable, DEVICE)
    result = vm["main"](*[tvm_compat.to_tensor(a, DEVICE) for a in inputs])
    np.testing.assert_allclose(tvm_compat.to_numpy(result), model.reference(inputs)[0], rtol=RTOL, atol=ATOL)


def dense_norm_softmax() -> tvm.IRModule:
    """softmax(layer_norm(x @ W + b)): four operators ONNX Runtime and TVM both run."""
    rng = np.random.default_rng(0)
    weight, bias = rng.uniform(-1, 1, size=(16, 16)).astype("float32"), rng.uniform(-1, 1, size=(16,)).astype("float32")
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            dense = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(weight)), relax.const(bias)))
            ones, zeros = relax.const(np.ones(16, "float32")), relax.const(np.zeros(16, "float32"))
            normalized = bb.emit(relax.op.nn.layer_norm(dense, ones, zeros, axes=[-1]))
            output = bb.emit_output(relax.op.nn.softmax(normalized, axis=-1))
        bb.emit_func_output(output)
    return bb.get(), weight, bias


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_the_original_file_runs_whole_in_onnxruntimes_own_session(pm, backends, name):
    """collage_lower_whole_model: the library whose one partition is onnxruntime's own session over the ONNX
    file, not Collage's conversion of it, computes what ONNX Runtime's reference does within RTOL/ATOL
    (the same engine as the reference, with Collage's thread count: sums may be split otherwise)."""
    check_original_file_runs_whole(pm, backends, "onnxruntime", MODELS / f"{name}.onnx", TARGET, RTOL, ATOL)


def test_optimize_measures_and_places_with_onnxruntime(tmp_path):
    mod, weight, bias = dense_norm_softmax()
    result = collage_core.optimize(
        mod,
        backends=["onnxruntime", "tvm"],
        cost_db=tmp_path / "costs.sqlite",
        two_level=TwoLevelSettings(population=2, generations=1),
        settings=MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=2.0, time_bound_s=1.0),
        compare_backends=False,
        show_progress=False,
    )
    assert {p.backend for p in result.placement.partitions} <= {"onnxruntime", "tvm"}
    assert result.two_level is not None and result.two_level.measured >= 1
    (x,) = result.model.random_inputs(seed=4)
    dense = x @ weight + bias
    normalized = (dense - dense.mean(-1, keepdims=True)) / np.sqrt(dense.var(-1, keepdims=True) + 1e-5)
    expected = np.exp(normalized) / np.exp(normalized).sum(-1, keepdims=True)
    np.testing.assert_allclose(result.run(x)[0], expected, rtol=RTOL, atol=ATOL)
