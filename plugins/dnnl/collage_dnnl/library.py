"""Finding oneDNN, building the plugin's kernel library against it once, and loading it.

The kernels (``runtime/collage_dnnl.cc``) are C++ against oneDNN's API. They are compiled on
first use into ``$COLLAGE_CACHE_DIR/dnnl/<digest>/libcollage_dnnl.so`` (default cache
``~/.cache/collage``), where the digest covers the source, the compiler flags and the versions
of oneDNN and TVM FFI, so a changed input builds a new library and never reuses a stale one.
Loading the library registers ``collage_dnnl.run`` and ``collage_dnnl.pack_weights`` with TVM FFI.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from pathlib import Path
from typing import Optional

import attrs

from collage_core.kit import KERNEL_CACHE_HEADER, NativeBuildError, NativeLibrary, cache_root, find_compiler

SOURCE = Path(__file__).parent / "runtime" / "collage_dnnl.cc"
INSTALL_HINT = "apt-get install libdnnl-dev g++"
SUPPORTED_MAJOR = 2  # the kernels use oneDNN 2.x's operation-descriptor API (Debian's libdnnl-dev 2.6)
HEADER = Path("oneapi") / "dnnl" / "dnnl.hpp"


class OneDNNUnavailable(RuntimeError):
    """oneDNN, a C++ compiler or the built library is missing; the message says how to fix it."""


@attrs.frozen
class OneDNN:
    include_dir: Path
    library_dir: Path
    version: str
    threading: str


def _roots() -> list[Path]:
    roots = [Path(os.environ["COLLAGE_DNNL_ROOT"])] if os.environ.get("COLLAGE_DNNL_ROOT") else []
    return roots + [Path("/usr"), Path("/usr/local"), Path(sys.prefix)]


def _library_dirs(root: Path) -> list[Path]:
    return [root / "lib" / "x86_64-linux-gnu", root / "lib64", root / "lib"]


def _header_define(text: str, name: str) -> Optional[str]:
    found = re.search(rf"#define\s+{name}\s+(\S+)", text)
    return found.group(1) if found else None


def find_onednn() -> OneDNN:
    """The first oneDNN 2.x with headers and a shared library, or :class:`OneDNNUnavailable`."""
    problems = []
    for root in _roots():
        include_dir = root / "include"
        if not (include_dir / HEADER).is_file():
            continue
        version_header = (include_dir / "oneapi" / "dnnl" / "dnnl_version.h").read_text()
        config_header = (include_dir / "oneapi" / "dnnl" / "dnnl_config.h").read_text()
        major, minor, patch = (_header_define(version_header, f"DNNL_VERSION_{part}") for part in ("MAJOR", "MINOR", "PATCH"))
        version = f"{major}.{minor}.{patch}"
        if major != str(SUPPORTED_MAJOR):
            problems.append(f"oneDNN {version} at {include_dir} (this plugin needs {SUPPORTED_MAJOR}.x)")
            continue
        if _header_define(config_header, "DNNL_CPU_RUNTIME") == "DNNL_RUNTIME_SYCL":
            problems.append(f"oneDNN {version} at {include_dir} runs the CPU through SYCL (this plugin needs OpenMP or TBB)")
            continue
        library_dir = next((d for d in _library_dirs(root) if (d / "libdnnl.so").exists()), None)
        if library_dir is None:
            problems.append(f"oneDNN headers at {include_dir} but no libdnnl.so beside them")
            continue
        threading = (_header_define(config_header, "DNNL_CPU_THREADING_RUNTIME") or "unknown").replace("DNNL_RUNTIME_", "")
        return OneDNN(include_dir, library_dir, version, threading)
    found = f" (found {'; '.join(problems)})" if problems else ""
    raise OneDNNUnavailable(f"oneDNN {SUPPORTED_MAJOR}.x headers and library not found{found}: {INSTALL_HINT}")


def native_library(onednn: OneDNN) -> NativeLibrary:
    """The kernel library's build against ``onednn`` (where it is cached, how it is compiled)."""
    try:
        compiler = find_compiler(INSTALL_HINT)
    except NativeBuildError as missing:
        raise OneDNNUnavailable(str(missing)) from None
    flags = (f"-I{onednn.include_dir}", f"-L{onednn.library_dir}", "-ldnnl", f"-Wl,-rpath,{onednn.library_dir}")
    return NativeLibrary("dnnl", SOURCE, compiler, flags, versions=(onednn.version,), headers=(KERNEL_CACHE_HEADER,))


def cache_dir() -> Path:
    return cache_root() / "dnnl"


def library_path(onednn: OneDNN) -> Path:
    """Where the library for this source, oneDNN and TVM FFI lives (built or not)."""
    return native_library(onednn).path()


def build(onednn: OneDNN) -> Path:
    """The built kernel library, compiling it unless this exact build exists (one process builds, others wait)."""
    try:
        return native_library(onednn).build()
    except NativeBuildError as failed:
        raise OneDNNUnavailable(f"{failed} (oneDNN {onednn.version})") from None


@functools.lru_cache(maxsize=None)
def load() -> Path:
    """Build (if needed) and load the kernel library into this process; its path."""
    path = build(find_onednn())
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    return path
