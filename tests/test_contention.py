"""collage_core.measure.contention: a kernel many times slower right after TVM's parallel kernel than alone.

The judgement and the order of the timings are tested with timings and a clock made up here; the
real timing runs with --run-slow.
"""

from __future__ import annotations

import pytest

from collage_core import tvm_compat
from collage_core.measure import contention
from collage_core.measure.contention import Timings

MS = 1e-3


def test_every_run_beside_tvm_many_times_slower_is_contention_and_says_by_how_much():
    found = contention.contention(Timings([0.1 * MS] * 7, [4 * MS, 5 * MS, 4 * MS, 6 * MS, 4 * MS, 5 * MS, 40 * MS]))
    assert found.startswith(
        "thread contention: a run right after a parallel TVM kernel takes 5 ms (median of 7, the fastest 4 ms) against 0.1 ms alone"
    )


def test_one_fast_run_beside_tvm_is_noise_not_contention():
    assert contention.contention(Timings([0.1 * MS] * 7, [4 * MS] * 6 + [0.3 * MS])) is None


def test_a_slowdown_of_less_than_the_minimum_is_not_contention_however_many_times():
    assert contention.contention(Timings([0.01 * MS] * 7, [0.5 * MS] * 7)) is None
    assert contention.contention(Timings([0.01 * MS] * 7, [0.5 * MS] * 7), min_slowdown_s=0.1 * MS) is not None


def test_a_slowdown_of_less_than_the_factor_is_not_contention_however_long():
    assert contention.contention(Timings([10 * MS] * 7, [45 * MS] * 7)) is None


def test_contention_is_confirmed_by_a_second_round_and_one_round_without_it_clears_it():
    slow, fine = Timings([0.1 * MS] * 7, [5 * MS] * 7), Timings([0.1 * MS] * 7, [0.1 * MS] * 7)
    rounds = iter([slow, fine])
    assert contention.confirmed_contention(lambda: next(rounds)) is None
    measured = []
    assert contention.confirmed_contention(lambda: measured.append(slow) or slow) is not None
    assert len(measured) == contention.ROUNDS == 2
    measured.clear()
    assert contention.confirmed_contention(lambda: measured.append(fine) or fine) is None and len(measured) == 1


class MadeUpKernels:
    """A kernel that takes 0.1 ms, or 5 ms when TVM's kernel ran just before it, and a clock that follows them."""

    def __init__(self):
        self.now, self.last, self.events = 0.0, None, []

    def clock(self):
        return self.now

    def settle(self):
        self.events.append("settle")
        self.now += 0.1
        self.last = "settle"

    def run(self):
        self.events.append("run")
        self.now += 5 * MS if self.last == "tvm" else 0.1 * MS
        self.last = "run"

    def run_tvm(self):
        self.events.append("tvm")
        self.now += 1 * MS
        self.last = "tvm"


def test_alone_is_timed_run_after_run_once_settled_and_beside_each_run_right_after_tvm():
    kernels = MadeUpKernels()
    timings = contention.times_beside_tvm(kernels.run, kernels.run_tvm, repeats=3, clock=kernels.clock, settle=kernels.settle)
    assert kernels.events == ["settle", "run"] + ["run"] * 3 + ["tvm", "run"] * 3
    assert timings.alone_s == pytest.approx([0.1 * MS] * 3) and timings.beside_tvm_s == pytest.approx([5 * MS] * 3)
    assert contention.contention(timings) is not None


class MadeUpProcess:
    """A process whose threads use ``busy_windows`` windows of a whole core each, then nothing."""

    def __init__(self, busy_windows: int):
        self.busy_windows, self.cpu_s, self.slept = busy_windows, 0.0, []

    def cpu_clock(self):
        return self.cpu_s

    def sleep(self, seconds):
        self.slept.append(seconds)
        if len(self.slept) <= self.busy_windows:
            self.cpu_s += seconds


def test_waiting_until_quiet_ends_at_the_first_quiet_window_and_gives_up_after_max_s():
    spinning_then_asleep = MadeUpProcess(busy_windows=3)
    assert contention.wait_until_quiet(0.5, 0.005, spinning_then_asleep.cpu_clock, spinning_then_asleep.sleep)
    assert spinning_then_asleep.slept == [0.005] * 4
    never_quiet = MadeUpProcess(busy_windows=1000)
    assert not contention.wait_until_quiet(0.5, 0.005, never_quiet.cpu_clock, never_quiet.sleep)
    assert len(never_quiet.slept) == 100


@pytest.mark.slow
def test_a_numpy_kernel_is_not_slowed_by_tvms_parallel_kernel_on_this_machine():
    import numpy as np

    x = np.random.default_rng(0).uniform(-1, 1, size=(64, 64)).astype("float32")
    run_tvm = contention.parallel_tvm_kernel(tvm_compat.host_cpu_target())
    assert contention.confirmed_contention(lambda: contention.times_beside_tvm(lambda: np.tanh(x), run_tvm)) is None
