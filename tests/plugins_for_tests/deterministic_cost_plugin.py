"""A deterministic cost model for testing the search, as a plugin; never installed, never a default.

Costs are whole milliseconds from a hash of the backend and the candidate's structure, so the
same candidate always costs the same and ties are common. It also registers ``twin``, a second
backend that runs single operators and producer-consumer pairs through TVM's own lowering, so
the search has overlapping candidates of two backends to choose from.
"""

import hashlib

from tvm.relax.dpl import is_op, wildcard

from collage_core import tvm_compat
from collage_core.hookspecs import hookimpl
from collage_core.records import OP_LEVEL, Availability, Backend, Cost, Pattern

TWIN = "twin"


def deterministic_seconds(backend_name: str, mod) -> float:
    digest = hashlib.sha256(f"{backend_name}:{tvm_compat.structural_key(mod['main'])}".encode()).hexdigest()
    return (1 + int(digest, 16) % 8) * 1e-3


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    return Cost.measured(deterministic_seconds(backend.name, mod), 0.0, 1)


@hookimpl
def collage_register_backends(register):
    register(Backend(TWIN, OP_LEVEL, ("cpu",), "1", "test backend lowered by TVM"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name == TWIN else None


@hookimpl
def collage_contribute_patterns(backend, target):
    if backend.name != TWIN:
        return None
    add_relu = is_op("relax.nn.relu")(is_op("relax.add")(wildcard(), wildcard()))
    matmul_add = is_op("relax.add")(is_op("relax.matmul")(wildcard(), wildcard()), wildcard())
    return [Pattern(f"{TWIN}.op", wildcard()), Pattern(f"{TWIN}.add_relu", add_relu), Pattern(f"{TWIN}.matmul_add", matmul_add)]


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return mod if backend.name == TWIN else None
