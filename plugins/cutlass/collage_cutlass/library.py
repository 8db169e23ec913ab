"""Compiling CUTLASS kernels with nvcc once per machine, in parallel, and loading them.

Each :class:`~collage_cutlass.kernels.Kernel`'s source is written to
``$COLLAGE_CACHE_DIR/cutlass/sources/<name>.cu`` and compiled by :mod:`collage_core.kit` (its native build) into
``$COLLAGE_CACHE_DIR/cutlass/<name>/<digest>/``; the digest covers the generated source, nvcc's
command line, nvcc's and CUTLASS's versions, the runtime header and TVM FFI's version, so a second
run compiles nothing and a changed input never reuses a stale build. The GPU's architecture is part
of the command (``-arch=sm_90a``): these kernels target Hopper. CUTLASS's headers come from NVIDIA's
``nvidia-cutlass`` wheel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import attrs

from collage_core.kit import (
    ChoiceStore,
    CudaUnavailable,
    NativeBuildError,
    NativeLibrary,
    ProgressBar,
    cache_root,
    cuda_libraries,
    sources_digest,
)
from collage_cutlass.conv_kernels import ConvKind
from collage_cutlass.kernels import Kernel, KernelKind, TileConfig

KINDS = {"gemm": KernelKind, "conv2d": ConvKind}  # each kind class by its `op`

RUNTIME_DIR = Path(__file__).parent / "runtime"
COMMON_HEADER = RUNTIME_DIR / "runner_common.h"  # what both runners share; each includes it
RUNNER_HEADER = RUNTIME_DIR / "gemm_runner.h"
CONV_RUNNER_HEADER = RUNTIME_DIR / "conv_runner.h"
INSTALL_HINT = "pip install nvidia-cutlass, and the CUDA toolkit's nvcc (apt-get install cuda-nvcc-13-0)"
ARCH = "sm_90a"  # Hopper with its arch-specific features (WGMMA, TMA multicast)
HOPPER = "9.0"
NVCC_FLAGS = ("-std=c++17", "-O3", f"-arch={ARCH}", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC", "-shared", "-DNDEBUG")
COMPILE_MEMORY_BYTES = 3 << 30  # what one nvcc of a CUTLASS 3 kernel may take


class CutlassUnavailable(RuntimeError):
    """No nvcc, no CUTLASS headers, or a GPU these kernels do not target; the message says which and how to fix it."""


def cutlass_version() -> str:
    return cuda_libraries.installed_version(("nvidia-cutlass",)) or "not installed"


def cutlass_includes() -> tuple[Path, Path]:
    """CUTLASS's and its utilities' include directories, from the nvidia-cutlass wheel."""
    try:
        import cutlass_library
    except ImportError:
        raise CutlassUnavailable(f"CUTLASS's headers are not installed: {INSTALL_HINT}") from None
    source = Path(cutlass_library.__file__).parent / "source"
    include, util = source / "include", source / "tools" / "util" / "include"
    if not (include / "cutlass" / "cutlass.h").is_file():
        raise CutlassUnavailable(f"the nvidia-cutlass wheel carries no headers at {include}: {INSTALL_HINT}")
    return include, util


@functools.lru_cache(maxsize=None)
def find_nvcc() -> str:
    """nvcc: ``$CUDA_HOME/bin/nvcc``, else on the path, else /usr/local/cuda's."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if os.environ.get("CUDA_HOME") else []
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    raise CutlassUnavailable(f"no nvcc to compile CUTLASS kernels: {INSTALL_HINT}")


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    result = subprocess.run([find_nvcc(), "--version"], capture_output=True, text=True)
    found = re.search(r"release [\d.]+, V([\d.]+)", result.stdout)
    return found.group(1) if found else result.stdout.strip().splitlines()[-1:][0] if result.stdout.strip() else "unknown"


def check_gpu() -> None:
    """Raise :class:`CutlassUnavailable` unless GPU 0 is a Hopper (the kernels use its WGMMA and TMA)."""
    try:
        gpu = cuda_libraries.first_gpu()
    except CudaUnavailable as missing:
        raise CutlassUnavailable(str(missing)) from None
    if gpu.compute_capability != HOPPER:
        raise CutlassUnavailable(
            f"{gpu.name} (compute capability {gpu.compute_capability}): the CUTLASS kernels here target Hopper (sm_90)"
        )


def cache_dir() -> Path:
    return cache_root() / "cutlass"


def runner_headers(kernel) -> list[Path]:
    """The runtime headers a kernel's source includes (their digest is part of its build's key)."""
    return [COMMON_HEADER, RUNNER_HEADER if kernel.runner == RUNNER_HEADER.name else CONV_RUNNER_HEADER]


def native_library(kernel) -> NativeLibrary:
    """The kernel's library: its source written out (once) and the nvcc build that compiles it."""
    include, util = cutlass_includes()
    source = cache_dir() / "sources" / f"{kernel.name}.cu"
    text = kernel.source()
    if not source.is_file() or source.read_text() != text:
        source.parent.mkdir(parents=True, exist_ok=True)
        partial = source.with_name(f"{source.name}.{os.getpid()}.partial")
        partial.write_text(text)
        os.replace(partial, source)
    return NativeLibrary(
        f"cutlass/{kernel.name}",
        source,
        find_nvcc(),
        (f"-I{RUNTIME_DIR}", f"-I{include}", f"-I{util}"),
        versions=(cutlass_version(), nvcc_version(), sources_digest(runner_headers(kernel))),
        base_flags=NVCC_FLAGS,
    )


def compile_jobs(count: int) -> int:
    """How many nvcc processes to run at once: one per core, as memory allows."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = COMPILE_MEMORY_BYTES
    return max(1, min(count, os.cpu_count() or 1, memory // COMPILE_MEMORY_BYTES))


@contextlib.contextmanager
def machine_lock(name: str):
    """Held by one process of this machine at a time (Collage builds candidates in several): compiling
    takes every core and gigabytes per nvcc, and timing wants the GPU to itself."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_all(kernels, progress: bool = True) -> dict[Kernel, object]:
    """Compile every kernel not built yet, in parallel, showing progress; each kernel's library path, or
    the :class:`NativeBuildError` that says why it did not compile."""
    libraries = {kernel: native_library(kernel) for kernel in kernels}
    results: dict[Kernel, object] = {kernel: library.path() for kernel, library in libraries.items() if library.path().exists()}
    if len(results) == len(libraries):
        return results
    with machine_lock("compiling"):
        missing = [kernel for kernel, library in libraries.items() if not library.path().exists()]
        results.update({kernel: libraries[kernel].path() for kernel in libraries if kernel not in missing})
        with (
            ProgressBar(len(missing), "compiling CUTLASS kernels", enabled=progress) as bar,
            concurrent.futures.ThreadPoolExecutor(compile_jobs(len(missing)) if missing else 1) as pool,
        ):
            futures = {pool.submit(_timed_build, libraries[kernel]): kernel for kernel in missing}
            for future in concurrent.futures.as_completed(futures):
                kernel = futures[future]
                try:
                    results[kernel], seconds = future.result()
                    ChoiceStore(cache_dir() / "compile_seconds.json").put(kernel.name, round(seconds, 1))
                except NativeBuildError as failed:
                    results[kernel] = failed
                bar.advance(f"{kernel.config.name} ({kernel.kind.describe()})")
    return results


def _timed_build(library: NativeLibrary) -> tuple[Path, float]:
    started = time.monotonic()
    return library.build(), time.monotonic() - started


def compile_seconds() -> dict[str, float]:
    """How long each kernel compiled on this machine, by name (``compile_seconds.json``)."""
    try:
        data = json.loads((cache_dir() / "compile_seconds.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def load(kernel: Kernel) -> Path:
    """Build (if needed) and load ``kernel``, registering ``collage_cutlass.<name>`` and its timing function."""
    try:
        return native_library(kernel).load()
    except NativeBuildError as failed:
        raise CutlassUnavailable(f"{failed} (CUTLASS {cutlass_version()}, nvcc {nvcc_version()})") from None


# The kernels lowering chose on this machine, by name: what an exported library may call. Loading
# them all registers every function any placement built here calls (a superset of one library's).
def _chosen_file() -> Path:
    return cache_dir() / "chosen.json"


def record_chosen(kernel) -> None:
    ChoiceStore(_chosen_file()).put(
        kernel.name, {"op": kernel.kind.op, "kind": attrs.asdict(kernel.kind), "config": attrs.asdict(kernel.config)}
    )


def chosen_kernels() -> list:
    """Every kernel lowering chose on this machine (from ``chosen.json``; a damaged file reads as none)."""
    try:
        data = json.loads(_chosen_file().read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return []
    found = []
    for entry in data.values() if isinstance(data, dict) else ():
        try:
            kind = KINDS[entry.get("op", "gemm")](**entry["kind"])
            config = entry["config"]
            config = TileConfig(config["schedule"], tuple(config["tile"]), tuple(config["cluster"]), config["scheduler"])
        except (KeyError, TypeError):
            continue
        found.append(kind.kernel(config))
    return found
