"""Backends whose measured costs are noisy, for tests only: ``noisyonce`` answers each candidate's
first measurement with a spread of half its median and the second with a steady one;
``alwaysnoisy`` is noisy every time. Partitions are left to TVM's own lowering."""

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends

BACKENDS = ("noisyonce", "alwaysnoisy")
NOISY = Cost.measured(1.0e-3, 0.5e-3, 15)
STEADY = Cost.measured(0.9e-3, 0.01e-3, 5)
_asked: dict = {}


collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    BACKENDS, ("cpu",), "noisy costs, for tests only"
)


@hookimpl
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name not in BACKENDS:
        return None
    key = (backend.name, mod["main"].script())
    _asked[key] = _asked.get(key, 0) + 1
    return STEADY if backend.name == "noisyonce" and _asked[key] > 1 else NOISY
