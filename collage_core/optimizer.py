"""The whole job: import, enumerate, measure, search, build, verify, compare, and keep the result."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.api_checks import EXAMPLE_INPUTS, refuse_unless_met, refuse_unwritable_output
from collage_core.backends import BackendInfo, contribute_patterns, discover_backends, select_backends, serves
from collage_core.build import stage as build_stage
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.errors import CollageError
from collage_core.measure.cost_db import CostDatabase, default_cost_db_path
from collage_core.measure.job import FINISHED_PROTOCOL, Job
from collage_core.measure.timing import DEFAULT_BASELINE_LIMIT_S, MeasureSettings
from collage_core.model.accuracy_budget import DEFAULT_BLOCKS, AccuracyBudgetError, Fit, fit, load_fit, save_fit
from collage_core.model.model_import import check_against_reference, load_model
from collage_core.model.precision import DTYPES, FP32, Tolerance, at_precision, check_precision, tolerance, with_float32_units
from collage_core.model.probes import outputs_of_variants
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.verify import Verification, compare_outputs
from collage_core.model.widening import units
from collage_core.options import OptimizeOptions, keyword_signature
from collage_core.outputs import output_folder
from collage_core.outputs.end_to_end import PLACEMENT, EndToEnd
from collage_core.outputs.placement_file import load_placement
from collage_core.outputs.result import OptimizedModel
from collage_core.outputs.reuse import FinishedBuild, FinishKey, code_digest, finish_key, load_finished, save_finished
from collage_core.plugins import get_plugin_manager
from collage_core.records import GRAPH_LEVEL, Candidate
from collage_core.search import stage as search_stage
from collage_core.search.baselines import baseline_file, operators_by_backend
from collage_core.search.calibration import DEFAULT_ROUNDS
from collage_core.search.stage import OP_LEVEL_SEARCH, TWO_LEVEL
from collage_core.search.two_level import TwoLevelSettings

log = logging.getLogger("collage")
FIT_FILE = "accuracy-budget.json"  # the accuracy budget's probes, reused by a rerun into the same directory


def optimize(model: Any, *, example_inputs: Optional[Sequence[Any]] = None, options: Optional[OptimizeOptions] = None,
             **chosen: Any) -> OptimizedModel:
    """Place ``model`` on the fastest mix of backends for a target, as ``options`` say (an
    :class:`OptimizeOptions`; default: every default), each option also given by its name, which wins
    over ``options``' (``optimize(model, target="cuda", backends=["tvm"])``).

    ``model`` is an ONNX path or ModelProto, a ``torch.nn.Module`` with ``example_inputs``, or a
    Relax IRModule. ``search`` is ``"op-level"`` or ``"two-level"`` (the default when a
    graph-level backend is selected). With ``placement`` (a placement file) nothing is searched:
    the file's placement is built, verified, measured end to end and returned. Measured costs are
    kept in ``cost_db`` (default: the user cache); with ``output_dir`` the best placement so far is
    saved there as the search goes. ``calibration_rounds`` re-searches of the op-level placement
    with per-partition charges measured end to end are tried (0: none; see
    :mod:`collage_core.search.calibration`). With ``compare_backends`` (default: when searching, not when
    replaying) each backend alone and TVM's unpartitioned build are measured too, and the closest
    of them timed in turns with the placement: the fastest by a margin is returned instead (never
    in a replay), and the searched placement is kept as ``searched-placement.json``. A baseline
    whose single run takes longer than ``baseline_limit_s`` is stopped and reported as such (None:
    no limit). With ``output_dir`` too, each baseline's placement is saved there (see
    :func:`baseline_file`). ``precision`` (fp32, bf16, fp16; see :mod:`collage_core.model.precision`;
    default fp32, or the placement file's) converts the model once before anything is placed; outputs
    are verified against the float32 reference within that precision's tolerance. With
    ``accuracy_budget`` (bf16 or fp16 only), units of the converted model go back to float32 until the
    placement's measured error (largest |out - ref| over largest |ref|) is within the budget, and the
    outputs are verified against the budget (see :mod:`collage_core.model.accuracy_budget`; ``accuracy_blocks``
    is how many blocks the units are probed in). With ``remeasure_invalid``, every candidate and placement
    whose stored cost is invalid (a build error, a crash, a hang) is measured again instead of read.

    Every option is checked before anything is read (:class:`collage_core.api_checks.ArgumentError`, one line
    naming it); :class:`OptimizeOptions`' fields say what each must be.
    """
    options = OptimizeOptions.given(options, chosen)
    refuse_unless_met("example_inputs", EXAMPLE_INPUTS, example_inputs)
    refuse_unwritable_output(options.output_dir)
    target, backends, placement, search, two_level = options.target, options.backends, options.placement, options.search, options.two_level
    cost_db, output_dir, settings, baseline_limit_s = options.cost_db, options.output_dir, options.settings, options.baseline_limit_s
    calibration_rounds, verify, show_progress, precision = options.calibration_rounds, options.verify, options.show_progress, options.precision
    accuracy_budget, accuracy_blocks, remeasure_invalid = options.accuracy_budget, options.accuracy_blocks, options.remeasure_invalid
    compare_backends = options.compares_backends()
    say = _Narrator(show_progress)
    clock = PhaseClock()
    workdir = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="collage-"))
    made_here = _first_missing(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # Held first, so that a second run into the folder stops before it imports anything.
    with _removed_on_failure(workdir, temporary=output_dir is None), output_folder.held(workdir, made_here) as scratch:
        original = load_model(model, example_inputs)
        if verify:  # a model whose outputs cannot be checked fails here, before anything is measured
            say(check_against_reference(original))
        target = tvm_compat.make_target(target)
        replayed = load_placement(placement) if placement is not None else None
        precision = _precision_wanted(precision, replayed, placement)
        check_precision(precision, target)
        imported = at_precision(original, precision)
        if replayed is not None:
            imported = with_float32_units(imported, replayed.float32_units, original)
        pm = get_plugin_manager()
        infos = discover_backends(pm)
        for failure in pm.failures:
            log.warning("plugin %s: %s", failure.name, failure.reason)
        chosen = [info for info in select_backends(infos, backends, target) if serves(info, target)]
        if not chosen:
            raise CollageError(f"none of the selected backends runs on target {target.kind.name}")
        search = search or (TWO_LEVEL if any(i.backend.kind == GRAPH_LEVEL for i in chosen) else OP_LEVEL_SEARCH)
        if search not in (OP_LEVEL_SEARCH, TWO_LEVEL):
            raise CollageError(f"unknown search {search!r} (choose {OP_LEVEL_SEARCH} or {TWO_LEVEL})")
        fitted = None
        if accuracy_budget is not None:
            clock.lap("import and candidates")
            _require_budget_applies(imported, placement, verify)
            say(f"holding {imported.name} at {imported.precision} to accuracy budget {accuracy_budget:g}: probing which units "
                f"need float32")
            fitted = _fit_budget(imported, original, accuracy_budget, accuracy_blocks, target, pm, chosen, settings, workdir,
                                 scratch, cost_db, say, remeasure_invalid)
            say(fitted.describe())
            imported = with_float32_units(imported, fitted.float32_units, original)
            clock.lap("accuracy budget")
        graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
        say(f"{imported.name}: {len(graph.graph)} operators; backends: {', '.join(i.name for i in chosen)}; target {target}")
        job = Job(imported, graph, target, pm, chosen, settings, workdir, say, show_progress, scratch)

        measurement, candidates, search_s, op_level_parts, two_level_result = None, [], 0.0, None, None
        if placement is not None:
            chosen_placement = job.replayed(placement)
            parts = list(chosen_placement.partitions)
            clock.lap("import and placement file")
        else:
            candidates = _all_candidates(pm, graph, chosen, target, imported.precision)
            with open_costs(cost_db, remeasure_invalid) as db:
                say(f"{len(candidates)} candidates, {len({c.key for c in candidates})} distinct; cost database {db.path}")
                clock.lap("import and candidates")
                measurement = search_stage.measure(job, candidates, db)
                clock.lap("measuring candidates")
                started = time.perf_counter()
                parts = op_level_parts = search_stage.op_level_search(job, candidates, measurement.costs)
                search_s = time.perf_counter() - started
                parts = op_level_parts = search_stage.calibrated_op_level(job, parts, candidates, measurement.costs, db, calibration_rounds)
                if search == TWO_LEVEL:
                    two_level_result = search_stage.two_level_search(job, op_level_parts, candidates, db, two_level)
                    parts = list(two_level_result.parts)
                    search_s += two_level_result.seconds
                clock.lap("search and calibration")
            chosen_placement = job.placement(parts, search, candidates, measurement.costs)

        library = output_folder.library_file(workdir, imported.name)
        if library.name != f"{imported.name}.so":
            say(f"the model's name {imported.name!r} is not a safe file name: its library is {library.name}")
        if output_dir:
            _say_what_is_overwritten(workdir, placement, say)
        finish = None
        if output_dir and placement is None:
            finish = FinishKey(
                model=imported.fingerprint, target=tvm_compat.target_to_json(target),
                backends={name: backend.version for name, backend in sorted(job.backends.items())},
                searched=job.end_to_end_key(parts, FINISHED_PROTOCOL),
                settings={"accuracy_budget": accuracy_budget, "compare_backends": compare_backends,
                          "baseline_limit_s": baseline_limit_s, "verify": verify, "reference": imported.reference_name,
                          "settings": attrs.evolve(settings, build_workers=0).to_json()},
                code=code_digest(job.plugin_modules),
            )
            kept = load_finished(workdir, library, finish)
            if kept.why_not:
                say(f"the run before in {workdir} is not reused: {kept.why_not}")
            previous = kept.finished
            if previous is not None:
                say(f"the run before in {workdir} ended from this same searched placement (same model, target, backends, "
                    f"settings and code): its library, verification and end-to-end measurements are reused")
                clock.lap("reusing the run before")
                optimized = OptimizedModel(
                    imported, previous.placement, library, target, previous.end_to_end, previous.verification, measurement,
                    len(candidates), search_s, job.partitioned(list(previous.placement.partitions)), two_level_result,
                    phases_s=clock.phases_s, accuracy=fitted, searched_placement=previous.searched_placement,
                )
                optimized.save(workdir)
                return optimized

        def verified(built: build_stage.Built) -> Optional[Verification]:
            if not verify or imported.reference is None:
                return None
            held_to = tolerance(imported.precision) if fitted is None else Tolerance(rtol=fitted.budget, atol=0.0)
            verification = compare_outputs(built.outputs, imported.reference(job.inputs), imported.reference_name,
                                           rtol=held_to.rtol, atol=held_to.atol)
            say(verification.describe())
            return verification

        say("building the placement and measuring it end to end")
        built = build_stage.build_placement(job, parts, library)
        verification = verified(built)
        clock.lap("building and verifying")
        origin = build_stage.found_by(search, placement, replayed.why_chosen if replayed is not None else "")
        searched_placement = None
        if not compare_backends:
            outcome = build_stage.Outcome([EndToEnd(PLACEMENT, built.cost, operators_by_backend(parts))],
                                           origin if placement is not None else f"{origin}; not compared with baselines")
        else:
            # A replayed placement measures its baselines afresh: replaying reads no cost database.
            with opened_again(cost_db, placement, remeasure_invalid) as db:
                baselines = build_stage.baselines(job, parts, built.cost, candidates, measurement, op_level_parts, two_level_result,
                                          baseline_limit_s, db)
            clock.lap("baselines")
            if output_dir:
                for entry, baseline_parts in baselines:
                    if baseline_parts is not None:
                        job.placement(baseline_parts, f"baseline: {entry.name}").save(baseline_file(output_dir, entry.name))
            # A replay returns the placement it was given, whatever ran faster beside it.
            outcome = build_stage.finish(job, library, origin, parts, built, baselines, may_replace=placement is None)
            clock.lap("contest in turns")
            if outcome.replacement is not None:
                # What ran faster beside it is the result, with the cost it was chosen by.
                entry, parts = outcome.replacement
                say(f"{entry.name} ran faster than the searched placement: it is the result")
                searched_placement = attrs.evolve(
                    chosen_placement, why_chosen=f"{origin}; not returned: {entry.name} ran faster beside it (see placement.json)")
                chosen_placement = job.placement(parts, search, candidates, measurement.costs if measurement else None)
                built = outcome.replacement_build
                verification = verified(built)
                clock.lap("building and verifying")
        results = list(outcome.rows)
        chosen_placement = attrs.evolve(chosen_placement, why_chosen=outcome.why)
        say(f"why this placement: {outcome.why}")
        if compare_backends:
            with opened_again(cost_db, placement, remeasure_invalid) as db:
                plain = build_stage.without_cuda_graphs(job, parts, baseline_limit_s, db)
            if plain is not None:
                results.insert(next(i for i, row in enumerate(results) if not row.timed_in_turns), plain)
                clock.lap("without CUDA graphs")
        if fitted is not None and verification is not None:
            chosen_placement = attrs.evolve(chosen_placement, accuracy_budget=fitted.budget,
                                            measured_error=verification.max_rel_error)
        optimized = OptimizedModel(
            imported, chosen_placement, library, target, results, verification, measurement, len(candidates), search_s,
            built.partitioned, two_level_result, phases_s=clock.phases_s, accuracy=fitted,
            searched_placement=searched_placement, replayed_from=None if placement is None else str(placement),
        )
        if output_dir:
            optimized.save(output_dir)
            if finish is not None:
                save_finished(workdir, library, FinishedBuild(finish, chosen_placement, results, verification, searched_placement))
        else:  # the library lives in a temporary folder as long as the result that runs it
            weakref.finalize(optimized, shutil.rmtree, str(workdir), True)
        return optimized


optimize.__signature__ = keyword_signature(optimize)


def _say_what_is_overwritten(workdir: Path, placement, say) -> None:
    """One line when this run writes over another kind of run's files in ``workdir``: a replay over a
    search's (or over another file's replay), a search over a replay's. A search over a search says
    whether it reuses it (see load_finished)."""
    try:
        before = json.loads((workdir / "results.json").read_text()).get("replayed_from")
    except (OSError, ValueError, AttributeError):
        return
    replaying = None if placement is None else str(placement)
    if before == replaying or (before is None and replaying is None):
        return
    kind = "searched run" if before is None else f"replay of {before}"
    say(f"overwriting the {kind} in {workdir} (its placement.json, report.txt, results.json and library)")


def _first_missing(folder: Path) -> Optional[Path]:
    """The outermost of ``folder`` and the folders above it that do not exist yet (None when it exists)."""
    missing = None
    while not folder.exists() and folder != folder.parent:
        missing, folder = folder, folder.parent
    return missing


@contextlib.contextmanager
def _removed_on_failure(folder: Path, temporary: bool):
    """If the run fails, the temporary folder a run without an output folder made is removed (the
    folders a run made for its given output are removed by ``output_folder.held``, while it holds them)."""
    try:
        yield
    except BaseException:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _precision_wanted(precision: Optional[str], replayed, placement) -> str:
    """The precision asked for; a replayed placement's own (``replayed``, read from the file ``placement``)
    unless the caller names the same one."""
    if replayed is None:
        return precision or FP32
    recorded = replayed.precision
    if precision is not None and precision != recorded:
        raise CollageError(f"{placement}: the placement was made at precision {recorded}, not {precision}; "
                           f"replay it at {recorded} (leave --precision out) or search again at {precision}")
    return recorded


def _require_budget_applies(imported, placement, verify: bool) -> None:
    if placement is not None:
        raise AccuracyBudgetError("--accuracy-budget searches; a placement file is replayed as it was made, "
                                  "with the units it kept in float32")
    if imported.precision not in DTYPES:
        raise AccuracyBudgetError(f"an accuracy budget needs --precision bf16 or fp16 (at {imported.precision} there is "
                                  f"nothing to give back)")
    if not verify or imported.reference is None:
        raise AccuracyBudgetError("an accuracy budget is held by measuring the outputs against the reference: it needs "
                                  "verification and a model with a reference (ONNX or PyTorch)")


def _fit_budget(imported, original, budget: float, blocks: int, target, pm, chosen, settings, workdir: Path,
                scratch: Path, cost_db, say, remeasure_invalid: bool = False) -> Fit:
    """Which units go back to float32: each probe places the model by the op-level search, builds it and
    measures its outputs' error against the reference (see collage_core.model.accuracy_budget). The fit is kept
    in ``workdir``; the probes' files go to ``scratch``."""
    def job_for(float32_units) -> Job:
        variant = with_float32_units(imported, float32_units, original)
        graph = RelaxGraph.from_function(variant.mod["main"], variant.mod)
        # Nothing of a probe is kept: its job's folder is the run's scratch.
        return Job(variant, graph, target, pm, chosen, settings, scratch, lambda message: None, False)

    base = job_for(())
    reference = imported.reference(base.inputs)

    def errors_of(variants) -> list[float]:
        placed = []
        for float32_units in variants:  # candidates are measured one variant at a time, then built at once
            job = base if not float32_units else job_for(float32_units)
            candidates = _all_candidates(pm, job.graph, chosen, target, imported.precision)
            measurement = search_stage.measure(job, candidates, db)
            placed.append((float32_units, search_stage.op_level_search(job, candidates, measurement.costs)))
        if len(placed) > 1:
            say(f"building {len(placed)} accuracy probes, {min(len(placed), settings.parallel_builds())} at once")
        outputs = outputs_of_variants(base, original, placed, settings.parallel_builds())
        return [compare_outputs(o, reference, imported.reference_name).max_rel_error for o in outputs]

    key = finish_key(base.end_to_end_key(None, "accuracy-budget"),
                     {"budget": budget, "blocks": blocks, "reference": imported.reference_name}, base.plugin_modules)
    record = workdir / FIT_FILE
    previous = load_fit(record, key)
    if previous is not None:
        say(f"the accuracy budget's probes of the run before in {workdir} are reused (same model, budget, backends and code)")
        return previous
    with open_costs(cost_db, remeasure_invalid) as db:
        fitted = fit(len(units(imported.mod)), budget, errors_of, blocks, say)
    save_fit(record, key, fitted)
    return fitted


def open_costs(cost_db, remeasure_invalid: bool = False) -> CostDatabase:
    """The cost database ``cost_db`` (default: the user cache's); with ``remeasure_invalid``, the invalid
    costs stored before it is opened are not read, so they are measured again."""
    return CostDatabase.open(Path(cost_db) if cost_db else default_cost_db_path(), remeasure_invalid=remeasure_invalid)


def opened_again(cost_db, placement, remeasure_invalid: bool = False):
    """The cost database for the baselines; none when replaying a placement file (it reads no database)."""
    if placement is not None:
        return contextlib.nullcontext()
    return open_costs(cost_db, remeasure_invalid)


class PhaseClock:
    """Seconds spent in each phase of a run, in order (a phase lapped twice adds up)."""

    def __init__(self):
        self.phases_s: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases_s[phase] = self.phases_s.get(phase, 0.0) + now - self.last
        self.last = now


class _Narrator:
    """Says what the job is doing on stderr, each line after the minutes and seconds since it started."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            minutes, seconds = divmod(int(time.perf_counter() - self.started), 60)
            print(f"[{minutes:02d}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def _all_candidates(pm, graph: RelaxGraph, chosen: Sequence[BackendInfo], target, precision: str) -> list[Candidate]:
    patterns = [pattern for info in chosen for pattern in contribute_patterns(pm, info.backend, target, precision)]
    return enumerate_candidates(graph, patterns)
