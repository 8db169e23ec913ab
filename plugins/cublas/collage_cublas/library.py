"""Building the plugin's cuBLASLt kernels against the installed NVIDIA libraries once, and loading them.

``runtime/collage_cublas.cc`` is compiled on first use (see :mod:`collage_core.kit` (its native build)) against
the headers and shared objects of cuBLASLt and the CUDA runtime that NVIDIA's wheels or a CUDA
toolkit installed; the paths of those libraries are part of the build digest. Loading it
registers ``collage_cublas.run`` and ``collage_cublas.tune`` with TVM FFI.
"""

from __future__ import annotations

import functools
from pathlib import Path

from collage_core.kit import (
    KERNEL_CACHE_HEADER,
    CudaUnavailable,
    NativeBuildError,
    NativeLibrary,
    Requirement,
    cache_root,
    cuda_libraries,
    find_compiler,
)

SOURCE = Path(__file__).parent / "runtime" / "collage_cublas.cc"
INSTALL_HINT = "pip install nvidia-cublas nvidia-cuda-runtime (what PyTorch's CUDA wheels bring), and g++"
REQUIREMENTS = (
    Requirement("cublasLt.h", "cublasLt", "pip install nvidia-cublas"),
    Requirement(
        "cuda_runtime.h", "cudart", "install the CUDA toolkit's headers (apt-get install cuda-cudart-dev-13-0)", ("crt/host_defines.h",)
    ),
)


class CublasUnavailable(RuntimeError):
    """No GPU, cuBLASLt, the CUDA runtime or a compiler; the message says which and how to get it."""


def cublas_version() -> str:
    """The installed cuBLAS wheel's version, else the shared object's file name."""
    return cuda_libraries.installed_version(("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"), "cublasLt") or "not installed"


def cache_dir() -> Path:
    return cache_root() / "cublas"


def native_library() -> NativeLibrary:
    try:
        flags, libraries = cuda_libraries.compile_flags(REQUIREMENTS)
        compiler = find_compiler(INSTALL_HINT)
    except (CudaUnavailable, NativeBuildError) as missing:
        raise CublasUnavailable(str(missing)) from None
    return NativeLibrary("cublas", SOURCE, compiler, flags, versions=(cublas_version(), *libraries), headers=(KERNEL_CACHE_HEADER,))


@functools.lru_cache(maxsize=None)
def load() -> Path:
    """Check for a GPU, build (if needed) and load the kernels into this process; the library's path."""
    try:
        cuda_libraries.first_gpu()
    except CudaUnavailable as missing:
        raise CublasUnavailable(str(missing)) from None
    try:
        return native_library().load()
    except NativeBuildError as failed:
        raise CublasUnavailable(f"{failed} (cuBLAS {cublas_version()})") from None
