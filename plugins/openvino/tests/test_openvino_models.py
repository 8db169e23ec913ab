"""Whole models through the backend: the shipped models on OpenVINO alone, and ``optimize`` with
OpenVINO, ONNX Runtime and TVM together (two graph-level backends in one two-level search).

Numerics are compared with the model's own reference (ONNX Runtime on the original ONNX file)
within RTOL/ATOL: float32 sums over a few hundred products, ordered differently by each engine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import relax

import collage_core
from collage_core.kit import RelaxGraph, load_model, tvm_compat
from collage_core.kit.testing import MeasureSettings, TwoLevelSettings, build, partition_module
from collage_core.kit.testing.placement_cases import F, R, check_original_file_runs_whole, module

MODELS = Path(__file__).resolve().parents[3] / "models"
TARGET = tvm_compat.host_cpu_target()
DEVICE = tvm.cpu(0)
RTOL, ATOL = 1e-4, 1e-5
WEIGHT = np.random.default_rng(0).uniform(-1, 1, size=(16, 16)).astype("float32")
BIAS = np.random.default_rng(1).uniform(-1, 1, size=(16,)).astype("float32")


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_shipped_model_runs_whole_on_openvino(pm, backends, name):
    model = load_model(MODELS / f"{name}.onnx")
    graph = RelaxGraph.from_function(model.mod["main"])
    everything = SimpleNamespace(backend="openvino", pattern="openvino.region", nodes=frozenset(range(len(graph.graph))))
    executable = build(pm, partition_module(graph, [everything]), backends, TARGET)
    inputs = model.random_inputs(seed=2)
    result = relax.VirtualMachine(executable, DEVICE)["main"](*[tvm_compat.to_tensor(a, DEVICE) for a in inputs])
    np.testing.assert_allclose(tvm_compat.to_numpy(result), model.reference(inputs)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_the_original_file_runs_whole_in_openvinos_own_session(pm, backends, name):
    """collage_lower_whole_model: the library whose one partition is openvino's own session over the ONNX
    file, not Collage's conversion of it, computes what ONNX Runtime's reference does within RTOL/ATOL
    (OpenVINO's kernels order float32 sums otherwise than ONNX Runtime's)."""
    check_original_file_runs_whole(pm, backends, "openvino", MODELS / f"{name}.onnx", TARGET, RTOL, ATOL)


def test_optimize_searches_openvino_beside_onnxruntime_and_tvm(tmp_path):
    def dense_norm_softmax(bb, x):
        dense = bb.emit(R.add(R.matmul(x, relax.const(WEIGHT)), relax.const(BIAS)))
        normalized = bb.emit(R.nn.layer_norm(dense, relax.const(np.ones(16, F)), relax.const(np.zeros(16, F)), axes=[-1]))
        return R.nn.softmax(normalized, axis=-1)

    result = collage_core.optimize(
        module(dense_norm_softmax, ((4, 16), F)),
        backends=["openvino", "onnxruntime", "tvm"],
        cost_db=tmp_path / "costs.sqlite",
        two_level=TwoLevelSettings(population=2, generations=1),
        settings=MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=1.0, time_bound_s=0.5),
        compare_backends=False,
        show_progress=False,
    )
    assert result.two_level is not None and result.two_level.measured >= 2
    assert {p.backend for p in result.placement.partitions} <= {"openvino", "onnxruntime", "tvm"}
    (x,) = result.model.random_inputs(seed=4)
    dense = x @ WEIGHT + BIAS
    normalized = (dense - dense.mean(-1, keepdims=True)) / np.sqrt(dense.var(-1, keepdims=True) + 1e-5)
    expected = np.exp(normalized) / np.exp(normalized).sum(-1, keepdims=True)
    np.testing.assert_allclose(result.run(x)[0], expected, rtol=RTOL, atol=ATOL)
