"""The cuBLAS, cuDNN and CUTLASS plugins on a machine as it is: registered, patterns only for CUDA targets, one-line reasons when they cannot run.

These run everywhere (CI has no GPU); what needs a GPU is in the plugins' tests marked ``gpu``.
"""

from __future__ import annotations

import importlib

import pytest

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build import cuda_libraries
from collage_core.build.cuda_libraries import CudaUnavailable, Requirement
from collage_core.plugins import get_plugin_manager

PLUGINS = ["cublas", "cudnn", "cutlass"]


@pytest.fixture(scope="module")
def backends():
    return {name: info for name, info in discover_backends(get_plugin_manager()).items()}


def _has_gpu() -> bool:
    try:
        cuda_libraries.first_gpu()
    except CudaUnavailable:
        return False
    return True


@pytest.mark.parametrize("name", PLUGINS)
def test_collage_register_backends_registers_an_op_level_cuda_backend_with_its_library_version(backends, name):
    backend = backends[name].backend
    library = importlib.import_module(f"collage_{name}.library")
    version = getattr(library, f"{name}_version")()
    assert backend.kind == "op-level" and backend.device_kinds == ("cuda",)
    assert backend.version.startswith(f"{name}-{version}+")
    assert "+kernels-" in backend.version
    assert f"plugins/{name}" in backend.runtime_needs


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU")
@pytest.mark.parametrize("name", PLUGINS)
def test_collage_check_availability_says_there_is_no_gpu_in_one_line(backends, name):
    availability = backends[name].availability
    assert not availability.available
    assert availability.reason.startswith("no NVIDIA GPU here") and "\n" not in availability.reason


@pytest.mark.parametrize("name", PLUGINS)
def test_collage_contribute_patterns_only_for_cuda_targets(name):
    hooks = importlib.import_module(f"collage_{name}.hooks")
    backend = discover_backends(get_plugin_manager())[name].backend
    cuda = tvm_compat.make_target({"kind": "cuda"})
    assert hooks.collage_contribute_patterns(backend=backend, target=tvm_compat.host_cpu_target(), precision="fp32") == []
    patterns = hooks.collage_contribute_patterns(backend=backend, target=cuda, precision="fp32")
    assert patterns and all(p.name.startswith(f"{name}.") and not p.name.endswith("_tf32") for p in patterns)
    at_tf32 = hooks.collage_contribute_patterns(backend=backend, target=cuda, precision="tf32")
    assert any(p.name.endswith("_tf32") for p in at_tf32)  # each GPU plugin has TF32 kernels


def test_a_missing_header_or_library_is_named_with_how_to_install_it(monkeypatch):
    monkeypatch.setattr(cuda_libraries, "find_header", lambda name, companions=(): None)
    with pytest.raises(CudaUnavailable, match=r"^cublasLt\.h not found: pip install nvidia-cublas$"):
        cuda_libraries.compile_flags([Requirement("cublasLt.h", "cublasLt", "pip install nvidia-cublas")])
    monkeypatch.setattr(cuda_libraries, "find_header", lambda name, companions=(): cuda_libraries.Path("/usr/include"))
    monkeypatch.setattr(cuda_libraries, "find_library", lambda stem: None)
    with pytest.raises(CudaUnavailable, match=r"^libcudnn\.so not found: pip install nvidia-cudnn-cu13$"):
        cuda_libraries.compile_flags([Requirement("cudnn.h", "cudnn", "pip install nvidia-cudnn-cu13")])


def test_a_header_directory_without_the_headers_it_includes_is_passed_over(tmp_path, monkeypatch):
    partial, full = tmp_path / "wheel", tmp_path / "toolkit"
    (partial / "include").mkdir(parents=True)
    (partial / "include" / "cuda_runtime.h").write_text("")
    (full / "include" / "crt").mkdir(parents=True)
    (full / "include" / "cuda_runtime.h").write_text("")
    (full / "include" / "crt" / "host_defines.h").write_text("")
    monkeypatch.setattr(cuda_libraries, "search_roots", lambda: [partial, full])
    assert cuda_libraries.find_header("cuda_runtime.h") == partial / "include"
    assert cuda_libraries.find_header("cuda_runtime.h", ["crt/host_defines.h"]) == full / "include"


def test_a_library_version_is_the_first_installed_wheel_else_the_shared_object_found(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudnn.so.9.19.0").write_text("")
    (tmp_path / "lib" / "libcudnn.so.9").symlink_to("libcudnn.so.9.19.0")
    monkeypatch.setattr(cuda_libraries, "search_roots", lambda: [tmp_path])
    assert cuda_libraries.installed_version(("no-such-wheel", "pytest"), "cudnn") == pytest.__version__
    assert cuda_libraries.installed_version(("no-such-wheel",), "cudnn") == "libcudnn.so.9.19.0"
    assert cuda_libraries.installed_version(("no-such-wheel",), "cublasLt") == ""
    assert cuda_libraries.installed_version(("no-such-wheel",)) == ""


@pytest.mark.parametrize("name", PLUGINS)
def test_collage_prepare_runtime_raises_saying_what_is_missing_without_a_gpu(name, monkeypatch):
    hooks = importlib.import_module(f"collage_{name}.hooks")
    library = importlib.import_module(f"collage_{name}.library")
    clear = getattr(library.load, "cache_clear", lambda: None)  # cuBLAS and cuDNN load one library, once
    clear()
    monkeypatch.setattr(cuda_libraries, "first_gpu", lambda: (_ for _ in ()).throw(CudaUnavailable("no NVIDIA GPU here: test")))
    try:
        backend = discover_backends(get_plugin_manager())[name].backend
        with pytest.raises(RuntimeError, match="no NVIDIA GPU here: test"):
            hooks.collage_prepare_runtime(backend=backend)
    finally:
        clear()


@pytest.mark.parametrize("name", PLUGINS)
def test_collage_lower_partitions_says_which_partition_a_kernel_cannot_compute(name, monkeypatch):
    import numpy as np
    from tvm import relax

    from collage_core.candidates.fused_groups import as_dtype

    lowering = importlib.import_module(f"collage_{name}.lowering")
    monkeypatch.setattr(lowering.library, "load", lambda *kernel: None)
    dtype = "bfloat16" if name == "cutlass" else "float32"  # CUTLASS takes 16-bit operands only
    x = relax.Var("x", relax.TensorType((4, 8), dtype))
    bb = relax.BlockBuilder()
    with bb.function("part", [x]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(x, relax.const(as_dtype(np.ones((8, 8)), dtype)), out_dtype="float32"))
            output = bb.emit_output(relax.op.nn.softmax(product))
        bb.emit_func_output(output)
    with pytest.raises(ValueError, match=r"partition part: .*softmax"):
        lowering.lower_function(bb.get()["part"], "part")


def test_a_build_time_choice_is_timed_once_per_spec_gpu_and_library_version(tmp_path, monkeypatch):
    import numpy as np

    from collage_core.build.choices import ChoiceStore

    monkeypatch.setattr(cuda_libraries, "first_gpu", lambda: cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000))
    store, timed = ChoiceStore(tmp_path / "choices.json"), []

    def tune():
        timed.append(1)
        return np.array([7, len(timed)], dtype="<i8").tobytes()

    first = cuda_libraries.tuned_on_gpu(store, (1, 2, 3), "9.19", tune)
    assert first == (7, 1) and cuda_libraries.tuned_on_gpu(store, (1, 2, 3), "9.19", tune) == first and len(timed) == 1
    assert cuda_libraries.tuned_on_gpu(store, (1, 2, 3), "9.20", tune) == (7, 2)  # another library version: timed again
    assert cuda_libraries.tuned_on_gpu(store, (1, 2, 4), "9.19", tune) == (7, 3)  # another spec
    monkeypatch.setattr(cuda_libraries, "first_gpu", lambda: cuda_libraries.Gpu(0, "NVIDIA A100", "8.0", 13000))
    assert cuda_libraries.tuned_on_gpu(store, (1, 2, 3), "9.19", tune) == (7, 4)  # another GPU


def test_gpu_cost_keys_name_the_gpu_its_compute_capability_cuda_and_driver(monkeypatch):
    from collage_core.measure.measurement import cost_key
    from collage_core.records import Backend

    target = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90a"})
    backend = Backend("cublas", "op-level", ("cuda",), "1", "")
    keys = {}
    for name, driver in (("NVIDIA H200", "580.159.04"), ("NVIDIA H100 80GB HBM3", "580.159.04"), ("NVIDIA H200", "575.51.03")):
        gpu = cuda_libraries.Gpu(0, name, "9.0", 13000, driver)
        monkeypatch.setattr(cuda_libraries, "first_gpu", lambda gpu=gpu: gpu)
        keys[(name, driver)] = cost_key(backend, target, "cublas.dense:abc")
    assert len(set(keys.values())) == 3  # another GPU or another driver never reads these costs
    assert keys[("NVIDIA H200", "580.159.04")].device == "cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0, driver 580.159.04)"
