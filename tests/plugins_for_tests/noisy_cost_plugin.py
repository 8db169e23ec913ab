"""Backends whose measured costs are noisy, for tests only: ``noisyonce`` answers each candidate's
first measurement with a spread of half its median and the second with a steady one;
``alwaysnoisy`` is noisy every time. Partitions are left to TVM's own lowering."""

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Cost, Pattern, hookimpl
from collage_core.records import OP_LEVEL

BACKENDS = ("noisyonce", "alwaysnoisy")
NOISY = Cost.measured(1.0e-3, 0.5e-3, 15)
STEADY = Cost.measured(0.9e-3, 0.01e-3, 5)
_asked: dict = {}


@hookimpl
def collage_register_backends(register):
    for name in BACKENDS:
        register(Backend(name, OP_LEVEL, ("cpu",), "1", "noisy costs, for tests only"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name in BACKENDS else None


@hookimpl
def collage_contribute_patterns(backend, target):
    return [Pattern(f"{backend.name}.op", wildcard())] if backend.name in BACKENDS else None


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return mod if backend.name in BACKENDS else None


@hookimpl
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name not in BACKENDS:
        return None
    key = (backend.name, mod["main"].script())
    _asked[key] = _asked.get(key, 0) + 1
    return STEADY if backend.name == "noisyonce" and _asked[key] > 1 else NOISY
