"""Finding an NVIDIA GPU and NVIDIA's libraries (headers and shared objects) for native GPU backends.

The libraries come from NVIDIA's pip wheels (``nvidia-cublas``, ``nvidia-cudnn-cu13``,
``nvidia-cudnn-frontend``: what PyTorch's CUDA builds install) or from a system CUDA toolkit;
wheels come first, so the kernels are built against the same libraries PyTorch loads.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional, Sequence

import attrs
import numpy as np


class CudaUnavailable(RuntimeError):
    """No usable GPU, or a library's headers or shared object are missing; the message says which."""


def _wheel_roots() -> list[Path]:
    roots = []
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if nvidia.is_dir():
            roots += sorted(p for p in nvidia.iterdir() if p.is_dir())
        if (Path(entry or ".") / "include").is_dir():
            roots.append(Path(entry or "."))
    return roots


def _system_roots() -> list[Path]:
    toolkits = [Path(os.environ["CUDA_HOME"])] if os.environ.get("CUDA_HOME") else []
    toolkits += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    roots = []
    for toolkit in toolkits:
        roots += [toolkit / "targets" / "x86_64-linux", toolkit]
    return roots + [Path("/usr")]


def search_roots() -> list[Path]:
    """Where headers (``<root>/include``) and libraries (``<root>/lib*``) are looked for, in order."""
    return _wheel_roots() + _system_roots()


def find_header(name: str, companions: Sequence[str] = ()) -> Optional[Path]:
    """The include directory holding ``name`` (``"cublasLt.h"``) and the ``companions`` it includes, or None.

    NVIDIA's wheels carry partial header sets (``nvidia/cu13/include`` has ``cuda_runtime.h``
    without the ``crt/`` headers it includes); companions make such a directory be passed over.
    """
    for root in search_roots():
        for include in (root / "include", root / "include" / "x86_64-linux-gnu"):
            if all((include / header).is_file() for header in (name, *companions)):
                return include
    return None


def find_library(stem: str) -> Optional[Path]:
    """The shared object ``lib<stem>.so`` or ``lib<stem>.so.<major>`` (wheels ship only the latter), or None."""
    for root in search_roots():
        for directory in (root / "lib", root / "lib64", root / "lib" / "x86_64-linux-gnu"):
            for candidate in [directory / f"lib{stem}.so", *sorted(directory.glob(f"lib{stem}.so.[0-9]*"))]:
                if candidate.is_file():
                    return candidate
    return None


def installed_version(distributions: Sequence[str], library_stem: Optional[str] = None) -> str:
    """The version of the first of ``distributions`` installed (NVIDIA's wheels), else the file name of
    the shared object ``library_stem`` where one is found (a CUDA toolkit's), else ""."""
    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    found = find_library(library_stem) if library_stem else None
    return found.resolve().name if found else ""


@attrs.frozen
class Requirement:
    """A library a kernel source needs: a header to compile against and a shared object to link (None: header-only)."""

    header: str
    library: Optional[str]
    install_hint: str
    companions: tuple[str, ...] = ()


def compile_flags(requirements: Sequence[Requirement]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Include and link flags for ``requirements``, and the shared objects' paths (for the build digest).

    Raises :class:`CudaUnavailable` naming the first missing header or library and how to install it.
    """
    includes, links, found = [], [], []
    for requirement in requirements:
        include = find_header(requirement.header, requirement.companions)
        if include is None:
            raise CudaUnavailable(f"{requirement.header} not found: {requirement.install_hint}")
        if f"-I{include}" not in includes:
            includes.append(f"-I{include}")
        if requirement.library is None:
            continue
        library = find_library(requirement.library)
        if library is None:
            raise CudaUnavailable(f"lib{requirement.library}.so not found: {requirement.install_hint}")
        links += [f"-L{library.parent}", f"-l:{library.name}", f"-Wl,-rpath,{library.parent}"]
        found.append(str(library.resolve()))
    return (*includes, *links), tuple(found)


@attrs.frozen
class Gpu:
    """GPU 0 as the driver describes it. ``driver_version`` is the CUDA version the driver supports
    (13000: CUDA 13.0); ``driver_release`` the driver's own release ("580.159.04"; "" where NVML is missing)."""

    index: int
    name: str
    compute_capability: str
    driver_version: int
    driver_release: str = ""

    def describe(self) -> str:
        """One line naming the GPU, its compute capability, CUDA and driver: part of every GPU cost key."""
        cuda = f"{self.driver_version // 1000}.{self.driver_version % 1000 // 10}"
        return f"{self.name}, compute capability {self.compute_capability}, CUDA {cuda}" + (
            f", driver {self.driver_release}" if self.driver_release else ""
        )


def gpu_description() -> str:
    """:meth:`Gpu.describe` of GPU 0, or "" when there is none."""
    try:
        return first_gpu().describe()
    except CudaUnavailable:
        return ""


def _driver_release() -> str:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return ""
        release = ctypes.create_string_buffer(96)
        found = nvml.nvmlSystemGetDriverVersion(release, 96) == 0
        nvml.nvmlShutdown()
        return release.value.decode() if found else ""
    except (OSError, AttributeError):
        return ""


@functools.lru_cache(maxsize=None)
def first_gpu() -> Gpu:
    """GPU 0 through the driver API, or :class:`CudaUnavailable` saying why there is none."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise CudaUnavailable("no NVIDIA GPU here: the NVIDIA driver (libcuda.so.1) is not installed") from None
    status = driver.cuInit(0)
    if status != 0:
        raise CudaUnavailable(f"no usable NVIDIA GPU here: cuInit failed with CUDA error {status}")
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        raise CudaUnavailable("no NVIDIA GPU here: the driver sees no CUDA device")
    device, name, major, minor, version = (ctypes.c_int(), ctypes.create_string_buffer(256), ctypes.c_int(), ctypes.c_int(), ctypes.c_int())
    driver.cuDeviceGet(ctypes.byref(device), 0)
    driver.cuDeviceGetName(name, 256, device)
    driver.cuDeviceGetAttribute(ctypes.byref(major), 75, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    driver.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    driver.cuDriverGetVersion(ctypes.byref(version))
    return Gpu(0, name.value.decode(), f"{major.value}.{minor.value}", version.value, _driver_release())


def tuned_on_gpu(store, spec_words, library_version: str, tune: Callable[[], bytes]) -> tuple[int, ...]:
    """What a kernel's build-time tuning chose for ``spec_words`` on this GPU, as int64 words.

    ``tune()`` runs the kernel's own timing and returns its choice as little-endian int64 bytes;
    the choice is kept in ``store`` (a :class:`~collage_core.build.choices.ChoiceStore`) by spec, GPU and
    library version, so later builds on this machine choose the same without timing. Without a
    GPU there is nothing to time: ``()``, and the runtime takes the library's heuristic choice.
    """
    try:
        gpu = first_gpu()
    except CudaUnavailable:
        return ()
    key = hashlib.sha256(
        np.asarray(spec_words, dtype="<i8").tobytes() + f"{gpu.name}|{gpu.compute_capability}|{library_version}".encode()
    ).hexdigest()
    chosen = store.get(key)
    if chosen is None:
        chosen = np.frombuffer(bytes(tune()), dtype="<i8").tolist()
        store.put(key, chosen)
    return tuple(chosen)
