"""The backend's hooks, and partitions lowered to TorchInductor inside a mixed TVM executable.

Placements are built the way Collage builds them (``partition_module`` then ``build``), run on
Relax's VM and compared with numpy, as ``collage_core.relax_onnx.placement_cases`` says.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys

import numpy as np
import torch
import pytest
import tvm
from tvm import relax

import collage_inductor
from collage_core import tvm_compat
from collage_core.backends import contribute_patterns
from collage_core.build import build, partitions_by_backend
from collage_core.candidates import enumerate_candidates
from collage_core.records import GRAPH_LEVEL
from collage_core.relax_graph import RelaxGraph
from collage_core.relax_onnx import lowering, support
from collage_core.relax_onnx.placement_cases import (
    ATOL, DEVICE, HIDDEN, RNG, RTOL, TOKENS, F, R, attention, conv_bias_relu_scale, module, numpy_attention,
    numpy_conv_bias_relu_scale, place, run_vm,
)
from collage_inductor import hooks, relax_to_torch, runtime

TARGET = tvm_compat.host_cpu_target()
CONV_INPUT = ((1, 3, 8, 8), F)


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


def test_conv_bias_relu_on_inductor_beside_tvm(pm, backends):
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), "inductor", {0, 1, 2})
    assert {b: len(names) for b, names in partitions_by_backend(placed).items()} == {"inductor": 1, "tvm": 1}
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    np.testing.assert_allclose(run_vm(build(pm, placed, backends, TARGET), x), numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


def test_attention_with_two_outputs_on_inductor(pm, backends):
    mod = module(attention, ((1, TOKENS, HIDDEN), F))
    ops = RelaxGraph.from_function(mod["main"]).graph.ops
    _, placed = place(mod, "inductor", set(range(ops.index("relax.nn.softmax") + 1)))
    (name,) = partitions_by_backend(placed)["inductor"]
    assert isinstance(tvm_compat.return_type(placed[name]), relax.TupleType)
    x = RNG.uniform(-1, 1, size=(1, TOKENS, HIDDEN)).astype(F)
    np.testing.assert_allclose(run_vm(build(pm, placed, backends, TARGET), x), numpy_attention(x), rtol=RTOL, atol=ATOL)


def test_exported_library_runs_in_a_fresh_process(pm, backends, tmp_path):
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), "inductor", {0, 1, 2})
    library = tmp_path / "placed.so"
    build(pm, placed, backends, TARGET).export_library(str(library))
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, numpy as np, tvm\n"
        "from tvm import relax\n"
        "import collage_inductor\n"
        "vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())\n"
        "np.save(sys.argv[3], vm['main'](tvm.runtime.tensor(np.load(sys.argv[2]))).numpy())\n"
    )
    out = tmp_path / "out.npy"
    done = subprocess.run(
        [sys.executable, "-c", script, str(library), str(tmp_path / "x.npy"), str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(out), numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


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
    blob = relu_blob()
    x = tvm_compat.to_tensor(np.full((2, 3), -1.0, F), DEVICE)
    out = tvm_compat.to_tensor(np.full((2, 3), 7.0, F), DEVICE)
    runtime.run(blob, x, out)
    np.testing.assert_array_equal(tvm_compat.to_numpy(out), np.zeros((2, 3), F))
    # Same addresses, new contents: the cached views must see them, not a copy taken when bound.
    x.copyfrom(np.arange(6, dtype=F).reshape(2, 3))
    runtime.run(blob, x, out)
    np.testing.assert_array_equal(tvm_compat.to_numpy(out), np.arange(6, dtype=F).reshape(2, 3))
    # More address sets than views kept: each still computes its own tensors.
    pairs = [(tvm_compat.to_tensor(np.full((2, 3), float(v), F), DEVICE), tvm_compat.to_tensor(np.zeros((2, 3), F), DEVICE))
             for v in range(runtime.VIEWS_PER_THREAD + 2)]
    for _ in range(2):
        for value, (source, target) in enumerate(pairs):
            runtime.run(blob, source, target)
            np.testing.assert_array_equal(tvm_compat.to_numpy(target), np.full((2, 3), float(value), F))
    with pytest.raises(ValueError, match="the program takes 1 inputs and gives 1 outputs, but 1 tensors"):
        runtime.run(blob, x)


def test_runtime_refuses_a_blob_that_does_not_match_its_digest():
    blob = lowering.pack_blob(b"not really a model").copy()
    blob[-1] ^= 1
    with pytest.raises(ValueError, match="collage_inductor: the model blob does not match its digest"):
        runtime.PROGRAMS.get(blob)
