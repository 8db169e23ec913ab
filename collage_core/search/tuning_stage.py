"""The tuning stage: with a tuning budget, the kernels of the placement's costliest partitions tuned by the backends
that tune (``collage_tune_partitions``), then the search run again with the backends registered anew, the tuned
kernels competing as candidates of their own. Costs measured before are read from the cost database, so the second
search measures only what is new."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from collage_core.backends import backends_for
from collage_core.build.partition import partition_function_name, partition_module
from collage_core.measure.job import Job
from collage_core.measure.progress import PhaseClock
from collage_core.plugins import call_each
from collage_core.records import OP_LEVEL
from collage_core.search import stage as search_stage

if TYPE_CHECKING:
    from collage_core.options import OptimizeOptions

log = logging.getLogger("collage")


def costliest(job: Job, parts) -> list[tuple[str, float]]:
    """The measured op-level partitions of ``parts``, as ``partition_module`` names them, with their shares of the
    parts' summed measured cost, the costliest first."""
    measured = [
        (partition_function_name(part.backend, index), part.cost.seconds)
        for index, part in enumerate(parts)
        if job.backends[part.backend].kind == OP_LEVEL and part.cost.is_measured
    ]
    total = sum(seconds for _, seconds in measured) or 1.0
    return sorted(((name, seconds / total) for name, seconds in measured), key=lambda item: -item[1])


def tune(job: Job, parts, budget_s: float) -> int:
    """Hand the costliest partitions of ``parts`` to each chosen backend's ``collage_tune_partitions`` in turn,
    within ``budget_s`` seconds in all; how many kernels they tuned. A plugin that raises is warned of."""
    shares = costliest(job, parts)
    if not shares:
        return 0
    job.say(
        f"tuning for at most {budget_s:.0f} s; the costliest partitions: {', '.join(f'{name} {share:.0%}' for name, share in shares[:8])}"
    )
    mod = partition_module(job.graph, parts)
    present = {gvar.name_hint for gvar in mod.get_global_vars()}
    names = [name for name, _ in shares if name in present]  # a partition whose results nothing reads is dropped
    started, tuned, answered = time.monotonic(), 0, False
    for info in job.chosen:
        left = budget_s - (time.monotonic() - started)
        if left <= 0:
            break
        hook = job.pm.hook.collage_tune_partitions
        for plugin_name, result, error in call_each(
            hook, backend=info.backend, mod=mod, function_names=names, target=job.target, budget_s=left
        ):
            if error:
                log.warning("plugin %s: collage_tune_partitions raised %s; nothing more is tuned for %s", plugin_name, error, info.name)
            elif result is not None:
                answered, tuned = True, tuned + int(result)
    if not answered:
        job.say("no selected backend tunes kernels (`collage backends` lists the installed ones)")
    return tuned


def tuned_and_searched_again(
    job: Job, options: "OptimizeOptions", search: str, clock: PhaseClock, placed: search_stage.Placed
) -> search_stage.Placed:
    """``placed`` when there is no tuning budget (or a placement is replayed) or nothing was tuned; else the
    placement the search finds with the tuned kernels among the candidates."""
    if options.tune_budget_s <= 0 or options.placement is not None:
        return placed
    tuned = tune(job, placed.parts, options.tune_budget_s)
    clock.lap("tuning")
    if not tuned:
        job.say("tuning added no kernels: the placement stands")
        return placed
    job.say(f"tuned {tuned} kernels; searching again with them")
    # The tuning backends' versions changed with what they keep: their old costs are not read as new ones.
    job.chosen = backends_for(job.pm, options.backends, job.target)
    return search_stage.place(job, options, search, clock)
