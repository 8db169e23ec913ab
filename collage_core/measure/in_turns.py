"""Timing built libraries in turns, so that a machine whose speed drifts favours none of them.

Measured one after another, the same build drifts by tens of percent between minutes on a
shared machine: on a 2-core VM, MobileNetV2's ONNX Runtime build measured 6.5 ms in one worker
and 4.3 ms in the next. Two placements within that drift can only be told apart side by side.
Each library is loaded in measurement workers of its own (``workers_per_library``) and warmed up;
then the workers take turns, a burst of runs each (about ``burst_s``), for ``rounds`` rounds, the
first of each round rotating. Only the running worker works; the others wait for their next
request.

A library's cost is the median and interquartile range of the warm runs of its fastest worker (the
one with the lowest median). A process keeps its own luck, and on these machines the luck only
ever slows: on a 2-core Xeon, GPT-2 at batch 8 in OpenVINO ran 0.92 s a run back to back in one
process, while of four processes taking turns with ONNX Runtime's, one ran 1.27 s a run round
after round and the others 0.92-0.94 s; a single process that waited 4 s between runs slowed
from 0.92 to 1.3 s (ONNX Runtime's stayed at 1.0-1.1 s; OpenVINO's slowing after a pause is known
upstream, openvinotoolkit/openvino#31145). Pooling the workers' runs would charge
a library for its unluckiest process; its fastest worker measures it as it runs when nothing
holds it back, as it ran alone, and every library is measured the same way.

After ``min_rounds`` the turns stop early once the fastest library is clear: its fastest worker's
upper quartile under every other library's fastest worker's lower quartile. At batch 8, where a
run of GPT-2 takes seconds on 2 cores, seven rounds of every worker cost minutes that could not
change the winner.

Each library is timed two ways, as it will be used, and the two are reported apart (see
docs/contest.md): **warm**, back to back, and **after a pause**. A worker runs its library
``warmup_runs`` times when it loads it (as benchmarks/interleaved.py's processes do); each of its
turns then waits until the library has sat idle at least ``pause_s`` since its last run, runs it
once (a run after a pause), then again for about ``burst_s`` back to back (at least once: the warm
runs). The contest chooses by the warm figure (``--latency after-pause``: by the run after a pause) and
reports the other beside it. Pooled in one median, as before, the two weighed by how many runs fit in a
burst, and that number came from a single run after a single warm-up (on a 2-core Xeon shared with
other work, one OpenVINO library's first timed run measured 19 to 68 ms in six processes of one
sitting, so a process took 5 to 21 runs a turn): whatever the first run after a pause does differently (slower, as OpenVINO's
after a pause, openvinotoolkit/openvino#31145; or faster, as a process the kernel credits for having
slept among busy ones) moved a library's figure by a share that neither the contest nor
benchmarks/interleaved.py chose."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Mapping, Optional, Sequence

import attrs
import numpy as np

from collage_core.measure.worker_client import MeasurementWorker
from collage_core.records import Cost


@attrs.frozen
class TurnSettings:
    rounds: int = 7
    min_rounds: int = 3
    burst_s: float = 0.3
    timeout_s: float = 600.0
    # Workers per library. Each process keeps its own luck: the same pair timed in turns in other
    # processes disagreed by a tenth. A library is costed by its fastest worker.
    workers_per_library: int = 2
    # Runs of a library when its worker loads it, before any is timed (benchmarks/interleaved.py's three).
    warmup_runs: int = 3
    # The least time a library sits idle before the first run of each of its turns, the run after a pause.
    pause_s: float = 1.0


# The latencies a contest may choose by (``--latency``): warm, back to back, or the first run after a pause.
WARM = "warm"
AFTER_PAUSE = "after-pause"
LATENCIES = (WARM, AFTER_PAUSE)


@attrs.frozen
class LibraryTurns:
    """A library's latency in turns, from its fastest worker (the lowest median of the latency chosen by):
    ``warm``, its runs back to back (every run of a turn but the first), by which the contest chooses unless told
    otherwise; ``after_pause``, the first run of each turn, after the library sat idle ``paused_s`` (the median of
    its turns) or more."""

    warm: Cost
    after_pause: Cost
    paused_s: float

    def latency(self, which: str) -> Cost:
        """The latency ``which`` names (one of LATENCIES)."""
        return self.after_pause if which == AFTER_PAUSE else self.warm


def time_in_turns(
    libraries: Mapping[str, Path],
    inputs: Path,
    target_json: str,
    plugin_modules: Sequence[str],
    disabled: Sequence[str],
    settings: TurnSettings = TurnSettings(),
    functions: Mapping[str, str] = {},
    remote: Optional[dict] = None,
    latency: str = WARM,
) -> dict[str, LibraryTurns]:
    """Each library's latency in turns, by name, from the runs of its fastest worker on ``inputs`` (an
    ``.npz``), every worker of every library taking its turns. A library runs its ``main``, or the entry
    function ``functions`` names for it (a library of shape profiles holds one per shape). ``latency`` (warm, or
    after a pause) is what the contest chooses by: its runs pick each library's fastest worker and tell when the
    leader is clear, so that the turns stop.

    With ``remote`` (:meth:`collage_core.measure.remote.RemoteServers.request`: libraries built for the servers),
    the libraries take their turns on one server, loaded in one session (held for the whole contest, so that it
    needs one free server) and each run timed there; a process's luck is the server's, so one copy of each.

    Raises :class:`~collage_core.measure.worker_client.WorkerFailure` if a library cannot be loaded or run.
    """
    with contextlib.ExitStack() as stack:
        workers, once_s = {}, {}
        shared = stack.enter_context(MeasurementWorker(plugin_modules, disabled)) if remote is not None else None
        for name, library in libraries.items():
            for copy in range(settings.workers_per_library if remote is None else 1):
                worker = shared or stack.enter_context(MeasurementWorker(plugin_modules, disabled))
                request = {
                    "op": "load_library",
                    "name": name,
                    "library": str(library),
                    "inputs": str(inputs),
                    "target": target_json,
                    "warmup_runs": settings.warmup_runs,
                    "function": functions.get(name, "main"),
                    **({"remote": remote} if remote is not None else {}),
                }
                once_s[name, copy] = worker.request(request, settings.timeout_s)["once_s"]
                workers[name, copy] = worker
        warm: dict[tuple[str, int], list[float]] = {key: [] for key in workers}
        after_pause: dict[tuple[str, int], list[float]] = {key: [] for key in workers}
        paused: dict[tuple[str, int], list[float]] = {key: [] for key in workers}
        deciding = after_pause if latency == AFTER_PAUSE else warm
        keys = list(workers)
        for round_index in range(settings.rounds):
            shift = round_index % len(keys)
            for key in keys[shift:] + keys[:shift]:
                run_s = max(float(np.median(warm[key])) if warm[key] else once_s[key], 1e-6)
                count = 1 + max(1, int(settings.burst_s / run_s))
                request = {"op": "time_turn", "name": key[0], "count": count, "pause_s": settings.pause_s}
                response = workers[key].request(request, settings.timeout_s)
                first, *rest = response["samples_s"]
                after_pause[key].append(first)
                warm[key] += rest
                paused[key].append(response["paused_s"])
            if round_index + 1 >= settings.min_rounds and leader_is_clear(fastest_workers_runs(deciding)):
                break
    chosen = {
        name: min((key for key in deciding if key[0] == name and deciding[key]), key=lambda key: np.median(deciding[key]))
        for name in libraries
    }
    return {name: LibraryTurns(_cost(warm[key]), _cost(after_pause[key]), float(np.median(paused[key]))) for name, key in chosen.items()}


def fastest_workers_runs(samples: Mapping[tuple[str, int], Sequence[float]]) -> dict[str, list[float]]:
    """Each library's runs in its fastest worker (the lowest median), from runs keyed by
    ``(library, worker)``; a library whose workers have not run yet has none."""
    by_library: dict[str, list[list[float]]] = {}
    for (name, _), runs in samples.items():
        by_library.setdefault(name, []).append(list(runs))
    return {name: min((runs for runs in workers if runs), key=np.median, default=[]) for name, workers in by_library.items()}


def leader_is_clear(samples: Mapping[str, Sequence[float]]) -> bool:
    """Whether the library with the lowest median ran faster than every other in all but the tails:
    its upper quartile under each other library's lower quartile. One library alone is clear."""
    quartiles = {name: np.percentile(values, [25, 50, 75]) for name, values in samples.items() if len(values)}
    if len(quartiles) < len(samples):
        return False
    leader = min(quartiles, key=lambda name: quartiles[name][1])
    return all(quartiles[leader][2] < q1 for name, (q1, _, _) in quartiles.items() if name != leader)


def _cost(samples: list[float]) -> Cost:
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    return Cost.measured(float(median), float(q3 - q1), len(samples))
