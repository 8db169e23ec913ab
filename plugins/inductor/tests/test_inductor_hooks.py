"""The backend's hooks, and partitions lowered to TorchInductor inside a mixed TVM executable.

Placements are built the way Collage builds them (``partition_module`` then ``build``), run on
Relax's VM and compared with numpy, as ``collage_core.relax_onnx.placement_cases`` says.
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import torch
import pytest
import tvm
from tvm import relax

import collage_inductor
from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.build import partitions_by_backend
from collage_core.candidates import enumerate_candidates
from collage_core.records import GRAPH_LEVEL
from collage_core.relax_graph import RelaxGraph
from collage_core.relax_onnx import lowering, support
from collage_core.relax_onnx.placement_cases import (
    ATOL, CONV_INPUT, DEVICE, RNG, RTOL, F, R, check_exported_library_runs_in_a_fresh_process, check_mixed_placements,
    check_runs_in_place, conv_bias_relu_scale, module, numpy_conv_bias_relu_scale, place,
)
from collage_inductor import hooks, relax_to_torch, runtime

TARGET = tvm_compat.host_cpu_target()


def test_collage_register_backends_registers_a_graph_level_cpu_backend(backends):
    backend = backends["inductor"]
    assert backend.kind == GRAPH_LEVEL and backend.device_kinds == ("cpu",)
    assert backend.version == f"torch-{torch.__version__}+lowering-{hooks.LOWERING_REVISION}"
    assert not backend.lowering_uses_device and not backend.chosen_by_default


def test_collage_check_availability_says_what_is_missing(backends, monkeypatch):
    assert hooks.collage_check_availability(backends["inductor"]).available
    assert hooks.collage_check_availability(backends["tvm"]) is None
    monkeypatch.setenv("CXX", "no-such-compiler")
    availability = hooks.collage_check_availability(backends["inductor"])
    assert not availability.available
    assert availability.reason == ("TorchInductor needs a C++ compiler and no-such-compiler is not on the PATH: "
                                   "apt-get install g++")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as if torch were not installed
    availability = hooks.collage_check_availability(backends["inductor"])
    assert availability.reason == "torch is not installed: pip install torch==2.13.0"


def test_inductor_is_placed_on_only_when_named(pm):
    from collage_core.backends import discover_backends, select_backends

    infos = discover_backends(pm)
    assert "inductor" not in [info.name for info in select_backends(infos)]
    assert [info.name for info in select_backends(infos, ["inductor", "tvm"])] == ["inductor", "tvm"]


def test_collage_contribute_patterns_one_checked_pattern_per_convertible_operator(pm, backends):
    patterns = contribute_patterns(pm, backends["inductor"], TARGET)
    assert [p.name for p in patterns] == [f"inductor.{op.rsplit('.', 1)[1]}" for op in support.SUPPORTED_OPS]
    assert hooks.collage_contribute_patterns(backends["inductor"], tvm.target.Target({"kind": "cuda"})) == []

    def make(bb, x):
        conv = bb.emit(R.nn.conv2d(x, relax.const(np.ones((8, 3, 3, 3), F))))
        return R.cumsum(R.nn.relu(conv), axis=1)

    graph = RelaxGraph.from_function(module(make, CONV_INPUT)["main"])
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backends["inductor"], TARGET))
    assert [(sorted(c.nodes), c.pattern) for c in candidates] == [([0], "inductor.conv2d"), ([1], "inductor.relu")]


def test_collage_lower_partitions_replaces_the_body_by_one_packed_call(backends):
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), "inductor", {0, 1, 2})
    (name,) = partitions_by_backend(placed)["inductor"]
    lowered = hooks.collage_lower_partitions(backends["inductor"], placed, [name], TARGET)
    assert hooks.collage_lower_partitions(backends["tvm"], placed, [name], TARGET) is None
    (binding,) = lowered[name].body.blocks[0].bindings
    assert str(binding.value.args[0].global_symbol) == runtime.RUN_FUNCTION
    blob = tvm_compat.constant_array(binding.value.args[1].fields[0])
    program = torch.export.load(io.BytesIO(lowering.unpack_blob(blob)[0]))
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    (result,) = program.module()(torch.from_numpy(x))
    np.testing.assert_allclose(result.numpy() * 0.5, numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


def test_mixed_placements_beside_tvm_match_numpy(pm, backends):
    check_mixed_placements(pm, backends, "inductor", TARGET)


@pytest.mark.slow  # 12 s: a fresh process compiles the region again; the mixed-placement test above runs it in this one
def test_exported_library_runs_in_a_fresh_process(pm, backends, tmp_path):
    check_exported_library_runs_in_a_fresh_process(pm, backends, "inductor", TARGET, tmp_path)


def relu_blob():
    buffer = io.BytesIO()
    torch.export.save(relax_to_torch.exported(module(lambda bb, x: R.nn.relu(x), ((2, 3), F))["main"]), buffer)
    return tvm_compat.to_tensor(lowering.pack_blob(buffer.getvalue()), DEVICE)


def test_runtime_compiles_once_and_registers_idempotently():
    runtime.PROGRAMS.clear()
    blob = relu_blob()
    x, out = (tvm_compat.to_tensor(np.full((2, 3), value, F), DEVICE) for value in (-1.0, 7.0))
    runtime.run(blob, x, out)
    runtime.register()
    tvm.get_global_func(runtime.RUN_FUNCTION)(blob, x, out)
    assert len(runtime.PROGRAMS) == 1 and collage_inductor.runtime is runtime
    assert torch.get_num_threads() == runtime.threads()


def test_runtime_reads_and_writes_the_tensors_in_place():
    check_runs_in_place(runtime.run, relu_blob(), runtime.VIEWS_PER_THREAD)


def test_runtime_refuses_a_blob_that_does_not_match_its_digest():
    blob = lowering.pack_blob(b"not really a model").copy()
    blob[-1] ^= 1
    with pytest.raises(ValueError, match="collage_inductor: the model blob does not match its digest"):
        runtime.PROGRAMS.get(blob)
