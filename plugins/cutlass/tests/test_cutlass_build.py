"""The kernels' C++: generated from a kind and a configuration, compiled by nvcc against the nvidia-cutlass headers.

Compiling a CUTLASS 3 kernel takes one to two minutes of a core, so the compile test is marked ``slow``;
it needs no GPU (the library is built for sm_90a and loaded, which registers its functions).
"""

from __future__ import annotations

import pytest
import tvm

from collage_core.native import NativeBuildError
from collage_cutlass import kernels, library
from collage_cutlass.kernels import TILE_CONFIGS, Kernel, KernelKind

KIND = KernelKind("bfloat16", "bfloat16", a_k_major=True, b_k_major=False, bias=True, residual=False, activation="gelu_erf")


def test_each_kind_and_configuration_is_its_own_kernel_and_source():
    names = {Kernel(KIND, config).name for config in TILE_CONFIGS}
    assert len(names) == len(TILE_CONFIGS)
    other = Kernel(KernelKind("float16", "float16", True, False, True, False, "gelu_erf"), TILE_CONFIGS[0])
    assert other.name not in names
    source = Kernel(KIND, TILE_CONFIGS[0]).source()
    assert "LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, cutlass::bfloat16_t" in source
    assert "cutlass::layout::RowMajor, 16 / sizeof(Element)" in source and "KernelTmaWarpSpecializedCooperative" in source


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
