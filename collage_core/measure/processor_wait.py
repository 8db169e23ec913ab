"""How long a process's threads waited for a processor while it timed something: other processes' load.

A timing is taken for a kernel's own latency. When other processes keep the cores busy, the kernel's
threads are runnable but wait for a processor, and the timing grows with the load, not with the
kernel: a oneDNN candidate with two threads on two cores, one of them held by another process, timed
0.9-1.25 ms with a tight spread against 7-10 us on a quiet machine. Its spread did not show it; the
time its threads spent waiting does. Linux counts it per thread (the second field of
``/proc/<pid>/task/<tid>/schedstat``, ``run_delay``), as :mod:`collage_core.measure.worker_client`
reads it to tell a worker held up by the machine from one that hangs.

:func:`waiting` measures the share of a stretch of wall time that this process's threads, all
together, spent so; :data:`HELD_UP_SHARE` is where a timing counts as held up. Linux shares a processor
between sessions first (autogroups), and measurement workers run in sessions of their own, so what
holds a worker up is other sessions' work: another user's job, another Collage run.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from typing import Iterator

import attrs

# A timing whose threads, all together, waited for a processor this share of its wall time or more
# was held up by other processes. One thread beside one busy process on its core waits about half the
# time, oneDNN's two threads on two cores beside one busy process 0.51-0.73 of it (timings 100 times their
# quiet ones); single-threaded TVM timings on a quiet machine wait a few per cent at most, but a two-thread
# kernel on two cores waits whenever anything else runs, a quarter of the time now and then.
HELD_UP_SHARE = 0.4


@attrs.define
class Waiting:
    """The share of the wall time this process's threads spent waiting for a processor, known (to three decimals)
    when the ``with`` block of :func:`waiting` ends (0.0 before, and where the kernel does not say)."""

    share: float = 0.0

    @property
    def held_up(self) -> bool:
        return self.share >= HELD_UP_SHARE


@contextlib.contextmanager
def waiting(pid: int | None = None, min_wall_s: float = 0.0) -> Iterator[Waiting]:
    """Measure, over the ``with`` block, the share of its wall time that the threads of process ``pid``
    (default: this one) spent runnable but waiting for a processor, summed over threads (two threads that
    each waited half the time give 1.0). Threads started inside the block count from their start. A block
    shorter than ``min_wall_s`` is not judged (0.0)."""
    pid = os.getpid() if pid is None else pid
    result = Waiting()
    before, started = waited_ns_by_thread(pid), time.perf_counter_ns()
    yield result
    wall_ns = time.perf_counter_ns() - started
    if wall_ns < min_wall_s * 1e9:
        return
    after = waited_ns_by_thread(pid)
    waited_ns = sum(ns - before.get(thread, 0) for thread, ns in after.items())
    result.share = round(max(0.0, waited_ns / wall_ns), 3) if wall_ns > 0 else 0.0


def waited_ns_by_thread(pid: int) -> dict[str, int]:
    """Nanoseconds each thread of process ``pid`` has spent waiting for a processor since it started (Linux's
    schedstat); empty where the kernel does not say."""
    waited = {}
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as stat:
                waited[path] = int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return waited
