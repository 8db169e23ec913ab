"""Timing a built function on its device: warm-up, then repeats until the spread is small."""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

import attrs
import numpy as np

from collage_core.api_checks import BOOLEAN, described, whole
from collage_core.measure.processor_wait import waiting
from collage_core.records import Cost

# A single-backend baseline whose one run takes longer is stopped (untuned TVM on BERT at batch 8: minutes).
DEFAULT_BASELINE_LIMIT_S = 60.0
# Candidate builds at once when the machine has the cores (each worker holds TVM: about 0.5 GB).
MAX_BUILD_WORKERS = 8
# A warm-up run longer than HOPELESS_FACTOR times the cut-off plus SETUP_ALLOWANCE_S is judged by
# itself: one-time setup adds seconds at most (oneDNN's primitive JIT takes milliseconds, a CUDA
# library's first call a fraction of a second), and at batch 8 one run of an untuned TVM matrix product
# takes 3-93 s on 2 cores where oneDNN takes 30-460 ms, each further run repeated only to lose again.
HOPELESS_FACTOR = 2.0
SETUP_ALLOWANCE_S = 2.0
# How a stopped baseline's cost reads: this, then the limit ("60 s").
STOPPED_PREFIX = "stopped: one run takes longer than"


def stopped(limit_s: float) -> Cost:
    """The cost of a baseline stopped because one run took longer than ``limit_s``."""
    return Cost.invalid(f"{STOPPED_PREFIX} {limit_s:g} s")


def stopped_limit(cost: Cost) -> Optional[float]:
    """The limit a stopped baseline exceeded, or None if ``cost`` is not a stopped one."""
    if cost.is_measured or not cost.reason.startswith(STOPPED_PREFIX):
        return None
    try:
        return float(cost.reason[len(STOPPED_PREFIX) :].strip().removesuffix("s"))
    except ValueError:
        return None


@attrs.frozen
class MeasureSettings:
    """How hard to measure. ``target_spread`` is the interquartile range relative to the median.

    ``cutoff_s``: a function whose first run after the warm-up already takes longer is not
    measured further; its cost is that one run (``repeats`` 1). The two-level search uses it to drop slow genomes fast.

    ``single_run_s``: a whole placement whose first run takes longer is timed by that run alone
    (``repeats`` 1): repeating a run of seconds (untuned TVM on a large model) costs minutes and
    adds no precision anyone reads.

    ``build_workers``: how many worker processes build candidates, and each generation of the two-level search's
    placements, at once (0: half the cores, at most MAX_BUILD_WORKERS); timing stays one at a time, after the builds.

    ``cuda_graphs``: on a CUDA target, whole placements are built to replay as CUDA graphs (see
    :func:`collage_core.build.executable.build`), and so measured, searched, verified and saved; candidates
    alone are built plainly. Off: every build launches its kernels one by one.
    """

    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 15
    target_spread: float = 0.05
    min_repeat_ms: float = 20.0
    time_bound_s: float = 10.0
    timeout_s: float = 600.0
    cutoff_s: Optional[float] = None
    single_run_s: float = 5.0
    build_workers: int = described(
        0,
        whole(0),
        f"build this many candidates, and two-level placements, at once (0: half the cores, at most "
        f"{MAX_BUILD_WORKERS}); they are timed one at a time after the builds",
    )
    cuda_graphs: bool = described(
        True,
        BOOLEAN,
        "replay CUDA graphs in the placements built for a CUDA target (the report gives the placement's latency both with and without)",
    )

    def parallel_builds(self) -> int:
        """How many candidates are built at once: ``build_workers``, or with 0 half the cores up to MAX_BUILD_WORKERS
        (on 2 cores, building one while exporting another gained nothing over building and timing in turn)."""
        return self.build_workers if self.build_workers > 0 else max(1, min((os.cpu_count() or 1) // 2, MAX_BUILD_WORKERS))

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "MeasureSettings":
        known = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def summarize(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range."""
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    return float(median), float(q3 - q1)


def time_callable(
    run: Callable[[int], float], settings: MeasureSettings, warm_run_s: Optional[float] = None, judge_waiting: bool = True
) -> Cost:
    """Time ``run(number)`` which runs the function ``number`` times and returns mean seconds per run.

    Each repeat runs the function often enough to last ``min_repeat_ms``; repeats stop when the
    spread is under ``target_spread``, at ``max_repeats``, or when ``time_bound_s`` is spent.
    ``warm_run_s``: the seconds of one run the caller already made after warming the function up;
    then no warm-up runs here and that run is the one the cut-off judges (a placement whose run
    takes seconds saves two of them). With a cut-off, a warm-up run over HOPELESS_FACTOR times it
    plus SETUP_ALLOWANCE_S is the cost by itself.

    With ``judge_waiting`` (``run`` runs in this process), a cost whose runs after the warm-up kept this
    process's threads waiting for a processor (other processes' load) is marked held up
    (:mod:`collage_core.measure.processor_wait`); warm-up and setup, which run on the processor, are not judged.
    """
    started = time.perf_counter()
    once = warm_run_s
    if warm_run_s is None:
        for _ in range(settings.warmup):
            once = run(1)
        if settings.cutoff_s is not None and once is not None and once > HOPELESS_FACTOR * settings.cutoff_s + SETUP_ALLOWANCE_S:
            return Cost.measured(once, 0.0, 1)
    ran = []

    def counted(number: int) -> float:
        ran.append(number)
        return run(number)

    with waiting() as waited:
        if warm_run_s is None and settings.cutoff_s is not None:
            # Judged on a run after the warm-up: a first run pays for one-time work (oneDNN creating
            # and JIT-compiling its primitives) that says nothing about the steady latency.
            once = counted(1)
        cost = _repeated(counted, settings, once, started)
    # Judged only over runs: a cost cut off on the caller's run ran nothing here.
    return cost.with_held_up_share(waited.share) if judge_waiting and ran and waited.held_up else cost


def _repeated(run: Callable[[int], float], settings: MeasureSettings, once: float, started: float) -> Cost:
    """The cost of a warm function one run of which took ``once``: that run alone past the cut-off, else
    repeats of runs lasting ``min_repeat_ms`` (see :func:`time_callable`)."""
    if settings.cutoff_s is not None and once > settings.cutoff_s:
        return Cost.measured(once, 0.0, 1)
    number = max(1, int(settings.min_repeat_ms / 1e3 / max(once, 1e-9)))
    samples: list[float] = []
    while True:
        samples.append(run(number))
        enough = len(samples) >= settings.min_repeats
        median, spread = summarize(samples)
        if enough and (spread <= settings.target_spread * median or len(samples) >= settings.max_repeats):
            break
        if enough and time.perf_counter() - started > settings.time_bound_s:
            break
    return Cost.measured(median, spread, len(samples))
