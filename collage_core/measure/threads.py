"""How many threads each backend's own pool may use, decided in one place.

Backends with thread pools of their own (ONNX Runtime, OpenVINO, PyTorch for TorchInductor) take
:func:`backend_threads`: one per core this process may run on (its CPU affinity), or
``$COLLAGE_NUM_THREADS`` when set (never more than those cores). Their partitions run one after
another with TVM's kernels in between, so each pool may use every core while it runs. TVM's own
pool follows ``TVM_NUM_THREADS``; set both to pin a run to fewer cores.
"""

from __future__ import annotations

import os

from collage_core.errors import CollageError

ENVIRONMENT_VARIABLE = "COLLAGE_NUM_THREADS"


def backend_threads() -> int:
    """Threads for a backend's pool: the cores this process may use, or fewer if the user says so."""
    cores = len(os.sched_getaffinity(0))
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return cores
    try:
        wanted = int(value)
    except ValueError:
        wanted = 0
    if wanted < 1:
        raise CollageError(f"{ENVIRONMENT_VARIABLE}={value!r} is not a positive whole number of threads")
    return min(wanted, cores)
