"""A deterministic cost plugin for tests: backend ``fixedcost`` measures every candidate at ``FIXED_COST``.

Never installed as an entry point; tests load it by module name or through a fake entry point.
Its partitions are left to TVM's own lowering, so whatever it is placed on still builds.
"""

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Cost, Pattern, hookimpl
from collage_core.records import OP_LEVEL

BACKEND = "fixedcost"
FIXED_COST = Cost.measured(0.125, 0.0, 1)


@hookimpl
def collage_register_backends(register):
    register(Backend(BACKEND, OP_LEVEL, ("cpu",), "1", "deterministic costs, for tests only"))


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
    return FIXED_COST if backend.name == BACKEND else None
