"""The kernels' C++: generated from a kind and a configuration, compiled by nvcc against the nvidia-cutlass headers.

Compiling a CUTLASS 3 kernel takes one to two minutes of a core, so the compile test is marked ``slow``;
it needs no GPU (the library is built for sm_90a and loaded, which registers its functions).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from collage_cutlass import kernels, library
from collage_cutlass.conv_kernels import CONV_TILE_CONFIGS, ConvKind
from collage_cutlass.kernels import TILE_CONFIGS, Kernel, KernelKind

from collage_core.kit import NativeBuildError

KIND = KernelKind("bfloat16", "bfloat16", a_k_major=True, b_k_major=False, bias=True, residual=False, activation="gelu_erf")


def test_each_kind_and_configuration_is_its_own_kernel_and_source():
    names = {Kernel(KIND, config).name for config in TILE_CONFIGS}
    assert len(names) == len(TILE_CONFIGS)
    other = Kernel(KernelKind("float16", "float16", True, False, True, False, "gelu_erf"), TILE_CONFIGS[0])
    assert other.name not in names
    source = Kernel(KIND, TILE_CONFIGS[0]).source()
    assert "LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, cutlass::bfloat16_t" in source
    assert "cutlass::layout::RowMajor, 16 / sizeof(Element)" in source and "KernelTmaWarpSpecializedCooperative" in source


def test_a_tf32_kernel_takes_float_operands_with_a_k_tile_of_the_same_bytes():
    """CUTLASS's builder maps float operands to TF32 WGMMA; 4-byte elements halve the K tile (same shared memory per stage)."""
    tf32 = Kernel(KernelKind("float32", "float32", True, False, True, False, "gelu_erf"), TILE_CONFIGS[0]).source()
    sixteen = Kernel(KIND, TILE_CONFIGS[0]).source()
    assert "using Element = float;" in tf32 and "Shape<_128, _128, _32>" in tf32
    assert "Shape<_128, _128, _64>" in sixteen and "using Element = cutlass::bfloat16_t;" in sixteen


def test_a_convolution_kernel_is_an_implicit_gemm_over_nhwc_with_the_gemm_kernels_epilogue():
    kind = ConvKind("float16", "float16", bias=True, residual=True, activation="relu")
    names = {kind.kernel(config).name for config in CONV_TILE_CONFIGS}
    assert len(names) == len(CONV_TILE_CONFIGS) and all(name.startswith("conv2d_") for name in names)
    source = kind.kernel(CONV_TILE_CONFIGS[0]).source()
    assert "cutlass::conv::Operator::kFprop" in source and "KernelImplicitTmaWarpSpecializedSm90" in source
    assert "LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, cutlass::half_t" in source
    assert source.count("cutlass::layout::TensorNHWC") == 4 and '#include "conv_runner.h"' in source
    assert kind.words() == (2, 2, 1, 1, kernels.ACTIVATION_CODES["relu"])
    assert "Shape<_128, _128, Shape<_32>>" in ConvKind("float32", "float32", False, False, None).kernel(CONV_TILE_CONFIGS[0]).source()
    # Their builds are keyed by the shared runtime header and their own; the GEMM kernels' by the shared one and
    # theirs (a convolution runner's change leaves the GEMM kernels' cache valid).
    assert library.runner_headers(kind.kernel(CONV_TILE_CONFIGS[0])) == [library.COMMON_HEADER, library.CONV_RUNNER_HEADER]
    assert library.runner_headers(Kernel(KIND, TILE_CONFIGS[0])) == [library.COMMON_HEADER, library.RUNNER_HEADER]


def test_the_kind_words_are_what_the_runtime_checks():
    assert KIND.words() == (1, 1, 0, 1, 1, 0, kernels.ACTIVATION_CODES["gelu_erf"])


def _toolchain():
    try:
        library.cutlass_includes()
        library.find_nvcc()
    except library.CutlassUnavailable as missing:
        pytest.skip(str(missing))


@pytest.mark.slow
def test_a_kernel_compiles_with_nvcc_loads_and_registers_its_call_and_timing_functions(tmp_path, monkeypatch):
    _toolchain()
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    kernel = Kernel(KIND, TILE_CONFIGS[0])
    built = library.build_all([kernel], progress=False)
    assert not isinstance(built[kernel], NativeBuildError), built[kernel]
    assert library.native_library(kernel).path().exists()
    library.load(kernel)
    assert tvm.get_global_func(f"collage_cutlass.{kernel.name}", allow_missing=True) is not None
    assert tvm.get_global_func(f"collage_cutlass.time.{kernel.name}", allow_missing=True) is not None
    assert library.build_all([kernel], progress=False)[kernel] == built[kernel]  # a second time compiles nothing


def _spec():
    from collage_cutlass import specs

    from collage_core.kit import Group
    from collage_core.kit.testing import function_module, product_case

    make, shapes = product_case("dense_bias", cast_to="float16")
    return specs.recognize(Group.from_function(function_module(make, *shapes, dtype="float16")["main"]))


def test_tuning_keeps_the_fastest_configuration_that_runs_and_times_a_problem_once(tmp_path, monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", lambda: tuning.cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000))
    timed = []

    def fake_times(spec, candidates, key=""):  # what the GPU would say: the third fastest, the first cannot run it
        timed.append(len(candidates))
        speeds = {0: "CUTLASS cannot run this problem with it", 2: 0.001}
        return {
            kernel.config.name: speeds.get(TILE_CONFIGS.index(kernel.config), 0.01 * TILE_CONFIGS.index(kernel.config))
            for kernel in candidates
        }

    monkeypatch.setattr(tuning, "time_kernels", fake_times)
    spec = _spec()
    assert tuning.best_kernel(spec).config == TILE_CONFIGS[2]
    assert tuning.best_kernel(spec).config == TILE_CONFIGS[2] and timed == [len(TILE_CONFIGS)]  # remembered
    [entry] = tuning.tuned()
    assert entry["kind"] == spec.kind.describe() and entry["problem"][:3] == list(spec.words[8:11])
    assert isinstance(entry["seconds"], float) and entry["seconds"] >= 0  # what tuning this problem took
    monkeypatch.setenv("COLLAGE_CUTLASS_TILES", "2")  # fewer configurations tried: another question, timed anew
    assert tuning.best_kernel(spec).config == TILE_CONFIGS[1] and timed == [len(TILE_CONFIGS), 2]


def test_a_problem_no_configuration_runs_fails_with_each_configurations_reason(tmp_path, monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", lambda: tuning.cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000))
    monkeypatch.setattr(tuning, "time_kernels", lambda spec, kernels, key="": {k.config.name: "did not compile: x" for k in kernels})
    with pytest.raises(ValueError, match=r"no CUTLASS configuration runs this float16->float16 .* did not compile"):
        tuning.best_kernel(_spec())


def test_a_configuration_that_hangs_fails_the_candidate_once_and_is_never_timed_again(tmp_path, monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", lambda: tuning.cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000))
    monkeypatch.setattr(tuning.library, "build_all", lambda kernels, progress=True: {k: tmp_path / k.name for k in kernels})
    monkeypatch.setattr(tuning.library, "load", lambda kernel: None)
    hangs, ran = TILE_CONFIGS[1], []

    def timing_function(name):  # what the runtime answers: the second configuration never finishes
        def time(text):
            config = next(c for c in TILE_CONFIGS if f"collage_cutlass.time.{Kernel(spec.kind, c).name}" == name)
            ran.append(config)
            return tuning.HUNG if config == hangs else 0.01 + 0.001 * TILE_CONFIGS.index(config)

        return time

    monkeypatch.setattr(tuning.tvm, "get_global_func", timing_function)
    spec = _spec()
    with pytest.raises(tuning.KernelHung, match=rf"{hangs.name} .* still running after 10 s .* not be tried again"):
        tuning.best_kernel(spec)
    assert ran == list(TILE_CONFIGS[:2]) and tuning.tuned() == []  # nothing chosen from an unfinished tuning
    ran.clear()
    assert tuning.best_kernel(spec).config == TILE_CONFIGS[0]  # the next worker tunes without it
    assert hangs not in ran and len(ran) == len(TILE_CONFIGS) - 1
    [entry] = tuning.tuned()
    assert entry["times_ms"][hangs.name] == tuning.HUNG_BEFORE


def test_without_a_gpu_the_first_configuration_is_taken_untimed(monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", lambda: (_ for _ in ()).throw(tuning.CudaUnavailable("no NVIDIA GPU here")))
    monkeypatch.setattr(tuning, "time_kernels", lambda *a: pytest.fail("timed without a GPU"))
    assert tuning.best_kernel(_spec()).config == TILE_CONFIGS[0]


def test_a_bad_tile_count_is_refused_with_what_to_give(monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setenv("COLLAGE_CUTLASS_TILES", "many")
    with pytest.raises(ValueError, match="how many configurations"):
        tuning.configs()


def _conv_spec():
    from collage_cutlass import specs
    from tvm import relax

    from collage_core.kit import Group
    from collage_core.kit.testing import function_module

    filters = relax.const(np.ones((16, 8, 3, 3), "float16"))
    make = lambda bb, x: relax.op.astype(bb.emit(relax.op.nn.conv2d(x, filters, padding=[1, 1, 1, 1], out_dtype="float32")), "float16")  # noqa: E731
    return specs.recognize(Group.from_function(function_module(make, (1, 8, 6, 6), dtype="float16")["main"]))


def test_a_convolution_is_tuned_over_the_convolution_configurations_and_its_choice_is_remembered(tmp_path, monkeypatch):
    from collage_cutlass import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", lambda: tuning.cuda_libraries.Gpu(0, "NVIDIA H200", "9.0", 13000))
    monkeypatch.setattr(
        tuning,
        "time_kernels",
        lambda spec, candidates, key="": {
            kernel.config.name: 0.01 + 0.001 * abs(CONV_TILE_CONFIGS.index(kernel.config) - 3) for kernel in candidates
        },
    )
    spec = _conv_spec()
    chosen = tuning.best_kernel(spec)
    assert chosen.config == CONV_TILE_CONFIGS[3] and chosen.name.startswith("conv2d_")
    [entry] = tuning.tuned()
    assert entry["problem"] == [1, 6, 6, 8, 16, 3, 3] and entry["kind"].startswith("conv2d float16")
    library.record_chosen(chosen)
    library.record_chosen(Kernel(KIND, TILE_CONFIGS[1]))
    assert set(library.chosen_kernels()) == {chosen, Kernel(KIND, TILE_CONFIGS[1])}  # each read back as its own kind


@pytest.mark.slow
def test_a_convolution_kernel_compiles_with_nvcc_and_registers_its_functions(tmp_path, monkeypatch):
    _toolchain()
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    kernel = ConvKind("float16", "float16", bias=True, residual=True, activation="relu").kernel(CONV_TILE_CONFIGS[1])
    built = library.build_all([kernel], progress=False)
    assert not isinstance(built[kernel], NativeBuildError), built[kernel]
    library.load(kernel)
    assert tvm.get_global_func(f"collage_cutlass.{kernel.name}", allow_missing=True) is not None
    assert tvm.get_global_func(f"collage_cutlass.time.{kernel.name}", allow_missing=True) is not None
