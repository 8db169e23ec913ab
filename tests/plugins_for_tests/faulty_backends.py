"""Backends whose measurement fails, for testing that a measurement run survives them; never installed.

Each backend takes any single operator and lowers like TVM, but measuring one of its candidates
raises (``raising``), kills the worker process with SIGABRT (``crashing``) or never returns
(``hanging``). Other backends' candidates are left to the next implementation.
"""

import os
import time

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Pattern, hookimpl
from collage_core.records import OP_LEVEL

RAISING = "raising"
CRASHING = "crashing"
HANGING = "hanging"
RAISED_MESSAGE = "the raising backend cannot measure anything"


def _raise():
    raise RuntimeError(RAISED_MESSAGE)


def _crash():
    os.abort()


def _hang():
    time.sleep(3600)


FAULTS = {RAISING: _raise, CRASHING: _crash, HANGING: _hang}


@hookimpl
def collage_register_backends(register):
    for name in FAULTS:
        register(Backend(name, OP_LEVEL, ("cpu",), "1", f"test backend whose measurement fails ({name})"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name in FAULTS else None


@hookimpl
def collage_contribute_patterns(backend, target):
    return [Pattern(f"{backend.name}.op", wildcard())] if backend.name in FAULTS else None


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return mod if backend.name in FAULTS else None


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name in FAULTS:
        FAULTS[backend.name]()
    return None
