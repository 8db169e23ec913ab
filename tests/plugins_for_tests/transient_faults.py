"""Backends whose workers fail for no fault of what they measure, for testing that such failures are
measured again; never installed.

Each takes any single operator and lowers like TVM. Measuring one of its candidates, or lowering a
placement on it, counts as an attempt in the folder ``$TRANSIENT_FAULTS_DIR``; as the attempt's
number says, the worker is killed by SIGKILL the first time (``killed_once``, as a user's ``kill -9``
or the out-of-memory killer would), by SIGTERM the first time (``terminated_once``), by SIGKILL
every time (``killed_always``, a candidate needing more memory than there is), or kept waiting for
a processor until it times out the first two times (``held_up_twice``: it spins on one processor
with three processes spinning beside it, as on a machine busy with other work). Other attempts
measure ``MEASURED`` and lower as TVM does.
"""

import os
import signal
import time

from collage_core import Cost, hookimpl
from plugins_for_tests.any_operator import any_operator_backends
from plugins_for_tests.attempts import attempt as counted_attempt

KILLED_ONCE = "killed_once"
TERMINATED_ONCE = "terminated_once"
KILLED_ALWAYS = "killed_always"
HELD_UP_TWICE = "held_up_twice"
BACKENDS = (KILLED_ONCE, TERMINATED_ONCE, KILLED_ALWAYS, HELD_UP_TWICE)
MEASURED = Cost.measured(2.0e-3, 0.0, 3)
ATTEMPTS = "TRANSIENT_FAULTS_DIR"
# The spinning processes give up after this long, should nothing kill them.
SPIN_LIMIT_S = 60.0


def attempt(name: str) -> int:
    """This attempt's number for ``name`` (1 for the first), counted in the folder the variable ATTEMPTS names, by every worker."""
    return counted_attempt(ATTEMPTS, name)


def _kill(signal_number: int) -> None:
    os.kill(os.getpid(), signal_number)
    time.sleep(SPIN_LIMIT_S)  # the signal arrives first


def _held_up() -> None:
    """Spin on one processor beside three processes spinning on it: runnable, but mostly waiting."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    parent = os.getpid()
    for _ in range(3):
        if os.fork() == 0:  # killed with the worker's process group, or gone once the worker is
            deadline = time.monotonic() + SPIN_LIMIT_S
            while os.getppid() == parent and time.monotonic() < deadline:
                pass
            os._exit(0)
    deadline = time.monotonic() + SPIN_LIMIT_S
    while time.monotonic() < deadline:
        pass


def fault(backend_name: str, what: str) -> None:
    """Fail this attempt at ``what`` (a candidate or a placement) as ``backend_name`` does, or return."""
    number = attempt(f"{backend_name}-{what}")
    if backend_name == KILLED_ALWAYS or (backend_name == KILLED_ONCE and number == 1):
        _kill(signal.SIGKILL)
    if backend_name == TERMINATED_ONCE and number == 1:
        _kill(signal.SIGTERM)
    if backend_name == HELD_UP_TWICE and number <= 2:
        _held_up()


collage_register_backends, collage_check_availability, collage_contribute_patterns = any_operator_backends(
    BACKENDS, ("cpu",), "test backend whose worker fails from outside ({name})"
)[:3]


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    if backend.name not in BACKENDS:
        return None
    fault(backend.name, "placement")
    return mod


@hookimpl(tryfirst=True)
def collage_measure_candidate(backend, mod, target, settings):
    if backend.name not in BACKENDS:
        return None
    fault(backend.name, "candidate")
    return MEASURED
