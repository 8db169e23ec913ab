"""Whole models through the backend: the shipped models on TorchInductor alone, and ``optimize`` with
TorchInductor named beside OpenVINO, ONNX Runtime and TVM (three graph-level backends in one
two-level search).

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
from collage_core.kit.testing.placement_cases import F, R, module

MODELS = Path(__file__).resolve().parents[3] / "models"
TARGET = tvm_compat.host_cpu_target()
DEVICE = tvm.cpu(0)
RTOL, ATOL = 1e-4, 1e-5
WEIGHT = np.random.default_rng(0).uniform(-1, 1, size=(16, 16)).astype("float32")
BIAS = np.random.default_rng(1).uniform(-1, 1, size=(16,)).astype("float32")


# Inductor compiles each whole model for several seconds: one in the default run, the rest slow.
@pytest.mark.parametrize(
    "name", [pytest.param("tiny_resnet", marks=pytest.mark.slow), "tiny_bert", pytest.param("tiny_gpt2", marks=pytest.mark.slow)]
)
def test_shipped_model_runs_whole_on_inductor(pm, backends, name):
    model = load_model(MODELS / f"{name}.onnx")
    graph = RelaxGraph.from_function(model.mod["main"])
    everything = SimpleNamespace(backend="inductor", pattern="inductor.region", nodes=frozenset(range(len(graph.graph))))
    executable = build(pm, partition_module(graph, [everything]), backends, TARGET)
    inputs = model.random_inputs(seed=2)
    result = relax.VirtualMachine(executable, DEVICE)["main"](*[tvm_compat.to_tensor(a, DEVICE) for a in inputs])
    np.testing.assert_allclose(tvm_compat.to_numpy(result), model.reference(inputs)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # 40 s on 2 cores: every placement with an Inductor region compiles it
def test_optimize_searches_inductor_beside_the_other_graph_level_backends(tmp_path):
    def dense_norm_softmax(bb, x):
        dense = bb.emit(R.add(R.matmul(x, relax.const(WEIGHT)), relax.const(BIAS)))
        normalized = bb.emit(R.nn.layer_norm(dense, relax.const(np.ones(16, F)), relax.const(np.zeros(16, F)), axes=[-1]))
        return R.nn.softmax(normalized, axis=-1)

    result = collage_core.optimize(
        module(dense_norm_softmax, ((4, 16), F)),
        backends=["inductor", "openvino", "onnxruntime", "tvm"],
        cost_db=tmp_path / "costs.sqlite",
        two_level=TwoLevelSettings(population=2, generations=1),
        settings=MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=1.0, time_bound_s=0.5),
        compare_backends=False,
        show_progress=False,
    )
    assert result.two_level is not None and result.two_level.measured >= 2
    assert {p.backend for p in result.placement.partitions} <= {"inductor", "openvino", "onnxruntime", "tvm"}
    (x,) = result.model.random_inputs(seed=4)
    dense = x @ WEIGHT + BIAS
    normalized = (dense - dense.mean(-1, keepdims=True)) / np.sqrt(dense.var(-1, keepdims=True) + 1e-5)
    expected = np.exp(normalized) / np.exp(normalized).sum(-1, keepdims=True)
    np.testing.assert_allclose(result.run(x)[0], expected, rtol=RTOL, atol=ATOL)
