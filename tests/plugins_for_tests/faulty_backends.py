"""Backends whose measurement fails, for testing that a measurement run survives them; never installed.

Each backend takes any single operator and lowers like TVM, but measuring one of its candidates
raises (``raising``), kills the worker process with SIGABRT (``crashing``) or never returns
(``hanging``). ``poisoning`` fails on ``conv2d`` only, and leaves its process unusable as a
faulting GPU kernel leaves its CUDA context: every later measurement in that process raises.
Other backends' candidates are left to the next implementation.
"""

import os
import time

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends

RAISING = "raising"
CRASHING = "crashing"
HANGING = "hanging"
POISONING = "poisoning"
RAISED_MESSAGE = "the raising backend cannot measure anything"
POISONING_MESSAGE = "illegal memory access (a deliberate fault)"
_poisoned = []


def _raise():
    raise RuntimeError(RAISED_MESSAGE)


def _crash():
    os.abort()


def _hang():
    time.sleep(3600)


def _poison(mod):
    if _poisoned:
        raise RuntimeError("an earlier fault left this process unusable")
    if "conv2d" in mod["main"].script():
        _poisoned.append(True)
        raise RuntimeError(POISONING_MESSAGE)
    return Cost.measured(1.0e-3, 0.0, 3)


FAULTS = {RAISING: _raise, CRASHING: _crash, HANGING: _hang}
BACKENDS = (*FAULTS, POISONING)


collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    BACKENDS, ("cpu",), "test backend whose measurement fails ({name})"
)


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name == POISONING:
        return _poison(mod)
    if backend.name in FAULTS:
        FAULTS[backend.name]()
    return None
