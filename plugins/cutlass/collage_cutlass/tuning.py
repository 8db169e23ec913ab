"""Choosing, for each problem, the fastest of several CUTLASS kernel configurations by timing them on the GPU.

For a spec, every configuration in :data:`~collage_cutlass.kernels.TILE_CONFIGS` (or the first
``$COLLAGE_CUTLASS_TILES`` of them, which bounds compile time) is compiled in parallel, then each is
timed on the GPU on scratch buffers; the fastest runs the problem. The choice and every
configuration's time are kept by spec, GPU and compiler (``$COLLAGE_CACHE_DIR/cutlass/tuning.json``),
so a later build on this machine compiles and times nothing. Without a GPU nothing can be timed: the
first configuration is taken. A configuration whose kernel does not finish when timed is remembered as
hung on this GPU and never timed again; the process it hung in is lost (the kernel holds the GPU), so
the candidate being measured fails with :class:`KernelHung` and the next one is measured in a fresh
worker, which tunes without that configuration.
"""

from __future__ import annotations

import hashlib
import os
import time

import tvm

from collage_core.kit import ChoiceStore, CudaUnavailable, cuda_libraries
from collage_cutlass import library, specs
from collage_cutlass.conv_kernels import CONV_TILE_CONFIGS
from collage_cutlass.kernels import TILE_CONFIGS, TileConfig

CONFIGS_BY_NAME = {config.name: config for config in (*TILE_CONFIGS, *CONV_TILE_CONFIGS)}
# What the runtime's timing function answers besides milliseconds (runtime/gemm_runner.h).
CANNOT_RUN, HUNG = -1.0, -2.0
HANG_SECONDS = 10  # kHangSeconds there
HUNG_BEFORE = "hung on this GPU when timed before: not tried again"


class KernelHung(RuntimeError):
    """A CUTLASS kernel did not finish when timed; the GPU of this process is taken by it."""


def configs(kind=None) -> tuple[TileConfig, ...]:
    """The configurations tuning tries for ``kind`` (GEMMs' when none is given): all, or the first ``$COLLAGE_CUTLASS_TILES``."""
    every = kind.configs if kind is not None else TILE_CONFIGS
    wanted = os.environ.get("COLLAGE_CUTLASS_TILES", "").strip()
    if not wanted:
        return every
    if not wanted.isdigit() or int(wanted) < 1:
        raise ValueError(f"COLLAGE_CUTLASS_TILES={wanted!r}: give how many configurations to try (1 to {len(every)})")
    return every[: int(wanted)]


def _store() -> ChoiceStore:
    return ChoiceStore(library.cache_dir() / "tuning.json",
                       lambda value: isinstance(value, dict) and value.get("config") in CONFIGS_BY_NAME)


def _key(spec, gpu) -> str:
    tried = ",".join(config.name for config in configs(spec.kind))
    identity = f"{gpu.name}|{gpu.compute_capability}|{library.cutlass_version()}|{library.nvcc_version()}|{tried}"
    return hashlib.sha256(spec.array().astype("<i8").tobytes() + identity.encode()).hexdigest()


def _hung_key(key: str, config: TileConfig) -> str:
    return f"hung:{key}:{config.name}"


def time_kernels(spec, kernels, key: str = "") -> dict[str, object]:
    """Each kernel's median milliseconds on ``spec`` (compiling those not built yet), or why it has none.
    A kernel remembered as hung under ``key`` is not run; one that hangs now is remembered and raises
    :class:`KernelHung`."""
    store = _store()
    hung_before = {kernel for kernel in kernels if key and store.get(_hung_key(key, kernel.config))}
    built = library.build_all([kernel for kernel in kernels if kernel not in hung_before])
    text = specs.as_text(spec.array())
    times: dict[str, object] = {}
    with library.machine_lock("timing"):
        for kernel in kernels:
            if kernel in hung_before:
                times[kernel.config.name] = HUNG_BEFORE
                continue
            if isinstance(built[kernel], Exception):
                times[kernel.config.name] = f"did not compile: {built[kernel]}"
                continue
            library.load(kernel)
            milliseconds = float(tvm.get_global_func(f"collage_cutlass.time.{kernel.name}")(text))
            if milliseconds == HUNG:
                if key:
                    store.put(_hung_key(key, kernel.config), {"config": kernel.config.name, "kind": spec.kind.describe()})
                raise KernelHung(f"CUTLASS kernel {kernel.config.name} for a {spec.describe_problem()} "
                                 f"was still running after {HANG_SECONDS} s on the GPU; it will not be tried again on this GPU")
            times[kernel.config.name] = milliseconds if milliseconds > 0 else "CUTLASS cannot run this problem with it"
    return times


def tuned() -> list[dict]:
    """Every problem tuned on this machine: its kind, its sizes (``[M, N, K, batch, outer batch]`` for a product,
    ``[N, H, W, C, K, R, S]`` for a convolution), the chosen
    configuration, each configuration's milliseconds or why it has none, and the seconds tuning took
    (compiling what was not built yet, loading and timing)."""
    return [value for value in _store().values() if "problem" in value]


def best_kernel(spec):
    """The kernel that runs ``spec`` fastest on this GPU (tuned once, then remembered), or the first
    configuration's where there is no GPU. Raises ValueError when no configuration runs it."""
    try:
        gpu = cuda_libraries.first_gpu()
    except CudaUnavailable:
        return spec.kind.kernel(configs(spec.kind)[0])
    store, key = _store(), _key(spec, gpu)
    found = store.get(key)
    if found is None:
        started = time.perf_counter()
        times = time_kernels(spec, [spec.kind.kernel(config) for config in configs(spec.kind)], key)
        seconds = time.perf_counter() - started
        usable = {name: value for name, value in times.items() if isinstance(value, float)}
        if not usable:
            reasons = "; ".join(f"{name}: {why}" for name, why in times.items())
            raise ValueError(f"no CUTLASS configuration runs this {spec.describe_problem()}: {reasons}")
        found = {"config": min(usable, key=usable.get), "times_ms": times, "kind": spec.kind.describe(),
                 "problem": spec.problem(), "seconds": round(seconds, 3)}
        store.put(key, found)
    return spec.kind.kernel(CONFIGS_BY_NAME[found["config"]])
