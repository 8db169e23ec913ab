"""Whether a backend's kernel is slowed down by TVM's thread pool running beside it.

A built executable runs a backend's partitions between TVM's kernels, in one process. TVM's worker
threads spin for a while after a parallel kernel; a backend's own pool (OpenMP, TBB, ONNX Runtime's)
that starts meanwhile competes with them for the cores, and the reverse: a PyTorch-backed plugin ran
40 times slower so on tiny_bert. :func:`times_beside_tvm` times a kernel alone and right after a
parallel loop TVM compiled; :func:`contention` judges the two with a wide margin, so that a busy
machine's noise (a run descheduled now and then) is not taken for contention.

TVM's pool has ``TVM_NUM_THREADS`` threads, by default half the cores on x86 (one on two cores: no
worker to spin, and nothing to find).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional

import attrs
import numpy as np
import tvm

from collage_core import tvm_compat

# Contention is a run right after TVM's parallel kernel at least FACTOR times slower than alone, and
# slower by at least MIN_SLOWDOWN_S. The spinning that starved PyTorch cost 40 times on tiny_bert, and now
# and then hundreds of times on a 64x64 matmul (0.006 ms alone, 2 to 16 ms beside TVM's two threads), while
# on a busy 2-core machine the oneDNN, ONNX Runtime and OpenVINO plugins' kernels ran beside TVM's less than
# 0.4 ms slower than alone, or within 4 times when longer.
FACTOR = 5.0
MIN_SLOWDOWN_S = 1e-3
REPEATS = 7
ROUNDS = 2
# TVM's workers spin after a parallel kernel before they sleep: with TVM_NUM_THREADS=2 on a busy 2-core
# machine, 50 ms of CPU over about 100 ms. The kernel is timed alone once the process has used less than a
# fifth of a core over a window of QUIET_WINDOW_S, waiting no longer than MAX_QUIET_WAIT_S (a kernel's
# own pool may never go quiet).
QUIET_WINDOW_S = 0.005
MAX_QUIET_WAIT_S = 0.5
# Elements of the parallel loop: enough work for every worker of TVM's pool to take a share.
PARALLEL_ELEMENTS = 1 << 18


@attrs.frozen
class Timings:
    """Seconds per run of a kernel, alone and right after a parallel TVM kernel."""

    alone_s: tuple[float, ...] = attrs.field(converter=tuple)
    beside_tvm_s: tuple[float, ...] = attrs.field(converter=tuple)

    @property
    def median_alone_s(self) -> float:
        return statistics.median(self.alone_s)

    @property
    def median_beside_tvm_s(self) -> float:
        return statistics.median(self.beside_tvm_s)


def contention(timings: Timings, factor: float = FACTOR, min_slowdown_s: float = MIN_SLOWDOWN_S) -> Optional[str]:
    """None when the kernel runs right after TVM's parallel kernel about as fast as alone; else one line
    saying how much slower it is. Contention slows every run beside TVM, a busy machine now and then one:
    so even the fastest run beside TVM must take ``factor`` times the median alone, and ``min_slowdown_s`` more."""
    alone, fastest_beside = timings.median_alone_s, min(timings.beside_tvm_s)
    if fastest_beside < factor * alone or fastest_beside - alone < min_slowdown_s:
        return None
    return (
        f"thread contention: a run right after a parallel TVM kernel takes {timings.median_beside_tvm_s * 1e3:.3g} ms "
        f"(median of {len(timings.beside_tvm_s)}, the fastest {fastest_beside * 1e3:.3g} ms) against "
        f"{alone * 1e3:.3g} ms alone: its threads and TVM's, which spin after each parallel kernel, compete for "
        "the cores; make its pool wait without spinning, or give the pools fewer threads"
    )


def confirmed_contention(
    measure: Callable[[], Timings], rounds: int = ROUNDS, factor: float = FACTOR, min_slowdown_s: float = MIN_SLOWDOWN_S
) -> Optional[str]:
    """:func:`contention` of ``measure()``, measured again up to ``rounds`` times in all while it says so: a
    contention every round shows (the last round's line), else None."""
    found = None
    for _ in range(rounds):
        found = contention(measure(), factor, min_slowdown_s)
        if found is None:
            return None
    return found


def wait_until_quiet(
    max_s: float = MAX_QUIET_WAIT_S,
    window_s: float = QUIET_WINDOW_S,
    cpu_clock: Callable[[], float] = time.process_time,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Sleep window by window until this process uses less than a fifth of a core over one (TVM's workers
    asleep), for ``max_s`` at most; whether it went quiet."""
    for _ in range(max(1, math.ceil(max_s / window_s))):
        used_before = cpu_clock()
        sleep(window_s)
        if cpu_clock() - used_before < window_s / 5:
            return True
    return False


def times_beside_tvm(
    run: Callable[[], object],
    run_tvm: Callable[[], object],
    repeats: int = REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    settle: Callable[[], object] = wait_until_quiet,
) -> Timings:
    """``run`` timed ``repeats`` times alone, one run after another once the process is quiet (``settle``:
    TVM's workers asleep, the kernel's own pool as a loop of its runs keeps it), after one untimed run;
    then ``repeats`` times right after ``run_tvm`` each, as a partition runs between TVM's kernels."""
    settle()
    run()
    alone, beside = [], []
    for _ in range(repeats):
        started = clock()
        run()
        alone.append(clock() - started)
    for _ in range(repeats):
        run_tvm()
        started = clock()
        run()
        beside.append(clock() - started)
    return Timings(alone, beside)


def parallel_tvm_kernel(target) -> Callable[[], None]:
    """A loop over PARALLEL_ELEMENTS floats that TVM compiles for ``target`` (a CPU) and splits over its
    thread pool, ready to run on its tensors: what wakes every worker of the pool, as TVM's kernels do."""
    # Deferred: TVM's compiler parts (0.27 keeps the schedule in tvm.s_tir), which a runtime-only TVM lacks.
    from tvm import s_tir, te

    x = te.placeholder((PARALLEL_ELEMENTS,), "float32", name="x")
    y = te.compute(x.shape, lambda i: te.sqrt(x[i] * x[i] + 1.0), name="y")
    schedule = s_tir.Schedule(te.create_prim_func([x, y]))
    (loop,) = schedule.get_loops(schedule.get_sblock("y"))
    schedule.parallel(loop)
    kernel = tvm.compile(schedule.mod, target)["main"]
    device = tvm_compat.device_for(target)
    source = tvm_compat.to_tensor(np.linspace(-1, 1, PARALLEL_ELEMENTS, dtype="float32"), device)
    result = tvm_compat.to_tensor(np.zeros(PARALLEL_ELEMENTS, "float32"), device)
    return lambda: kernel(source, result)
