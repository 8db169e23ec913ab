"""The backend's hooks, and partitions lowered to ONNX Runtime inside a mixed TVM executable.

Placements are built the way Collage builds them (``partition_module`` then ``build``), run on
Relax's VM and compared with numpy, as ``collage_core.kit.testing.placement_cases`` says.
"""

from __future__ import annotations

import sys

import collage_onnxruntime
import numpy as np
import onnxruntime
import pytest
import tvm
from collage_onnxruntime import hooks, runtime
from tvm import relax

from collage_core.kit import GRAPH_LEVEL, RelaxGraph, engine_lowering, engine_operators, enumerate_candidates, relax_to_onnx, tvm_compat
from collage_core.kit.testing import build, contribute_patterns, partitions_by_backend
from collage_core.kit.testing.placement_cases import (
    ATOL,
    DEVICE,
    HIDDEN,
    RNG,
    RTOL,
    TOKENS,
    F,
    R,
    attention,
    check_exported_library_runs_in_a_fresh_process,
    check_runs_in_place,
    conv_bias_relu_scale,
    module,
    numpy_attention,
    numpy_conv_bias_relu_scale,
    place,
    run_vm,
)

TARGET = tvm_compat.host_cpu_target()


def test_collage_register_backends_registers_a_graph_level_cpu_backend(backends):
    backend = backends["onnxruntime"]
    assert backend.kind == GRAPH_LEVEL
    assert backend.device_kinds == ("cpu",)
    assert backend.version == f"{onnxruntime.__version__}+lowering-{hooks.LOWERING_REVISION}"


def test_collage_check_availability_asks_for_the_cpu_provider(backends, monkeypatch):
    assert hooks.collage_check_availability(backends["onnxruntime"]).available
    assert hooks.collage_check_availability(backends["tvm"]) is None
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider"])
    availability = hooks.collage_check_availability(backends["onnxruntime"])
    assert not availability.available and "pip install onnxruntime" in availability.reason
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    availability = hooks.collage_check_availability(backends["onnxruntime"])
    assert not availability.available and "cannot be imported" in availability.reason
    assert availability.reason.endswith(": pip install onnxruntime")


def test_collage_contribute_patterns_one_checked_pattern_per_operator(pm, backends):
    patterns = contribute_patterns(pm, backends["onnxruntime"], TARGET)
    assert [p.name for p in patterns] == [f"onnxruntime.{op.rsplit('.', 1)[1]}" for op in engine_operators.SUPPORTED_OPS]
    assert len({p.name for p in patterns}) == len(patterns)
    assert all(p.check is not None for p in patterns)
    assert hooks.collage_contribute_patterns(backends["tvm"], TARGET, "fp32") is None
    assert hooks.collage_contribute_patterns(backends["onnxruntime"], tvm.target.Target({"kind": "cuda"}), "fp32") == []


def test_collage_contribute_patterns_refuses_what_the_converter_cannot_convert(pm, backends):
    def make(bb, x):
        nhwc = bb.emit(R.permute_dims(x, [0, 2, 3, 1]))
        conv = bb.emit(R.nn.conv2d(nhwc, relax.const(np.ones((3, 3, 3, 8), F)), data_layout="NHWC", kernel_layout="HWIO"))
        return R.cumsum(R.nn.relu(conv), axis=1)

    graph = RelaxGraph.from_function(module(make, ((1, 3, 6, 6), F))["main"])
    assert list(graph.graph.ops) == ["relax.permute_dims", "relax.nn.conv2d", "relax.nn.relu", "relax.cumsum"]
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backends["onnxruntime"], TARGET))
    assert [(sorted(c.nodes), c.pattern) for c in candidates] == [([0], "onnxruntime.permute_dims"), ([2], "onnxruntime.relu")]


def test_collage_lower_partitions_conv_bias_relu(pm, backends):
    graph, placed = place(module(conv_bias_relu_scale, ((1, 3, 8, 8), F)), "onnxruntime", {0, 1, 2})
    assert {b: len(names) for b, names in partitions_by_backend(placed).items()} == {"onnxruntime": 1, "tvm": 1}
    executable = build(pm, placed, backends, TARGET)
    x = RNG.uniform(-1, 1, size=(1, 3, 8, 8)).astype(F)
    np.testing.assert_allclose(run_vm(executable, x), numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


def test_collage_lower_partitions_attention_with_two_outputs(pm, backends):
    mod = module(attention, ((1, TOKENS, HIDDEN), F))
    graph = RelaxGraph.from_function(mod["main"])
    ops = graph.graph.ops
    assert {"relax.matmul", "relax.nn.layer_norm", "relax.nn.softmax", "relax.reshape", "relax.permute_dims"} <= set(ops)
    # Everything up to the softmax on ONNX Runtime; the layer norm's output also leaves the
    # partition (the residual add on TVM reads it), so the partition returns a tuple.
    on_onnxruntime = set(range(ops.index("relax.nn.softmax") + 1))
    _, placed = place(mod, "onnxruntime", on_onnxruntime)
    (name,) = partitions_by_backend(placed)["onnxruntime"]
    assert isinstance(tvm_compat.return_type(placed[name]), relax.TupleType)
    executable = build(pm, placed, backends, TARGET)
    x = RNG.uniform(-1, 1, size=(1, TOKENS, HIDDEN)).astype(F)
    np.testing.assert_allclose(run_vm(executable, x), numpy_attention(x), rtol=RTOL, atol=ATOL)


def test_collage_lower_partitions_replaces_the_body_by_one_packed_call(backends):
    _, placed = place(module(conv_bias_relu_scale, ((1, 3, 8, 8), F)), "onnxruntime", {0, 1, 2})
    (name,) = partitions_by_backend(placed)["onnxruntime"]
    lowered = hooks.collage_lower_partitions(backends["onnxruntime"], placed, [name], TARGET)
    assert hooks.collage_lower_partitions(backends["tvm"], placed, [name], TARGET) is None
    assert lowered is not placed and "R.nn.conv2d" in placed[name].script()
    bindings = lowered[name].body.blocks[0].bindings
    assert len(bindings) == 1 and bindings[0].value.op.name == "relax.call_dps_packed"
    assert str(bindings[0].value.args[0].global_symbol) == runtime.RUN_FUNCTION
    assert dict(lowered[name].attrs)["collage.backend"] == "onnxruntime"
    blob = tvm_compat.constant_array(bindings[0].value.args[1].fields[0])
    model = relax_to_onnx.convert(placed[name], name)
    assert runtime.unpack_model(blob) == model.SerializeToString()


@pytest.mark.slow
def test_exported_library_runs_in_a_fresh_process(pm, backends, tmp_path):
    check_exported_library_runs_in_a_fresh_process(pm, backends, "onnxruntime", TARGET, tmp_path)


def test_runtime_keeps_one_session_per_model_and_registers_idempotently(pm, backends):
    _, placed = place(module(conv_bias_relu_scale, ((1, 3, 8, 8), F)), "onnxruntime", {0, 1, 2})
    executable = build(pm, placed, backends, TARGET)
    runtime.SESSIONS.clear()
    x = RNG.uniform(-1, 1, size=(1, 3, 8, 8)).astype(F)
    first = run_vm(executable, x)
    runtime.register()
    second = run_vm(executable, x)
    assert len(runtime.SESSIONS) == 1
    np.testing.assert_array_equal(first, second)
    assert tvm.get_global_func(runtime.RUN_FUNCTION) is not None
    assert collage_onnxruntime.runtime is runtime


def test_runtime_refuses_a_blob_that_does_not_match_its_digest():
    blob = runtime.pack_model(b"not really a model").copy()
    blob[-1] ^= 1
    with pytest.raises(ValueError, match="digest"):
        runtime.SESSIONS.get(blob)


def test_session_options_do_not_spin_unless_asked():
    options = runtime.session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert options.inter_op_num_threads == 1
    assert options.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    spinning = runtime.session_options(spinning=True)
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def lowered_blob(lowered, name):
    call = lowered[name].body.blocks[0].bindings[0].value
    return tvm_compat.constant_array(call.args[1].fields[0])


@pytest.mark.parametrize("ort_nodes, spins", [({0, 1, 2, 3}, True), ({0, 1, 2}, False)])
def test_idle_threads_spin_only_when_onnx_runtime_runs_the_whole_executable(backends, ort_nodes, spins):
    """Alone, nothing else needs the cores between runs; beside TVM's kernels, spinning threads
    would take the cores from them. Either way the session computes the same."""
    _, placed = place(module(conv_bias_relu_scale, ((1, 3, 8, 8), F)), "onnxruntime", ort_nodes)
    (name,) = partitions_by_backend(placed)["onnxruntime"]
    assert engine_lowering.runs_alone(placed, [name]) == spins
    lowered = hooks.collage_lower_partitions(backends["onnxruntime"], placed, [name], TARGET)
    serialized, spinning = runtime.unpack_blob(lowered_blob(lowered, name))
    assert spinning == spins and serialized == relax_to_onnx.convert(placed[name], name).SerializeToString()
    runtime.SESSIONS.clear()
    session = runtime.SESSIONS.get(lowered_blob(lowered, name)).session
    assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == str(int(spins))


def test_runtime_reads_and_writes_the_tensors_in_place():
    model = relax_to_onnx.convert(module(lambda bb, x: R.nn.relu(x), ((2, 3), F))["main"])
    check_runs_in_place(
        runtime.run, tvm_compat.to_tensor(runtime.pack_model(model.SerializeToString()), DEVICE), runtime.BINDINGS_PER_THREAD
    )
