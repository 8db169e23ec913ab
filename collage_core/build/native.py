"""Building a plugin's C++ kernels into a shared library once per machine, and loading it.

Backends whose partitions call native kernels (DNNL, cuBLAS, cuDNN) compile their source on
first use into ``$COLLAGE_CACHE_DIR/<name>/<digest>/lib<name>.so`` (default cache
``~/.cache/collage``). The digest covers the source, the compiler and its flags, and the
versions the plugin names (its library's, TVM FFI's), so a changed input builds a new library
and never reuses a stale one. One process builds; others wait on a lock and reuse the result.
Loading the library runs its ``TVM_FFI_STATIC_INIT_BLOCK``, which registers its functions.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import attrs
import numpy as np

CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC")
# The kernel cache DNNL's, cuBLAS's and cuDNN's kernels share (``#include "collage_kernel_cache.h"``).
KERNEL_CACHE_HEADER = Path(__file__).parent.parent / "kit" / "include" / "collage_kernel_cache.h"
_ABSOLUTE_PATH = re.compile(r"/(?:[^/\s,=]+/)*([^/\s,=]+)")


def spec_text(words: Sequence[int]) -> str:
    """A kernel spec's int64 words as a native runtime takes them: a host string (hex of the little-endian words)."""
    return np.asarray(words, dtype="<i8").tobytes().hex()


def float_word(value: float) -> int:
    """A float64 as the int64 word with the same bits (how specs carry floats)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def sources_digest(paths: Iterable[str | os.PathLike]) -> str:
    """A short digest of the bytes of ``paths`` (a plugin's kernels and the Python that reads and
    lowers its groups): part of the backend's version, so costs measured with other code are never reused."""
    return hashlib.sha256(b"".join(Path(path).read_bytes() for path in paths)).hexdigest()[:12]


class NativeBuildError(RuntimeError):
    """A compiler is missing or the source did not compile; the message says which and why."""


def cache_root() -> Path:
    """Where native libraries and other built things are cached: ``$COLLAGE_CACHE_DIR``, else ``~/.cache/collage``."""
    return Path(os.environ.get("COLLAGE_CACHE_DIR") or Path.home() / ".cache" / "collage")


def find_compiler(install_hint: str) -> str:
    """The C++ compiler (``$CXX``, else ``g++``), or :class:`NativeBuildError` saying how to get one."""
    wanted = os.environ.get("CXX", "g++")
    compiler = shutil.which(wanted)
    if compiler is None:
        raise NativeBuildError(f"no C++ compiler ({wanted}) to build the kernels: {install_hint}")
    return compiler


def tvm_ffi_flags() -> tuple[tuple[str, ...], str]:
    """Compiler flags to build against TVM FFI, and its version (part of every digest)."""
    # Deferred: TVM's FFI loads TVM's libraries: only when a native library is built or loaded.
    import tvm_ffi
    from tvm_ffi import libinfo

    include, library_dir = Path(libinfo.find_include_path()), Path(libinfo.find_libtvm_ffi()).parent
    return (f"-I{include}", f"-L{library_dir}", "-ltvm_ffi", f"-Wl,-rpath,{library_dir}"), tvm_ffi.__version__


@attrs.frozen
class NativeLibrary:
    """One plugin's kernel library: what to compile, with what, and what else decides the result.

    ``flags`` are include, library and link flags after the source; ``versions`` are strings
    that change the binary without changing the command (library versions), all in the digest.
    ``base_flags`` come first (a C++ compiler's by default; nvcc's for CUDA sources, whose linker
    flags then go through ``-Xlinker``). A ``name`` with slashes nests the library's directory.
    ``headers`` are headers the source includes from outside its system's paths (the kit's
    ``KERNEL_CACHE_HEADER``): their folders go on the include path and their text into the digest.
    """

    name: str
    source: Path
    compiler: str
    flags: tuple[str, ...]
    versions: tuple[str, ...] = ()
    base_flags: tuple[str, ...] = CXXFLAGS
    headers: tuple[Path, ...] = ()

    def command(self, output: Path) -> list[str]:
        ffi_flags, _ = tvm_ffi_flags()
        if Path(self.compiler).name == "nvcc":
            ffi_flags = tuple(f"-Xlinker={flag[len('-Wl,') :]}" if flag.startswith("-Wl,") else flag for flag in ffi_flags)
        includes = [f"-I{folder}" for folder in dict.fromkeys(Path(header).parent for header in self.headers)]
        return [self.compiler, *self.base_flags, str(self.source), *includes, *self.flags, *ffi_flags, "-o", str(output)]

    def path(self) -> Path:
        """Where the library for this exact source, command and versions lives (built or not).

        Where the compiler, the headers and the libraries are installed is not part of the digest
        (their versions are): a cache built on one machine serves another with the same versions.
        """
        _, ffi_version = tvm_ffi_flags()
        digest = hashlib.sha256(self.source.read_bytes())
        for header in self.headers:
            digest.update(Path(header).read_bytes())
        for part in (*map(_without_directories, self.command(Path("out"))), *self.versions, ffi_version):
            digest.update(part.encode() + b"\0")
        return cache_root() / self.name / digest.hexdigest()[:16] / f"libcollage_{self.name.replace('/', '_')}.so"

    def build(self) -> Path:
        """The built library, compiling it unless this exact build exists (one process builds, others wait)."""
        path = self.path()
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                return path
            with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
                partial = Path(scratch) / path.name
                result = subprocess.run(self.command(partial), capture_output=True, text=True)
                if result.returncode != 0:
                    lines = result.stderr.splitlines()
                    first_error = [line for line in lines if "error" in line][:1] or lines[-1:]
                    raise NativeBuildError(f"building {self.source.name} failed: {' '.join(first_error)}")
                os.replace(partial, path)
        return path

    def load(self) -> Path:
        """Build (if needed) and load the library into this process, registering its functions."""
        path = self.build()
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        return path


def _without_directories(part: str) -> str:
    """A command-line word with each absolute path cut to its last component (``-I/x/include`` -> ``-Iinclude``)."""
    return _ABSOLUTE_PATH.sub(r"\1", part)
