"""A backend for testing runs that measure at the same time; never installed.

Backend ``together`` takes any single operator and measures every candidate at ``FIXED_COST``, but
not before each of the runs named in ``$RENDEZVOUS_RUNS`` (comma-separated) has begun measuring:
each run says so with a file named ``$RENDEZVOUS_RUN`` in the folder ``$RENDEZVOUS_DIR``. So two
runs sharing a cost database are measuring at once, however the machine schedules them.
Partitions are left to TVM's own lowering.
"""

import os
import time
from pathlib import Path

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends

BACKEND = "together"
FIXED_COST = Cost.measured(0.5e-3, 0.0, 3)
# Past this, a run measures without waiting for the others (one that never came).
WAIT_LIMIT_S = 120.0


collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    (BACKEND,), ("cpu",), "measures with the other runs, for tests only"
)


@hookimpl
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name != BACKEND:
        return None
    folder = Path(os.environ["RENDEZVOUS_DIR"])
    (folder / os.environ["RENDEZVOUS_RUN"]).touch()
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not all((folder / run).exists() for run in os.environ["RENDEZVOUS_RUNS"].split(",")):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return FIXED_COST
