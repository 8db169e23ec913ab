"""Thread pools in a process that runs partitions: how many threads each takes, how idle ones
wait, and how both enter the cost keys. Decided in one place.

Sizes. Backends with thread pools of their own (ONNX Runtime, OpenVINO, PyTorch for TorchInductor)
take :func:`backend_threads`: one per core this process may run on (its CPU affinity), or
``$COLLAGE_NUM_THREADS`` when set (never more than those cores). Their partitions run one after
another with TVM's kernels in between, so each pool may use every core while it runs. TVM's own
pool takes :func:`tvm_threads` (``$TVM_NUM_THREADS``; TVM's own rule without it); set both to pin a
run to fewer cores.

Waiting. Pools that take turns must not spin beside each other: a pool whose idle threads spin
after its kernel holds the cores the next backend's kernel needs. OpenMP's threads (PyTorch's,
oneDNN's) spin through libgomp's spin count after each parallel region; on two busy cores a
tiny_bert placement with Inductor's matrix products between TVM's kernels took 0.7-33 ms per call
so (``plugins/inductor/benchmarks/thread_settings.py``). Blocking at once costs a wake-up per call
instead. :data:`WAIT_SETTINGS` makes them spin briefly, then block; :func:`environment_for_partitions`
adds it to an environment where the user has chosen nothing of the kind. OpenMP reads it when it loads, so it is given to the
processes that run partitions when they start (measurement workers and the zygote they are forked
from), and an exported library's runtime file names it for a deployment (``collage_core.build.deploy``).
``docs/threads.md`` says how a plugin's own pool should wait.

Keys. A cost depends on the pool sizes and the waiting it was measured with
(:class:`ThreadSettings`), so :func:`key_part` names them in the CPU cost keys; see there why the
machine's defaults add nothing. ``results.json`` records them.
"""

from __future__ import annotations

import os
import platform
import re
from typing import Mapping, Optional

import attrs

from collage_core.errors import CollageError

ENVIRONMENT_VARIABLE = "COLLAGE_NUM_THREADS"
TVM_VARIABLE = "TVM_NUM_THREADS"
# How long idle OpenMP threads spin before they block, read by GNU's libgomp (PyTorch's and oneDNN's here) when
# it loads: 30000 spins instead of libgomp's 300000, long enough that a kernel called right after another finds
# its threads awake, short enough that a spinning pool does not starve the next backend's kernel on a busy
# machine. tiny_bert with Inductor's matrix products between TVM's kernels (median us per call, fresh processes,
# plugins/inductor/benchmarks/thread_settings.py): quiet, 215 with libgomp's defaults, 220 with 30000 spins, 484
# blocking at once (OMP_WAIT_POLICY=PASSIVE: every call wakes its threads from sleep); beside two busy loops with
# TVM's pool at two threads, 12568, 461 and 271. Blocking at once also made tiny_bert's placement of oneDNN and
# TVM partitions 0.55 ms against 0.063. TVM's pool is left spinning: its workers yield the core while they
# spin, and making them block measured no faster.
WAIT_SETTINGS = {"GOMP_SPINCOUNT": "30000"}
# Variables besides WAIT_SETTINGS' that change how idle threads wait: OpenMP's wait policy (libgomp takes a spin
# count over it, so a user who sets the policy gets no spin count of Collage's), Intel's and LLVM's OpenMP a block
# time, TVM's pool a spin count when it starts.
OTHER_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "TVM_THREAD_POOL_SPIN_COUNT")
# A user who sets any of these has chosen how OpenMP's threads wait: Collage adds nothing.
USER_WAIT_CHOICES = ("OMP_WAIT_POLICY", *WAIT_SETTINGS)


def environment_for_partitions(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``environ`` for a process that runs partitions: :data:`WAIT_SETTINGS` added where it sets none of
    :data:`USER_WAIT_CHOICES` (a user's own choice of how OpenMP waits stays whole)."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in USER_WAIT_CHOICES):
        return dict(environ)
    return {**WAIT_SETTINGS, **environ}


def wait_settings_in_force(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The value of each of :data:`WAIT_SETTINGS`' variables that is set in the processes that run partitions
    for a process of ``environ``: the user's where set, else Collage's (none when the user chose a policy)."""
    environ = os.environ if environ is None else environ
    partitions_environment = environment_for_partitions(environ)
    return {name: partitions_environment[name] for name in WAIT_SETTINGS if name in partitions_environment}


def backend_threads(environ: Optional[Mapping[str, str]] = None) -> int:
    """Threads for a backend's pool: the cores this process may use, or fewer if the user says so."""
    environ = os.environ if environ is None else environ
    cores = len(os.sched_getaffinity(0))
    value = environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return cores
    try:
        wanted = int(value)
    except ValueError:
        wanted = 0
    if wanted < 1:
        raise CollageError(f"{ENVIRONMENT_VARIABLE}={value!r} is not a positive whole number of threads")
    return min(wanted, cores)


def tvm_threads(environ: Optional[Mapping[str, str]] = None) -> int:
    """The threads TVM's pool starts with in a process of ``environ``, worked out without starting it
    (asking TVM's runtime would start the pool, which a process that forks workers must not hold).

    TVM 0.27's rule (``MaxConcurrency`` in ``src/runtime/threading_backend.cc``): ``$TVM_NUM_THREADS``,
    else ``$OMP_NUM_THREADS``, read as C's ``atoi``; without either the hardware's threads, halved
    on x86-64 to leave out hyper-threads; never fewer than one."""
    environ = os.environ if environ is None else environ
    value = environ.get(TVM_VARIABLE, environ.get("OMP_NUM_THREADS"))
    if value is None:
        threads = os.cpu_count() or 1
        if platform.machine().lower() in ("x86_64", "amd64"):
            threads //= 2
    else:
        leading = re.match(r"\s*[+-]?\d+", value)  # C's atoi: the leading whole number, 0 without one
        threads = int(leading.group()) if leading else 0
    return max(threads, 1)


@attrs.frozen
class ThreadSettings:
    """What partitions run with: TVM's pool size, each backend's pool size, and the variables of how
    idle threads wait (name and value, sorted) in the processes that run them."""

    tvm: int
    backends: int
    waiting: tuple[tuple[str, str], ...] = attrs.field(default=tuple(sorted(WAIT_SETTINGS.items())), converter=tuple)

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> "ThreadSettings":
        """The settings of the processes that run partitions for a process of ``environ``."""
        environ = os.environ if environ is None else environ
        waiting = {**wait_settings_in_force(environ), **{name: environ[name] for name in OTHER_WAIT_VARIABLES if name in environ}}
        return cls(tvm=tvm_threads(environ), backends=backend_threads(environ), waiting=sorted(waiting.items()))

    @classmethod
    def machine_defaults(cls) -> "ThreadSettings":
        """The settings with no thread variable set, on this machine and CPU affinity."""
        return cls.from_environment({})

    def to_json(self) -> dict:
        return {"tvm": self.tvm, "backends": self.backends, "waiting": dict(self.waiting)}


def key_part(settings: ThreadSettings | None = None) -> str:
    """What the cost keys of CPU measurements add for ``settings`` (default: this process's).

    Empty for the machine's defaults: costs were keyed without thread settings before, and a cost
    database made then, with every core, still answers runs with every core (a migration would have
    had to guess the settings of old rows; those were measured with the libraries' own waiting,
    which a default run now replaces by :data:`WAIT_SETTINGS`, a difference taken as acceptable for
    keeping the warm costs). Other sizes, from ``$COLLAGE_NUM_THREADS``, ``$TVM_NUM_THREADS`` or
    ``$OMP_NUM_THREADS``, and a user's own way of waiting key costs of their own, so costs measured
    with one thread are never read for a run with all cores, nor the reverse. The default is
    judged by value: ``TVM_NUM_THREADS=1`` on a machine where TVM takes one thread anyway measures
    the same thing."""
    settings = settings or ThreadSettings.from_environment()
    defaults = ThreadSettings.machine_defaults()
    if settings == defaults:
        return ""
    waiting = "".join(f",{name}={value}" for name, value in settings.waiting if (name, value) not in defaults.waiting)
    return f"threads:tvm={settings.tvm},backends={settings.backends}{waiting}"
