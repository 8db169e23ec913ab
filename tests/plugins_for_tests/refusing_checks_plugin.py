"""A backend whose checks refuse with reasons, and one check that is broken; never installed, nothing lowered.

Backend ``picky`` matches ``relu`` (its check refuses tensors of more than ``MAX_ELEMENTS``
elements, saying so), ``add`` (its check raises ``ZeroDivisionError``: a bug, not a refusal)
and ``conv2d`` (accepted).
"""

import math

from tvm.relax.dpl import is_op, wildcard

from collage_core import Availability, Backend, Pattern, PatternRefused, hookimpl, tvm_compat
from collage_core.records import OP_LEVEL

BACKEND = "picky"
MAX_ELEMENTS = 1000


def _small_enough(match) -> bool:
    shape, _ = tvm_compat.tensor_shape_dtype(match.root)
    if math.prod(shape) > MAX_ELEMENTS:
        raise PatternRefused(f"{math.prod(shape)} elements, over the {MAX_ELEMENTS} this backend takes")
    return True


def _broken(match) -> bool:
    return 1 / 0 > 0


@hookimpl
def collage_register_backends(register):
    register(Backend(BACKEND, OP_LEVEL, ("cpu",), "1", "checks that refuse with reasons, for tests only"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name == BACKEND else None


@hookimpl
def collage_contribute_patterns(backend, target):
    if backend.name != BACKEND:
        return None
    return [
        Pattern(f"{BACKEND}.relu", is_op("relax.nn.relu")(wildcard()), check=_small_enough),
        Pattern(f"{BACKEND}.add", is_op("relax.add")(wildcard(), wildcard()), check=_broken),
        Pattern(f"{BACKEND}.conv2d", is_op("relax.nn.conv2d")(wildcard(), wildcard())),
    ]
