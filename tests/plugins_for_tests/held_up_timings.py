"""Backends whose timings other processes hold up, for testing that such costs are timed again and marked;
never installed.

Each takes any single operator and lowers like TVM, and measures its candidates itself: it spins for
``SPIN_S`` and answers ``MEASURED``, counting each attempt in the folder ``$HELD_UP_TIMINGS_DIR``. While
it spins, ``held_up_always`` (every attempt) and ``held_up_once`` (the first) share one processor with
three processes spinning beside it, as on a machine busy with other work: its thread is runnable but
mostly waiting, which :mod:`collage_core.measure.processor_wait` measures. ``never_held_up`` only spins.
"""

import os
import time

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends
from plugins_for_tests.attempts import attempt as counted_attempt

HELD_UP_ALWAYS = "held_up_always"
HELD_UP_ONCE = "held_up_once"
NEVER_HELD_UP = "never_held_up"
BACKENDS = (HELD_UP_ALWAYS, HELD_UP_ONCE, NEVER_HELD_UP)
MEASURED = Cost.measured(2.0e-3, 0.0, 3)
ATTEMPTS = "HELD_UP_TIMINGS_DIR"
SPIN_S = 0.2
SPINNERS = 3


def attempt(name: str) -> int:
    """This attempt's number for ``name`` (1 for the first), counted in the folder the variable ATTEMPTS names, by every worker."""
    return counted_attempt(ATTEMPTS, name)


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _spin_beside_others(seconds: float) -> None:
    """Spin ``seconds`` on one processor beside SPINNERS processes spinning on it, then put both back."""
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    children = []
    for _ in range(SPINNERS):
        child = os.fork()
        if child == 0:
            _spin(seconds + 1.0)
            os._exit(0)
        children.append(child)
    try:
        _spin(seconds)
    finally:
        for child in children:
            os.kill(child, 9)
            os.waitpid(child, 0)
        os.sched_setaffinity(0, cores)


collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions = any_operator_backends(
    BACKENDS, ("cpu",), "test backend whose timings other processes hold up ({name})"
)


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name not in BACKENDS:
        return None
    number = attempt(backend.name)
    if backend.name == HELD_UP_ALWAYS or (backend.name == HELD_UP_ONCE and number == 1):
        _spin_beside_others(SPIN_S)
    else:
        _spin(SPIN_S)
    return MEASURED
