"""The backend's hooks, and partitions lowered to OpenVINO inside a mixed TVM executable.

Placements are built the way Collage builds them (``partition_module`` then ``build``), run on
Relax's VM and compared with numpy, as ``collage_core.kit.testing.placement_cases`` says.
"""

from __future__ import annotations

import sys

import collage_openvino
import numpy as np
import openvino
import pytest
import tvm
from collage_openvino import hooks, runtime
from tvm import relax

from collage_core.kit import GRAPH_LEVEL, RelaxGraph, engine_lowering, engine_operators, enumerate_candidates, relax_to_onnx, tvm_compat
from collage_core.kit.testing import contribute_patterns, partitions_by_backend
from collage_core.kit.testing.placement_cases import (
    CONV_INPUT,
    DEVICE,
    F,
    R,
    check_exported_library_runs_in_a_fresh_process,
    check_mixed_placements,
    check_runs_in_place,
    conv_bias_relu_scale,
    module,
    place,
)

TARGET = tvm_compat.host_cpu_target()


def test_collage_register_backends_registers_a_graph_level_cpu_backend(backends):
    backend = backends["openvino"]
    assert backend.kind == GRAPH_LEVEL and backend.device_kinds == ("cpu",)
    assert backend.version == f"{openvino.__version__.split('-')[0]}+lowering-{hooks.LOWERING_REVISION}"
    assert not backend.lowering_uses_device


def test_collage_check_availability_says_what_is_missing(backends, monkeypatch):
    assert hooks.collage_check_availability(backends["openvino"]).available
    assert hooks.collage_check_availability(backends["tvm"]) is None
    monkeypatch.setattr(runtime, "_CORE", type("NoCpu", (), {"available_devices": ["GPU"]})())
    availability = hooks.collage_check_availability(backends["openvino"])
    assert not availability.available and "no CPU plugin (devices: GPU)" in availability.reason
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if it were not installed
    availability = hooks.collage_check_availability(backends["openvino"])
    assert not availability.available and "cannot be imported" in availability.reason
    assert availability.reason.endswith(": pip install openvino")


def test_collage_contribute_patterns_one_checked_pattern_per_convertible_operator(pm, backends):
    patterns = contribute_patterns(pm, backends["openvino"], TARGET)
    assert [p.name for p in patterns] == [f"openvino.{op.rsplit('.', 1)[1]}" for op in engine_operators.SUPPORTED_OPS]
    assert hooks.collage_contribute_patterns(backends["openvino"], tvm.target.Target({"kind": "cuda"}), "fp32") == []

    def make(bb, x):
        conv = bb.emit(R.nn.conv2d(x, relax.const(np.ones((8, 3, 3, 3), F))))
        return R.cumsum(R.nn.relu(conv), axis=1)

    graph = RelaxGraph.from_function(module(make, CONV_INPUT)["main"])
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backends["openvino"], TARGET))
    assert [(sorted(c.nodes), c.pattern) for c in candidates] == [([0], "openvino.conv2d"), ([1], "openvino.relu")]


def test_collage_lower_partitions_replaces_the_body_by_one_packed_call(backends):
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), "openvino", {0, 1, 2})
    (name,) = partitions_by_backend(placed)["openvino"]
    lowered = hooks.collage_lower_partitions(backends["openvino"], placed, [name], TARGET)
    assert hooks.collage_lower_partitions(backends["tvm"], placed, [name], TARGET) is None
    (binding,) = lowered[name].body.blocks[0].bindings
    assert str(binding.value.args[0].global_symbol) == runtime.RUN_FUNCTION
    blob = tvm_compat.constant_array(binding.value.args[1].fields[0])
    assert engine_lowering.unpack_blob(blob)[0] == relax_to_onnx.convert(placed[name], name).SerializeToString()


def test_mixed_placements_beside_tvm_match_numpy(pm, backends):
    check_mixed_placements(pm, backends, "openvino", TARGET)


@pytest.mark.slow
def test_exported_library_runs_in_a_fresh_process(pm, backends, tmp_path):
    check_exported_library_runs_in_a_fresh_process(pm, backends, "openvino", TARGET, tmp_path)


def relu_blob():
    model = relax_to_onnx.convert(module(lambda bb, x: R.nn.relu(x), ((2, 3), F))["main"])
    return tvm_compat.to_tensor(engine_lowering.pack_blob(model.SerializeToString()), DEVICE)


def test_runtime_compiles_once_in_fp32_with_the_latency_hint_and_registers_idempotently():
    runtime.MODELS.clear()
    blob = relu_blob()
    x, out = (tvm_compat.to_tensor(np.full((2, 3), value, F), DEVICE) for value in (-1.0, 7.0))
    runtime.run(blob, x, out)
    runtime.register()
    tvm.get_global_func(runtime.RUN_FUNCTION)(blob, x, out)
    assert len(runtime.MODELS) == 1 and collage_openvino.runtime is runtime
    compiled = runtime.MODELS.get(blob.numpy()).compiled
    assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) in ("<Type: 'float32'>", "f32")
    assert str(compiled.get_property("PERFORMANCE_HINT")) in ("PerformanceMode.LATENCY", "LATENCY")


def test_runtime_reads_and_writes_the_tensors_in_place():
    check_runs_in_place(runtime.run, relu_blob(), runtime.REQUESTS_PER_THREAD)


def test_runtime_refuses_a_blob_that_does_not_match_its_digest():
    blob = engine_lowering.pack_blob(b"not really a model").copy()
    blob[-1] ^= 1
    with pytest.raises(ValueError, match="collage_openvino: the model blob does not match its digest"):
        runtime.MODELS.get(blob)
