"""A backend whose failing candidates leave their process unusable, as a faulting GPU kernel leaves its
CUDA context; for tests only. Backend ``poisoning`` takes any single operator; measuring a
``conv2d`` raises and poisons the process, after which every measurement in it raises too."""

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Cost, Pattern, hookimpl
from collage_core.records import OP_LEVEL

BACKEND = "poisoning"
_poisoned = []


@hookimpl
def collage_register_backends(register):
    register(Backend(BACKEND, OP_LEVEL, ("cpu",), "1", "faults that poison the process, for tests only"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name == BACKEND else None


@hookimpl
def collage_contribute_patterns(backend, target):
    return [Pattern(f"{BACKEND}.op", wildcard())] if backend.name == BACKEND else None


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return mod if backend.name == BACKEND else None


@hookimpl
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name != BACKEND:
        return None
    if _poisoned:
        raise RuntimeError("an earlier fault left this process unusable")
    if "conv2d" in mod["main"].script():
        _poisoned.append(True)
        raise RuntimeError("illegal memory access (a deliberate fault)")
    return Cost.measured(1.0e-3, 0.0, 3)
