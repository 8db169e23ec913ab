"""The backend's hooks, and partitions lowered to TorchInductor inside a mixed TVM executable.

Placements are built the way Collage builds them (``partition_module`` then ``build``), run on
Relax's VM and compared with numpy, as ``collage_core.kit.testing.placement_cases`` says.
"""

from __future__ import annotations

import functools
import importlib.util
import io

import collage_inductor
import numpy as np
import pytest
import torch
import tvm
from collage_inductor import hooks, relax_to_torch, runtime
from tvm import relax

from collage_core.kit import GRAPH_LEVEL, RelaxGraph, cuda_libraries, engine_lowering, engine_operators, enumerate_candidates, tvm_compat
from collage_core.kit.testing import contribute_patterns, partitions_by_backend
from collage_core.kit.testing.placement_cases import (
    ATOL,
    CONV_INPUT,
    DEVICE,
    RNG,
    RTOL,
    F,
    R,
    check_exported_library_runs_in_a_fresh_process,
    check_mixed_placements,
    check_runs_in_place,
    conv_bias_relu_scale,
    module,
    numpy_conv_bias_relu_scale,
    place,
)

TARGET = tvm_compat.host_cpu_target()
CUDA = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"})


def test_collage_register_backends_registers_a_graph_level_backend_for_the_cpu_and_cuda(backends):
    backend = backends["inductor"]
    assert backend.kind == GRAPH_LEVEL and backend.device_kinds == ("cpu", "cuda")
    assert backend.version == f"torch-{torch.__version__}+lowering-{hooks.LOWERING_REVISION}"
    assert not backend.lowering_uses_device and backend.chosen_by_default == ("cuda",)
    assert "CPU only" not in backend.description and "Triton kernels on CUDA" in backend.description


def test_collage_check_availability_says_what_is_missing(backends, monkeypatch):
    assert hooks.collage_check_availability(backends["inductor"]).available
    assert hooks.collage_check_availability(backends["tvm"]) is None
    monkeypatch.setenv("CXX", "no-such-compiler")
    availability = hooks.collage_check_availability(backends["inductor"])
    assert not availability.available
    assert availability.reason == ("TorchInductor needs a C++ compiler and no-such-compiler is not on the PATH: apt-get install g++")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as if torch were not installed
    availability = hooks.collage_check_availability(backends["inductor"])
    assert availability.reason == "torch is not installed: pip install torch==2.13.0"


def as_if_there_were_a_gpu(monkeypatch):
    monkeypatch.setattr(cuda_libraries, "first_gpu", lambda: cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000, "580"))


def test_on_a_machine_with_a_gpu_inductor_needs_torch_built_with_cuda(backends, monkeypatch):
    as_if_there_were_a_gpu(monkeypatch)
    monkeypatch.setattr(hooks, "_torch_has_cuda", lambda: False)
    availability = hooks.collage_check_availability(backends["inductor"])
    assert availability.reason == (
        f"this machine has an NVIDIA GPU but torch {torch.__version__} is built without "
        "CUDA: pip install torch --index-url https://download.pytorch.org/whl/cu130"
    )


def test_on_a_machine_with_a_gpu_inductor_needs_triton(backends, monkeypatch):
    as_if_there_were_a_gpu(monkeypatch)
    monkeypatch.setattr(hooks, "_torch_has_cuda", lambda: True)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "triton" else find_spec(name))
    availability = hooks.collage_check_availability(backends["inductor"])
    assert availability.reason == ("TorchInductor's CUDA kernels are Triton's and triton is not installed: pip install triton")
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert hooks.collage_check_availability(backends["inductor"]).available == (find_spec("triton") is not None)


def test_a_cpu_build_of_torch_is_told_apart_from_a_cuda_build():
    assert hooks._torch_has_cuda() == (torch.version.cuda is not None)


def test_inductor_is_chosen_by_default_on_cuda_and_only_when_named_on_the_cpu(pm):
    from collage_core.kit.testing import discover_backends, select_backends

    infos = discover_backends(pm)
    assert "inductor" not in [info.name for info in select_backends(infos, target=TARGET)]
    assert "inductor" not in [info.name for info in select_backends(infos)]
    assert "inductor" in [info.name for info in select_backends(infos, target=CUDA)]
    assert [info.name for info in select_backends(infos, ["inductor", "tvm"])] == ["inductor", "tvm"]


def test_collage_contribute_patterns_one_checked_pattern_per_convertible_operator(pm, backends):
    patterns = contribute_patterns(pm, backends["inductor"], TARGET)
    assert [p.name for p in patterns] == [f"inductor.{op.rsplit('.', 1)[1]}" for op in engine_operators.SUPPORTED_OPS]
    assert [p.name for p in contribute_patterns(pm, backends["inductor"], CUDA)] == [p.name for p in patterns]
    assert hooks.collage_contribute_patterns(backends["inductor"], tvm.target.Target({"kind": "vulkan"}), "fp32") == []

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
    key, program_constant, operand = binding.value.args[1].fields
    blob = tvm_compat.constant_array(program_constant)
    assert key.value == runtime.key_of(blob) and operand.same_as(lowered[name].params[0])
    program = torch.export.load(io.BytesIO(engine_lowering.unpack_blob(blob)[0]))
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    (result,) = program.module()(torch.from_numpy(x))
    np.testing.assert_allclose(result.numpy() * 0.5, numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # 21 s on 2 cores: Inductor compiles two regions; test_inductor_models and test_inductor_packages run its regions by default
def test_mixed_placements_beside_tvm_match_numpy(pm, backends):
    check_mixed_placements(pm, backends, "inductor", TARGET)


@pytest.mark.slow  # 12 s: a fresh process compiles the region again; the mixed-placement test above runs it in this one
def test_exported_library_runs_in_a_fresh_process(pm, backends, tmp_path):
    check_exported_library_runs_in_a_fresh_process(pm, backends, "inductor", TARGET, tmp_path)


def relu_blob():
    """The key and the program of a lowered ReLU of a (2, 3) float32 tensor, the program as the VM passes it."""
    buffer = io.BytesIO()
    torch.export.save(relax_to_torch.exported(module(lambda bb, x: R.nn.relu(x), ((2, 3), F))["main"]), buffer)
    blob = engine_lowering.pack_blob(buffer.getvalue())
    return runtime.key_of(blob), tvm_compat.to_tensor(blob, DEVICE)


def test_runtime_compiles_once_and_registers_idempotently():
    runtime.PROGRAMS.clear()
    key, blob = relu_blob()
    x, out = (tvm_compat.to_tensor(np.full((2, 3), value, F), DEVICE) for value in (-1.0, 7.0))
    runtime.run(key, blob, x, out)
    runtime.register()
    tvm.get_global_func(runtime.RUN_FUNCTION)(key, blob, x, out)
    assert len(runtime.PROGRAMS) == 1 and collage_inductor.runtime is runtime
    assert torch.get_num_threads() == runtime.threads()


def test_runtime_reads_and_writes_the_tensors_in_place():
    key, blob = relu_blob()
    check_runs_in_place(functools.partial(runtime.run, key), blob, runtime.VIEWS_PER_THREAD)


def test_runtime_refuses_a_blob_that_does_not_match_its_digest_or_its_key():
    blob = engine_lowering.pack_blob(b"not really a model").copy()
    key = runtime.key_of(blob)
    blob[-1] ^= 1
    with pytest.raises(ValueError, match="collage_inductor: the model blob does not match its digest"):
        runtime.PROGRAMS.load(key, tvm_compat.to_tensor(blob, DEVICE), (runtime.CPU, 0))
    _, relu = relu_blob()
    with pytest.raises(ValueError, match=f"collage_inductor: the program does not match its key {key}"):
        runtime.PROGRAMS.load(key, relu, (runtime.CPU, 0))


def test_a_program_met_first_inside_a_cuda_graph_capture_is_refused_before_anything_is_read():
    class Unreadable:
        def numpy(self):
            raise AssertionError("the program was read inside a capture")

    with pytest.raises(runtime.CaptureError, match="met for the first time inside a CUDA graph capture"):
        runtime._program("0" * 64, Unreadable(), (runtime.CUDA, 0), capturing=True)
