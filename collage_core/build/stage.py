"""The finishing stage: build the searched placement, measure the baselines beside it (each backend
alone, TVM's unpartitioned build, each engine's own session over the original model file, the
placement without CUDA graphs) and time the closest of them
in turns with it, so that what is returned is never slower than what was measured beside it; then
say why what is returned won, with the latency it was chosen by as the headline."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.backends import whole_model_builder
from collage_core.build.deploy import backend_needs, copy_library, runtime_libraries, write_runtime_file
from collage_core.errors import CollageError, reraise_interrupt
from collage_core.measure.cost_db import CostDatabaseError, open_costs
from collage_core.measure.in_turns import AFTER_PAUSE, WARM, time_in_turns
from collage_core.measure.job import (
    BASELINE_PROTOCOL,
    UNPARTITIONED,
    Job,
    claimed_end_to_end,
    describe_cost,
    made_for_another_version,
    placement_claim_lifetime_s,
)
from collage_core.measure.progress import PhaseClock
from collage_core.measure.timing import stopped, stopped_limit
from collage_core.measure.worker_client import StageTooSlow, WorkerFailure
from collage_core.model import original_model
from collage_core.model.accuracy_budget import Fit
from collage_core.model.precision import FP32, Tolerance, tolerance_for_outputs
from collage_core.model.verify import Verification, compare_outputs
from collage_core.options import OptimizeOptions
from collage_core.outputs.end_to_end import ONE_AFTER_ANOTHER, PLACEMENT, SEARCHED, WITHOUT_CUDA_GRAPHS, EndToEnd
from collage_core.outputs.output_folder import RunFolder
from collage_core.outputs.placement_file import BASELINE_PREFIX, Placement
from collage_core.outputs.result import SEARCHED_PLACEMENT_FILE
from collage_core.records import GRAPH_LEVEL, OP_LEVEL, Cost, Partition
from collage_core.search.baselines import (
    IN_TURNS,
    TURNS_MARGIN,
    baseline_file,
    closest_rivals,
    faster_baseline,
    op_groups,
    operators_by_backend,
    predicted_cost,
    single_backend_parts,
)
from collage_core.search.calibration import signature
from collage_core.search.regions import decode, whole_model_pattern
from collage_core.search.stage import Placed
from collage_core.search.two_level import seed_genomes


@attrs.frozen
class Built:
    """A placement built into a library: its partitioned module, its outputs on the job's inputs, its cost."""

    partitioned: Any
    outputs: list
    cost: Cost


@attrs.frozen
class Contest:
    """Latencies timed in turns by name (:class:`~collage_core.measure.in_turns.LibraryTurns`: warm, and after a
    pause); the index of the rival that beat the placement on the warm figure, and its build."""

    turns: dict
    winner: Optional[int] = None
    winner_build: Optional[Built] = None


@attrs.frozen
class Outcome:
    """What the finishing stage decided: the end-to-end rows (the returned placement's first, with the
    latency it was chosen by; then the others timed in turns; then those measured one after another),
    the baseline returned instead of the searched placement (``(EndToEnd, parts)`` and its build; None:
    the searched placement is returned) and why the returned placement won, in a sentence; ``chosen_by``, the
    latency a contest in turns decided by (None: none decided)."""

    rows: list
    why: str
    replacement: Optional[tuple] = None
    replacement_build: Optional[Built] = None
    chosen_by: Optional[str] = None


def baselines(
    job: Job, parts, placement_cost, candidates, measurement, op_level_parts, two_level_result, limit_s: Optional[float] = None, db=None
) -> list[tuple[EndToEnd, Optional[list[Partition]]]]:
    """The unpartitioned build, the op-level placement, each backend alone (or with a fallback) and each
    engine's own session over the original model file (:func:`own_sessions`), each with its partitions
    (the unpartitioned build as one partition of the whole model on the backend that builds whole models, TVM;
    None where no chosen backend does),
    so that whichever measures fastest can be returned.

    A baseline whose one run takes longer than ``limit_s`` is stopped; its cost is invalid
    and says so. With ``db``, baselines measured before are read from it, not measured again.
    """
    built: list[tuple[str, list]] = []
    if two_level_result is not None:
        built.append(("op-level placement", op_level_parts))
        groups = op_groups(op_level_parts, candidates, job.backends)
        for genome in seed_genomes(groups)[1:]:
            backend = next(g.choices[v - 1] for g, v in zip(groups, genome) if v)
            covers = all(v for g, v in zip(groups, genome))
            name = f"{backend} alone" if covers else f"{backend} + op-level placement for the rest"
            built.append((name, decode(job.graph.graph, groups, genome)))
    if measurement is not None:
        for info in job.chosen:
            if info.backend.kind != OP_LEVEL:
                continue
            baseline = single_backend_parts(job.graph, candidates, measurement.costs, info.name, job.backends)
            if baseline is not None:
                built.append(baseline)
    # TVM's unpartitioned build runs the kernels of TVM alone without partition boundaries: it
    # cannot win where TVM alone cannot.
    builder = whole_model_builder(job.chosen)
    alone = next((p for name, p in built if builder is not None and name == f"{builder} alone"), None)
    reference = op_level_parts or parts
    unpartitioned = predicted_cost(alone, reference, f"{builder} alone's") if alone is not None else None
    if unpartitioned is not None:
        job.say(f"{UNPARTITIONED}: {unpartitioned.reason}")
    whole = whole_model_build(job)
    whole_cost = unpartitioned or baseline_cost(job, UNPARTITIONED, whole, limit_s, db)
    if whole is not None and whole_cost.is_measured:  # its one partition costs what the whole measured
        whole = [attrs.evolve(whole[0], cost=whole_cost)]
    results = [(EndToEnd(UNPARTITIONED, whole_cost, {"relax.build": len(job.graph.graph)}, build=build_id(whole)), whole)]
    measured = {**job.measured_end_to_end, signature(parts): placement_cost}
    for name, baseline_parts in built:
        baseline_signature = signature(baseline_parts)
        if baseline_signature not in measured:
            cannot_win = predicted_cost(baseline_parts, reference)
            if cannot_win is not None:
                job.say(f"{name}: {cannot_win.reason}")
            measured[baseline_signature] = cannot_win or baseline_cost(job, name, baseline_parts, limit_s, db)
        entry = EndToEnd(name, measured[baseline_signature], operators_by_backend(baseline_parts), build=build_id(baseline_parts))
        results.append((entry, baseline_parts))
    return results + own_sessions(job, limit_s, db)


def own_sessions_wanted(model, chosen, options, replayed, pm) -> bool:
    """Whether a run of ``model`` (at its precision) over the ``chosen`` backends (BackendInfo) has engines' own
    sessions to measure as contenders (baselines compared, float32, a chosen backend whose plugin runs model files,
    ``collage_lower_whole_model``) or replays a placement that runs one: what a PyTorch module is exported to ONNX
    for (see collage_core.model.torch_onnx)."""
    if replayed is not None:
        return replayed.original_model is not None
    runs_files = {impl.plugin_name for impl in pm.hook.collage_lower_whole_model.get_hookimpls()}
    return options.compares_backends() and model.precision == FP32 and any(info.plugin in runs_files for info in chosen)


def own_sessions(job: Job, limit_s: Optional[float], db) -> list[tuple[EndToEnd, Optional[list[Partition]]]]:
    """Each engine whose plugin runs the original model file whole (``collage_lower_whole_model``), in its
    own session as its users run it, measured like the other baselines (see collage_core.model.original_model).
    None for a model that is not a file, nor at a precision other than fp32 (the file computes in float32):
    one line says so when a graph-level engine was selected."""
    imported, operators = job.imported, len(job.graph.graph)
    why_none = None
    if imported.precision != FP32:
        why_none = f"the original file computes in float32, and this run places the model at {imported.precision}"
    elif imported.original is None and imported.onnx_export is not None:
        return []  # a PyTorch module whose ONNX export failed (the run said why), or that no engine here runs
    elif imported.original is None:
        why_none = f"the model is {original_model.kind_of(imported)}, not a file they read (export it to ONNX and give Collage the file to have them)"
    if why_none is not None:
        if any(backend.kind == GRAPH_LEVEL for backend in job.backends.values()):
            job.say(f"no engine's own session over the original model is a contender: {why_none}")
        return []
    rows = []
    for name in job.backends:
        entry = original_model.contender_name(name)
        try:
            mod = job.own_session_module(name)
        except CollageError as error:
            reraise_interrupt(error)
            rows.append((EndToEnd(entry, Cost.invalid(str(error)), {name: operators}), None))
            continue
        if mod is None:
            continue
        parts = original_model.placement_parts(name, operators, imported.original)
        cost = baseline_cost(job, entry, parts, limit_s, db)
        if cost.is_measured:  # its one partition costs what the whole measured
            parts = [attrs.evolve(parts[0], cost=cost)]
        rows.append((EndToEnd(entry, cost, {name: operators}, build=build_id(parts)), parts))
    return rows


def whole_model_build(job: Job) -> Optional[list[Partition]]:
    """The unpartitioned build as a placement: one partition holding every operator, on the backend that builds
    whole models (TVM, which fuses and schedules it as it does the unpartitioned model: its fusion works within a
    function); None when no chosen backend does."""
    builder = whole_model_builder(job.chosen)
    if builder is None:
        return None
    nodes = tuple(range(len(job.graph.graph)))
    pattern = whole_model_pattern(builder)
    return [Partition(builder, pattern, nodes, pattern, Cost.unknown())]


def build_placement(job: Job, parts, library: Path) -> Built:
    """``parts`` built into ``library`` (with its runtime file beside it), run on the job's inputs and timed."""
    partitioned = job.partitioned(parts)
    outputs, cost = job.run_built(parts, library, mod=partitioned)
    used = {p.backend for p in parts}
    carried = runtime_libraries(job.pm, [backend for name, backend in job.backends.items() if name in used])
    write_runtime_file(library, backend_needs(job.backends.values(), used), carried)
    return Built(partitioned, outputs, cost)


def found_by(search: str, replayed_from=None, replayed_why: str = "") -> str:
    """Where the placement a run builds came from, the start of why it was returned: the search that
    found it, or the placement file replayed (with why that file's placement had been chosen)."""
    if replayed_from is None:
        return f"found by the {search} search"
    return f"replayed from {replayed_from}" + (f" (the file says why it was chosen: {replayed_why})" if replayed_why else "")


@attrs.frozen
class Finished:
    """What a run returns: its ``placement`` (with why it was chosen), that placement's build and
    verification, the end-to-end rows of the report, and the searched placement when a baseline won
    the contest and was returned instead."""

    placement: Placement
    parts: list
    built: Built
    verification: Optional[Verification]
    rows: list
    searched_placement: Optional[Placement] = None
    chosen_by: Optional[str] = None  # the latency a contest in turns decided by (None: none decided)


def build_and_compare(
    job: Job,
    placed: Placed,
    options: OptimizeOptions,
    search: str,
    replayed: Optional[Placement],
    library: Path,
    folder: RunFolder,
    fitted: Optional[Fit],
    clock: PhaseClock,
) -> Finished:
    """The placement built into ``library`` and verified; unless ``options`` say not to compare, the
    baselines measured (their placements saved in a kept folder), timed in turns with it and the
    fastest by a margin returned instead (never in a replay), and the placement measured without CUDA
    graphs too. Outputs are held to ``fitted``'s budget where the accuracy budget was fitted, else to
    the precision's tolerance."""
    parts, placement = placed.parts, placed.placement
    job.say("building the placement and measuring it end to end")
    built = build_placement(job, parts, library)
    verification = verified(job, built, options.verify, fitted)
    clock.lap("building and verifying")
    origin = found_by(search, options.placement, replayed.why_chosen if replayed is not None else "")
    other_version = made_for_another_version(replayed, job.imported) if replayed is not None else ""
    if other_version:  # warned of too, as the file was read
        origin += f"; {other_version}"
    searched_placement = None
    if not options.compares_backends():
        outcome = Outcome(
            [EndToEnd(PLACEMENT, built.cost, operators_by_backend(parts), build=build_id(parts))],
            origin if options.placement is not None else f"{origin}; not compared with baselines",
        )
    else:
        with _costs_for_baselines(options) as db:
            measured = baselines(
                job,
                parts,
                built.cost,
                placed.candidates,
                placed.measurement,
                placed.op_level_parts,
                placed.two_level,
                options.baseline_limit_s,
                db,
            )
        clock.lap("baselines")
        if folder.kept:
            for entry, baseline_parts in measured:
                if baseline_parts is not None:
                    job.placement(baseline_parts, f"{BASELINE_PREFIX}{entry.name}").save(baseline_file(folder.path, entry.name))
        # A replay returns the placement it was given, whatever ran faster beside it.
        outcome = finish(job, library, origin, parts, built, measured, may_replace=options.placement is None, latency=options.latency)
        clock.lap("contest in turns")
        if outcome.replacement is not None:
            # What ran faster beside it is the result, with the cost it was chosen by.
            entry, parts = outcome.replacement
            job.say(f"{entry.name} ran faster than the searched placement: it is the result")
            searched_placement = attrs.evolve(
                placement, why_chosen=f"{origin}; not returned: {entry.name} ran faster beside it (see placement.json)"
            )
            placement = job.placement(parts, search, placed.candidates, placed.measurement.costs if placed.measurement else None)
            built = outcome.replacement_build
            verification = verified(job, built, options.verify, fitted)
            clock.lap("building and verifying")
    rows = list(outcome.rows)
    placement = attrs.evolve(placement, why_chosen=outcome.why)
    job.say(f"why this placement: {outcome.why}")
    if options.compares_backends():
        with _costs_for_baselines(options) as db:
            plain = without_cuda_graphs(job, parts, options.baseline_limit_s, db)
        if plain is not None:
            rows.insert(next(i for i, row in enumerate(rows) if not row.timed_in_turns), plain)
            clock.lap("without CUDA graphs")
    if fitted is not None and verification is not None:
        placement = attrs.evolve(placement, accuracy_budget=fitted.budget, measured_error=verification.max_rel_error)
    return Finished(placement, parts, built, verification, rows, searched_placement, outcome.chosen_by)


def verified(job: Job, built: Built, verify: bool, fitted: Optional[Fit]) -> Optional[Verification]:
    """``built``'s outputs compared with the model's reference (None without verification or a reference):
    held to the accuracy budget ``fitted`` where there is one, else to the precision's tolerance."""
    model = job.imported
    if not verify or model.reference is None:
        return None
    expected = model.reference(job.inputs)
    held_to = tolerance_for_outputs(model.precision, expected) if fitted is None else Tolerance(rtol=fitted.budget, atol=0.0)
    verification = compare_outputs(built.outputs, expected, model.reference_name, rtol=held_to.rtol, atol=held_to.atol)
    job.say(verification.describe())
    return verification


def _costs_for_baselines(options: OptimizeOptions):
    """The cost database for the baselines; none when replaying a placement file (it reads no database):
    a replayed placement measures its baselines afresh."""
    if options.placement is not None:
        return contextlib.nullcontext()
    return open_costs(options.cost_db, options.remeasure_invalid, options.remeasure_held_up)


def finish(job: Job, library: Path, origin: str, parts, built: Built, baselines, may_replace: bool = True, latency: str = WARM) -> Outcome:
    """Time the placement (``parts``, built into ``library``) in turns with the closest of ``baselines``
    (``(EndToEnd, parts)`` pairs); with ``may_replace``, the fastest of them by TURNS_MARGIN, by the ``latency``
    in turns (warm or after a pause), is returned instead (its build replaces ``library``). Where none could be timed in turns, a baseline
    measured faster one after another by SWITCH_MARGIN is. ``origin`` says where the placement came
    from (:func:`found_by`)."""
    rivals = closest_rivals(baselines, parts, built.cost, job.settings)
    timed = contest(job, library, rivals, may_replace, latency) if rivals else None
    if timed is not None:
        return after_contest(origin, parts, built, baselines, rivals, timed, latency, may_replace)
    mix, sequential = operators_by_backend(parts), [entry for entry, _ in baselines]
    # Measured one after another, a baseline's latency is warm: it cannot decide by the latency after a pause.
    faster = faster_baseline(baselines, built.cost) if may_replace and latency == WARM else None
    if faster is None:
        measured = "no baseline measured faster one after another" if sequential else "no baseline was measured"
        if latency != WARM and sequential:
            measured = "none was timed after a pause, so none replaces it"
        placed = EndToEnd(PLACEMENT, built.cost, mix, build=build_id(parts))
        return Outcome([placed, *sequential], f"{origin}; {measured} (none timed in turns)")
    entry, rival_parts = faster
    rebuilt = build_placement(job, rival_parts, library)
    why = (
        f"{entry.name} measured faster one after another (none could be timed in turns): "
        f"{_ms(entry.cost)} against the searched placement's {_ms(built.cost)}, {_times(built.cost, entry.cost)}; "
        f"{_what_it_runs(rival_parts)}the searched placement ({origin}) is saved as {SEARCHED_PLACEMENT_FILE}"
    )
    rows = [
        EndToEnd(PLACEMENT, rebuilt.cost, operators_by_backend(rival_parts), build=build_id(rival_parts)),
        EndToEnd(SEARCHED, built.cost, mix, build=build_id(parts)),
        *sequential,
    ]
    return Outcome(rows, why, faster, rebuilt)


def after_contest(
    origin: str, parts, built: Built, baselines, rivals, timed: Contest, latency: str = WARM, may_replace: bool = True
) -> Outcome:
    """The rows and the why of a contest in turns between the placement (``parts``, its build ``built``)
    and ``rivals``, decided by ``latency``: the returned placement's row carries its latency in turns. Without
    ``may_replace`` (a replay) nothing could have replaced the placement, and the why says nothing of what would."""
    timed_turns, mix = timed.turns, operators_by_backend(parts)
    turns = {name: library.latency(latency) for name, library in timed_turns.items()}
    decided_by = "the contest in turns" if latency == WARM else "the contest in turns after a pause"
    in_turns = {
        entry.name: _in_turns_row(f"{entry.name}, {IN_TURNS}", timed_turns[entry.name], entry.operators_by_backend, entry_parts)
        for entry, entry_parts in rivals
    }
    sequential = [entry for entry, _ in baselines]
    fastest, _ = min(rivals, key=lambda pair: turns[pair[0].name].seconds)
    placed, best = turns[PLACEMENT], turns[fastest.name]
    if timed.winner is None:
        if best.seconds >= placed.seconds:
            why = f"{origin}; it won {decided_by}: {_ms(placed)} against {fastest.name}'s {_ms(best)}, {_times(best, placed)}"
        elif best.seconds >= placed.seconds * (1 - TURNS_MARGIN):
            why = (
                f"{origin}; kept: in {decided_by} {fastest.name} ran {_ms(best)} against its {_ms(placed)}, "
                f"within the {TURNS_MARGIN:.0%} a baseline must win by"
            )
        else:
            why = (
                f"{origin}; a replay returns its placement, though in {decided_by} {fastest.name} ran "
                f"{_ms(best)} against its {_ms(placed)}, {_times(placed, best)}"
            )
        why += _faster_after_a_pause(timed_turns, PLACEMENT, latency) if may_replace else ""
        rows = [
            _in_turns_row(PLACEMENT, timed_turns[PLACEMENT], mix, parts),
            *in_turns.values(),
            EndToEnd(f"{PLACEMENT}, {ONE_AFTER_ANOTHER}", built.cost, mix, build=build_id(parts)),
            *sequential,
        ]
        return Outcome(rows, why, chosen_by=latency)
    entry, rival_parts = rivals[timed.winner]
    rival_mix = operators_by_backend(rival_parts)
    why = (
        f"{entry.name} won {decided_by}: {_ms(turns[entry.name])} against the searched placement's "
        f"{_ms(placed)}, {_times(placed, turns[entry.name])}; {_what_it_runs(rival_parts)}the searched placement "
        f"({origin}) is saved as {SEARCHED_PLACEMENT_FILE}"
    ) + _faster_after_a_pause(timed_turns, entry.name, latency)
    rows = [
        _in_turns_row(PLACEMENT, timed_turns[entry.name], rival_mix, rival_parts),
        _in_turns_row(f"{SEARCHED}, {IN_TURNS}", timed_turns[PLACEMENT], mix, parts),
        *(row for name, row in in_turns.items() if name != entry.name),
        EndToEnd(f"{PLACEMENT}, {ONE_AFTER_ANOTHER}", timed.winner_build.cost, rival_mix, build=build_id(rival_parts)),
        EndToEnd(f"{SEARCHED}, {ONE_AFTER_ANOTHER}", built.cost, mix, build=build_id(parts)),
        *sequential,
    ]
    return Outcome(rows, why, (entry, rival_parts), timed.winner_build, chosen_by=latency)


def _faster_after_a_pause(timed_turns: dict, returned: str, latency: str) -> str:
    """Where the contest chose by the warm latency: a clause naming what ran faster than the ``returned`` library after
    a pause, by more than the contest's margin, and how to choose by that; else nothing."""
    if latency != WARM:
        return ""
    mine = timed_turns[returned].after_pause
    name, best = min(((n, t.after_pause) for n, t in timed_turns.items() if n != returned), key=lambda item: item[1].seconds)
    if best.seconds >= mine.seconds * (1 - TURNS_MARGIN):
        return ""
    shown = "the searched placement" if name == PLACEMENT else name
    return (
        f"; after a pause {shown} ran faster, {_ms(best)} against {_ms(mine)}: "
        f"`--latency {AFTER_PAUSE}` chooses by the latency after a pause"
    )


def _in_turns_row(name: str, library, mix, parts) -> EndToEnd:
    """A row timed in turns: its warm latency and its latency after a pause."""
    return EndToEnd(name, library.warm, mix, True, library.after_pause, library.paused_s, build_id(parts))


def build_id(parts, variant: str = "") -> str:
    """Which build a row measured: a digest of which backend runs which operators (and whether an engine runs the
    original file), and of ``variant`` (a build without CUDA graphs); "" when there are no parts."""
    if parts is None:
        return ""
    return hashlib.sha256(repr((signature(parts), variant)).encode()).hexdigest()[:16]


def _what_it_runs(parts) -> str:
    """For a returned engine's own session: what it runs, as the start of a clause; else nothing."""
    engine = original_model.engine_of(parts)
    return "" if engine is None else f"{original_model.what_it_runs(engine)}; "


def _ms(cost: Cost) -> str:
    return f"{cost.median_s * 1e3:.3f} ms"


def _times(slower: Cost, faster: Cost) -> str:
    """How many times faster ``faster`` ran: ``1.05x``."""
    return f"{slower.median_s / faster.median_s:.2f}x"


def contest(job: Job, library: Path, rivals, may_replace: bool = True, latency: str = WARM) -> Optional[Contest]:
    """The placement's ``library`` and a build of each rival (``(EndToEnd, parts)`` pairs) timed in
    turns (see :mod:`collage_core.measure.in_turns`); None if that failed. When the fastest rival by ``latency``
    (warm, back to back; or after a pause) beat the placement by TURNS_MARGIN and ``may_replace``, its build
    replaces ``library`` and is the contest's winner."""
    names = ", ".join(entry.name for entry, _ in rivals)
    job.say(f"timing the placement and {names} in turns")
    rivals_dir = job.scratch / "rivals"
    try:
        builds = []
        for index, (_, rival_parts) in enumerate(rivals):
            (rivals_dir / str(index)).mkdir(parents=True, exist_ok=True)
            builds.append(build_placement(job, rival_parts, rivals_dir / str(index) / library.name))
        inputs = rivals_dir / "inputs.npz"
        np.savez(inputs, *job.inputs)
        libraries = {PLACEMENT: library}
        libraries.update((entry.name, rivals_dir / str(i) / library.name) for i, (entry, _) in enumerate(rivals))
        remote = job.remote.request_for_every_backend() if job.remote is not None else None  # on one server
        target = tvm_compat.target_to_json(job.target)
        turns = time_in_turns(libraries, inputs, target, job.plugin_modules, job.disabled, remote=remote, latency=latency)
        job.say("  in turns, warm back to back: " + ", ".join(f"{name} {describe_cost(t.warm)}" for name, t in turns.items()))
        job.say(
            "  in turns, after a pause: "
            + ", ".join(f"{name} {describe_cost(t.after_pause)} ({t.paused_s:.1f} s idle)" for name, t in turns.items())
        )
        fastest = min(range(len(rivals)), key=lambda i: turns[rivals[i][0].name].latency(latency).seconds)
        placed = turns[PLACEMENT].latency(latency).seconds
        if not may_replace or turns[rivals[fastest][0].name].latency(latency).seconds >= placed * (1 - TURNS_MARGIN):
            return Contest(turns)
        won = rivals_dir / str(fastest) / library.name
        copy_library(won, library, move=True)
        return Contest(turns, fastest, builds[fastest])
    except (CollageError, WorkerFailure) as error:
        reraise_interrupt(error)
        job.say(f"  could not time them in turns: {error}")
        return None
    finally:
        shutil.rmtree(rivals_dir, ignore_errors=True)


def without_cuda_graphs(job: Job, parts, limit_s: Optional[float], db) -> Optional[EndToEnd]:
    """On a CUDA target whose placements replay CUDA graphs: ``parts`` built to launch each kernel
    on its own and measured, so that the report shows what the graphs gain; None elsewhere."""
    if not job.replays_cuda_graphs():
        return None
    cost = baseline_cost(job, WITHOUT_CUDA_GRAPHS, parts, limit_s, db, cuda_graphs=False)
    return EndToEnd(WITHOUT_CUDA_GRAPHS, cost, operators_by_backend(parts), build=build_id(parts, WITHOUT_CUDA_GRAPHS))


def baseline_cost(job: Job, name: str, parts, limit_s: Optional[float], db, cuda_graphs: Optional[bool] = None) -> Cost:
    """``parts`` (None: TVM's unpartitioned build) measured in full, or as measured before in ``db``.

    A stopped measurement is reused only under a limit no longer than the one it exceeded; one
    measured before and slower than ``limit_s`` is stopped without building it again.
    """
    key = job.end_to_end_key(parts, BASELINE_PROTOCOL, cuda_graphs)
    claim = None
    if db is not None:  # runs sharing the database measure each baseline once in all
        lifetime_s = placement_claim_lifetime_s(job.settings) + (limit_s or 0.0)
        claim = claimed_end_to_end(db, key, lifetime_s, job.say, name)
    known = None if claim is None else claim.cost
    if known is not None and limit_s is not None and known.seconds > limit_s and known.is_measured:
        job.say(f"{name}: stopped, it measured {describe_cost(known)} before (from the cost database)")
        return stopped(limit_s)
    if known is not None:
        exceeded = stopped_limit(known)
        if exceeded is None or (limit_s is not None and limit_s <= exceeded):
            job.say(f"{name}: {describe_cost(known)} (from the cost database)")
            return known
    job.say(f"building and measuring {name}")
    started = time.perf_counter()
    try:
        cost = job.run_built(parts, None, run_limit_s=limit_s, cuda_graphs=cuda_graphs)[1]
    except StageTooSlow as slow:
        job.say(f"  stopped: one run takes longer than {slow.limit_s:g} s")
        cost = stopped(slow.limit_s)
    except BaseException as error:
        if claim is not None and claim.granted:  # it lapses with this process anyway
            with contextlib.suppress(CostDatabaseError):
                db.release_end_to_end(key)
        reraise_interrupt(error)
        if isinstance(error, CollageError):
            return Cost.invalid(str(error))  # not kept: a crash may be the machine's, not the build's
        raise
    if db is not None:
        db.put_end_to_end(key, cost, effort_s=time.perf_counter() - started)
    return cost
