"""Backends whose CUDA kernels fault, for testing that measuring on a GPU survives them; never installed.

Each backend takes any single operator on CUDA and lowers like TVM, and its candidates are
measured as any other's; but before a ``conv2d`` candidate is timed, its backend runs a real
CUDA kernel that goes wrong:

- ``gpu_faulting`` writes 4 TiB past its buffer: an illegal memory access, which leaves the
  process's CUDA context unusable for every later call;
- ``gpu_hanging`` spins forever, so the measurement never returns;
- ``gpu_oom`` allocates 4 TiB of device memory, more than any GPU has.

The kernels are TIR compiled by TVM for the candidate's target.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.script import tirx as T

from collage_core import hookimpl, tvm_compat
from plugins_for_tests.any_operator import any_operator_backends

FAULTING = "gpu_faulting"
HANGING = "gpu_hanging"
OUT_OF_MEMORY = "gpu_oom"
BACKENDS = (FAULTING, HANGING, OUT_OF_MEMORY)
FAR = 1 << 40


@T.prim_func
def write_far(a: T.Buffer((T.int64(2),), "float32")):
    T.func_attr({"global_symbol": "write_far", "tirx.noalias": True})
    for i in T.thread_binding(T.int64(1), thread="threadIdx.x"):
        a[i + T.int64(FAR)] = T.float32(1)


@T.prim_func
def spin(a: T.Buffer((T.int64(2),), "float32")):
    T.func_attr({"global_symbol": "spin", "tirx.noalias": True})
    for i in T.thread_binding(T.int64(1), thread="threadIdx.x"):
        while a[i] > T.float32(-1):
            a[i + T.int64(1)] = a[i + T.int64(1)] + T.float32(1)


def _run_kernel(prim_func, target) -> None:
    """Compile ``prim_func`` for ``target``, run it on a zeroed two-element buffer and wait for it."""
    device = tvm_compat.device_for(target)
    kernel = tvm.compile(tvm.IRModule({prim_func.attrs["global_symbol"]: prim_func}), target=target)
    kernel[prim_func.attrs["global_symbol"]](tvm_compat.to_tensor(np.zeros(2, "float32"), device))
    device.sync()


def _allocate_beyond_the_gpu(target) -> None:
    tvm.runtime.empty((FAR,), "float32", tvm_compat.device_for(target))


collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    BACKENDS, ("cuda",), "test backend whose CUDA kernels fault ({name})"
)


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    """Go wrong before a ``conv2d`` is timed; leave the timing itself to the core."""
    if backend.name in BACKENDS and "conv2d" in mod["main"].script():
        if backend.name == FAULTING:
            _run_kernel(write_far, target)
        elif backend.name == HANGING:
            _run_kernel(spin, target)
        else:
            _allocate_beyond_the_gpu(target)
    return None
