"""Building the plugin's cuDNN kernels against the installed NVIDIA libraries once, and loading them.

``runtime/collage_cudnn.cc`` uses cuDNN's graph API through NVIDIA's header-only C++ frontend
(``nvidia-cudnn-frontend``). It is compiled on first use (see :mod:`collage_core.kit` (its native build))
against cuDNN, NVRTC (which the frontend's runtime-compiled engines use) and the CUDA runtime
from NVIDIA's wheels or a CUDA toolkit; their paths and versions are part of the build digest.
Loading it registers ``collage_cudnn.run`` and ``collage_cudnn.tune`` with TVM FFI.
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

SOURCE = Path(__file__).parent / "runtime" / "collage_cudnn.cc"
INSTALL_HINT = "pip install nvidia-cudnn-cu13 nvidia-cudnn-frontend nvidia-cuda-nvrtc nvidia-cuda-runtime, and g++"
REQUIREMENTS = (
    Requirement("cudnn.h", "cudnn", "pip install nvidia-cudnn-cu13"),
    Requirement("cudnn_frontend.h", None, "pip install nvidia-cudnn-frontend"),
    Requirement("nvrtc.h", "nvrtc", "pip install nvidia-cuda-nvrtc"),
    Requirement(
        "cuda_runtime.h", "cudart", "install the CUDA toolkit's headers (apt-get install cuda-cudart-dev-13-0)", ("crt/host_defines.h",)
    ),
)


class CudnnUnavailable(RuntimeError):
    """No GPU, cuDNN, its frontend, NVRTC, the CUDA runtime or a compiler; the message says which and how to get it."""


def cudnn_version() -> str:
    """cuDNN's and its frontend's versions as installed (wheels), else the shared object's file name."""
    backend = cuda_libraries.installed_version(("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"), "cudnn") or "not installed"
    frontend = cuda_libraries.installed_version(("nvidia-cudnn-frontend",)) or "unknown"
    return f"{backend}+frontend-{frontend}"


def cache_dir() -> Path:
    return cache_root() / "cudnn"


def native_library() -> NativeLibrary:
    try:
        flags, libraries = cuda_libraries.compile_flags(REQUIREMENTS)
        compiler = find_compiler(INSTALL_HINT)
    except (CudaUnavailable, NativeBuildError) as missing:
        raise CudnnUnavailable(str(missing)) from None
    return NativeLibrary("cudnn", SOURCE, compiler, flags, versions=(cudnn_version(), *libraries), headers=(KERNEL_CACHE_HEADER,))


@functools.lru_cache(maxsize=None)
def load() -> Path:
    """Check for a GPU, build (if needed; about a minute: the frontend is large) and load the kernels."""
    try:
        cuda_libraries.first_gpu()
    except CudaUnavailable as missing:
        raise CudnnUnavailable(str(missing)) from None
    try:
        return native_library().load()
    except NativeBuildError as failed:
        raise CudnnUnavailable(f"{failed} (cuDNN {cudnn_version()})") from None
