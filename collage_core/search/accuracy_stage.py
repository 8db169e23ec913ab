"""The accuracy budget's stage: which units of a model converted to bf16 or fp16 go back to float32 so
that the placement's measured error (largest |out - ref| over largest |ref|) stays within the budget.
Each probe places a variant of the model by the op-level search, builds it and measures its outputs
against the reference (see :mod:`collage_core.model.accuracy_budget`)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from collage_core.backends import BackendInfo
from collage_core.candidates.enumeration import candidates_for
from collage_core.measure.cost_db import open_costs
from collage_core.measure.job import Job
from collage_core.measure.progress import PhaseClock
from collage_core.model.accuracy_budget import NEEDS_REFERENCE, AccuracyBudgetError, Fit, fit, load_fit, save_fit
from collage_core.model.precision import with_float32_units
from collage_core.model.probes import outputs_of_variants
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.stage import Imported
from collage_core.model.verify import compare_outputs
from collage_core.model.widening import units
from collage_core.options import OptimizeOptions
from collage_core.outputs.output_folder import RunFolder
from collage_core.outputs.reuse import finish_key
from collage_core.search import stage as search_stage

FIT_FILE = "accuracy-budget.json"  # the accuracy budget's probes, reused by a rerun into the same directory


@attrs.frozen
class Held:
    """The model as it is placed (``imported``, with the units the budget sent back to float32) and the
    budget's ``fit`` (None without a budget)."""

    imported: Imported
    fit: Optional[Fit]


def held_to_budget(
    imported: Imported,
    options: OptimizeOptions,
    pm,
    chosen: Sequence[BackendInfo],
    folder: RunFolder,
    say: Callable[[str], None],
    clock: PhaseClock,
    remote=None,
) -> Held:
    """``imported`` with as few units back in float32 as hold ``options.accuracy_budget`` (as it is without
    a budget). The fit is kept in the run's folder, and reused by a rerun into it; the probes' files go
    to its scratch. With ``remote`` (:class:`collage_core.measure.remote.RemoteServers`) the probes' candidates
    are timed and the probes run on the servers."""
    budget = options.accuracy_budget
    if budget is None:
        return Held(imported, None)
    clock.lap("import and candidates")
    model = imported.model
    if model.reference is None:
        raise AccuracyBudgetError(NEEDS_REFERENCE)
    say(f"holding {model.name} at {model.precision} to accuracy budget {budget:g}: probing which units need float32")

    def job_for(float32_units) -> Job:
        variant = with_float32_units(model, float32_units, imported.original)
        graph = RelaxGraph.from_function(variant.mod["main"], variant.mod)
        # Nothing of a probe is kept: its job's folder is the run's scratch.
        job = Job(variant, graph, imported.target, pm, chosen, options.settings, folder.scratch, lambda message: None, False)
        job.remote = remote
        return job

    base = job_for(())
    reference = model.reference(base.inputs)

    def errors_of(variants) -> list[float]:
        placed = []
        for float32_units in variants:  # candidates are measured one variant at a time, then built at once
            job = base if not float32_units else job_for(float32_units)
            candidates = candidates_for(pm, job.graph, chosen, imported.target, model.precision)
            measurement = search_stage.measure(job, candidates, db)
            placed.append((float32_units, search_stage.op_level_search(job, candidates, measurement.costs)))
        builds = options.settings.parallel_builds()
        if len(placed) > 1:
            say(f"building {len(placed)} accuracy probes, {min(len(placed), builds)} at once")
        outputs = outputs_of_variants(base, imported.original, placed, builds)
        return [compare_outputs(o, reference, model.reference_name).max_rel_error for o in outputs]

    key = finish_key(
        base.end_to_end_key(None, "accuracy-budget"),
        {"budget": budget, "blocks": options.accuracy_blocks, "reference": model.reference_name},
        base.plugin_modules,
    )
    record = folder.path / FIT_FILE
    fitted = load_fit(record, key)
    if fitted is not None:
        say(f"the accuracy budget's probes of the run before in {folder.path} are reused (same model, budget, backends and code)")
    else:
        with open_costs(options.cost_db, options.remeasure_invalid, options.remeasure_held_up) as db:
            fitted = fit(len(units(model.mod)), budget, errors_of, options.accuracy_blocks, say)
        save_fit(record, key, fitted)
    say(fitted.describe())
    clock.lap("accuracy budget")
    return Held(attrs.evolve(imported, model=with_float32_units(model, fitted.float32_units, imported.original)), fitted)
