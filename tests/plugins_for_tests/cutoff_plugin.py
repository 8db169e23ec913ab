"""Backends for tests only whose measurements record the cut-off they were given (a line per measurement
in the file ``$CUTOFF_LOG`` names): ``afast`` (measured first, its name sorting first) costs 1 ms,
``zslow`` 1 s, stopping after one run when that exceeds the cut-off, as the core's timing does.
Partitions are left to TVM's own lowering."""

import json
import os

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends

BACKENDS = ("afast", "zslow")
FAST_S, SLOW_S = 1e-3, 1.0

collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    BACKENDS, ("cpu",), "costs that record their cut-off, for tests only"
)


@hookimpl
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name not in BACKENDS:
        return None
    with open(os.environ["CUTOFF_LOG"], "a") as log:
        log.write(json.dumps([backend.name, settings.cutoff_s]) + "\n")
    if backend.name == "afast":
        return Cost.measured(FAST_S, 0.0, 5)
    if settings.cutoff_s is not None and SLOW_S > settings.cutoff_s:
        return Cost.measured(SLOW_S, 0.0, 1)
    return Cost.measured(SLOW_S, 0.0, 5)
