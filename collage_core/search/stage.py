"""The search stage: measure the op-level candidates, search the op-level placement, calibrate it end
to end, and evolve which op groups go to graph-level backends (the two-level search)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Sequence

import attrs

from collage_core.backends import BackendInfo, whole_model_builder
from collage_core.candidates.enumeration import candidates_for
from collage_core.errors import CollageError
from collage_core.measure.cost_db import open_costs
from collage_core.measure.job import Job, describe_cost
from collage_core.measure.measurement import NOISY_FACTOR, MeasurementReport, measure_candidates
from collage_core.measure.processor_wait import HELD_UP_SHARE
from collage_core.measure.progress import PhaseClock, ProgressBar
from collage_core.outputs.explain import counted
from collage_core.outputs.placement_file import SEARCH_BEST_FILE, Placement
from collage_core.records import GRAPH_LEVEL, OP_LEVEL, Partition
from collage_core.search.baselines import op_groups, searched_parts, single_backend_parts, without_each_backend
from collage_core.search.calibration import PREDICTED_LOSS_FACTOR, calibrate, signature
from collage_core.search.regions import merged_regions
from collage_core.search.two_level import TwoLevelResult, TwoLevelSettings, history_text, search_two_level

if TYPE_CHECKING:  # the options name the searches defined here
    from collage_core.options import OptimizeOptions

OP_LEVEL_SEARCH = "op-level"
TWO_LEVEL = "two-level"


@attrs.frozen
class Placed:
    """The run's placement (``parts``, and as a :class:`Placement`) and how it was found: with a search, the
    candidates and their measurement, the searches' seconds, the op-level placement and the two-level
    search's result (which a replay has none of)."""

    parts: list
    placement: Placement
    candidates: list = attrs.field(factory=list)
    measurement: Optional[MeasurementReport] = None
    search_s: float = 0.0
    op_level_parts: Optional[list] = None
    two_level: Optional[TwoLevelResult] = None


def search_kind(asked: Optional[str], chosen: Sequence[BackendInfo]) -> str:
    """The search asked for, or by default the two-level search when a graph-level backend is chosen."""
    return asked or (TWO_LEVEL if any(info.backend.kind == GRAPH_LEVEL for info in chosen) else OP_LEVEL_SEARCH)


def place(job: Job, options: "OptimizeOptions", search: str, clock: PhaseClock) -> Placed:
    """The placement file ``options.placement`` replayed, or else the candidates measured (costs kept in
    ``options.cost_db``), the op-level placement searched and calibrated, and with the two-level
    ``search`` the op groups placed on graph-level backends evolved."""
    if options.placement is not None:
        placement = job.replayed(options.placement)
        clock.lap("import and placement file")
        return Placed(list(placement.partitions), placement)
    candidates = candidates_for(job.pm, job.graph, job.chosen, job.target, job.imported.precision)
    with open_costs(options.cost_db, options.remeasure_invalid, options.remeasure_held_up) as db:
        job.say(f"{len(candidates)} candidates, {len({c.key for c in candidates})} distinct; cost database {db.path}")
        clock.lap("import and candidates")
        measurement = measure(job, candidates, db)
        clock.lap("measuring candidates")
        started = time.perf_counter()
        parts = op_level_search(job, candidates, measurement.costs)
        search_s = time.perf_counter() - started
        parts = op_level_parts = calibrated_op_level(
            job, parts, candidates, measurement.costs, db, options.calibration_rounds, options.compares_backends()
        )
        two_level = None
        if search == TWO_LEVEL:
            two_level = two_level_search(job, op_level_parts, candidates, db, options.two_level)
            parts = list(two_level.parts)
            search_s += two_level.seconds
        clock.lap("search and calibration")
    placement = job.placement(parts, search, candidates, measurement.costs)
    return Placed(parts, placement, candidates, measurement, search_s, op_level_parts, two_level)


def measure(job: Job, candidates, db) -> MeasurementReport:
    op_level = job.op_level_candidates(candidates)
    report = measure_candidates(
        job.graph, op_level, job.backends, job.target, db, job.settings, job.plugin_modules, job.disabled, job.show_progress, job.remote
    )
    job.say(f"measured {report.measured} in {report.seconds:.1f} s, {report.from_database} from the database, {report.invalid} invalid")
    if report.noisy:
        job.say(
            f"{len(report.noisy)} candidates' costs stayed noisy after a second measurement (spread above "
            f"{NOISY_FACTOR * job.settings.target_spread:.0%} of the median) and are used as measured: "
            f"{', '.join(report.noisy[:3])}{', ...' if len(report.noisy) > 3 else ''}"
        )
    if report.held_up:
        # Said, not warned: whether a timing is held up depends on the machine's load, and --strict fails on warnings.
        job.say(held_up_warning(len(report.held_up)))
    return report


def held_up_warning(count: int) -> str:
    """What a run says of ``count`` candidates' costs timed while other processes held their threads up."""
    costs = f"{count} candidates' costs were" if count != 1 else "1 candidate's cost was"
    return (
        f"{costs} timed while other processes kept the threads waiting for a processor (at least {HELD_UP_SHARE:.0%} "
        "of the time, twice) and may be too high; the placement uses them as measured: run again with "
        "--remeasure-held-up on a quieter machine to measure them again"
    )


def op_level_search(job: Job, candidates, costs) -> list[Partition]:
    op_level = job.op_level_candidates(candidates)
    if not op_level:
        raise CollageError("no op-level backend selected: one (such as tvm) must cover what graph-level backends do not")
    started = time.perf_counter()
    parts = searched_parts(job.graph, op_level, costs)
    job.say(f"op-level search: {len(parts)} partitions in {time.perf_counter() - started:.2f} s")
    return parts


def two_level_search(job: Job, op_level_parts, candidates, db, settings: TwoLevelSettings) -> TwoLevelResult:
    groups = op_groups(op_level_parts, candidates, job.backends)
    movable = sum(1 for g in groups if g.choices)
    job.say(f"two-level search: {len(groups)} op groups, {movable} of them can go to a graph-level backend")
    # Each placement is measured in a fresh worker: ONNX Runtime in a process where TVM kernels
    # (or other sessions) ran before measured 124 ms instead of 46 ms on ResNet-50.
    with ProgressBar(settings.generations, "two-level search", enabled=job.show_progress) as bar:
        evaluate = job.end_to_end_evaluator(db)

        def on_best(parts, cost):
            job.placement(parts, TWO_LEVEL).save(job.workdir / SEARCH_BEST_FILE)

        def on_generation(record):
            line = (
                f"generation {record.generation}: best {record.best_s * 1e3:.3f} ms "
                f"({record.gains_text() if record.generation else 'from the seeds'}), "
                f"budget left {max(record.budget_left_s, 0):.0f} s"
            )
            if record.generation:
                bar.advance(line)

        try:
            result = search_two_level(
                job.graph.graph,
                groups,
                evaluate,
                settings,
                on_generation,
                on_best,
                spent=lambda: evaluate.spent_s,
                prepare=evaluate.prepare,
            )
        finally:
            evaluate.discard_prebuilt()
    result = attrs.evolve(result, from_database=evaluate.from_database)
    job.say(
        f"two-level search: best {result.latency.seconds * 1e3:.3f} ms after {result.generations} generations, "
        f"{result.measured} placements scored end to end ({result.from_database} from the cost database, "
        f"{result.evaluated} evaluated), {result.predicted} predicted slower and not built, in {result.seconds:.1f} s"
    )
    if result.history:
        job.say(f"two-level search, operators by backend: {history_text(result.history)}")
    return result


def region_compilers(job: Job) -> list[str]:
    """The op-level backends of this run that compile adjacent partitions as one region (``Backend.compiles_regions``)."""
    return [info.name for info in job.chosen if info.backend.kind == OP_LEVEL and info.backend.compiles_regions]


def merge(job: Job, whole_measured_later: bool):
    """What calibration calls to merge a placement's adjacent partitions into regions; None when no backend compiles
    them. With ``whole_measured_later`` (the baselines are compared), one region of the whole model on the backend that
    builds whole models is left out: it is the unpartitioned build, which the baselines measure and the contest returns
    when it is faster."""
    backends = region_compilers(job)
    if not backends:
        return None
    builder = whole_model_builder(job.chosen)

    def merged(parts):
        regions = merged_regions(job.graph.graph, parts, backends)
        return parts if whole_measured_later and len(regions) == 1 and regions[0].backend == builder else regions

    return merged


def calibrated_op_level(job: Job, parts, candidates, costs, db, rounds: int, compared: bool = False) -> list[Partition]:
    """The op-level placement re-searched with per-partition charges measured end to end (see calibration);
    ``compared``: the baselines are measured after it."""
    if rounds <= 0:
        return parts
    job.say("calibrating the op-level search end to end")
    op_level = job.op_level_candidates(candidates)
    alternatives = [
        baseline
        for info in job.chosen
        if info.backend.kind == OP_LEVEL
        for baseline in [single_backend_parts(job.graph, op_level, costs, info.name, job.backends)]
        if baseline is not None
    ]
    alternatives += without_each_backend(job.graph, op_level, costs, parts)
    evaluate = job.end_to_end_evaluator(db)
    try:
        result = calibrate(
            job.graph.graph, op_level, costs, parts, evaluate, rounds, alternatives, prepare=evaluate.prepare, merge=merge(job, compared)
        )
    finally:
        evaluate.discard_prebuilt()
    for number, step in enumerate(result.rounds):
        job.say(
            f"  round {number}: {step.partitions} partitions, candidates sum to {step.summed_s * 1e3:.3f} ms, "
            f"end to end {describe_cost(step.latency)}: {step.charge_per_partition_s * 1e6:+.1f} us per partition "
            f"{'unexplained' if step.charge_per_partition_s >= 0 else 'over-counted'} by the candidates"
        )
    for name, guess in result.predicted:
        job.say(
            f"'{name}' not built: its candidates predict {guess * 1e3:.3f} ms end to end, over {PREDICTED_LOSS_FACTOR:g}x the best measured"
        )
    if result.merged is not None:
        count, latency = result.merged
        job.say(
            f"  with adjacent {'/'.join(region_compilers(job))} partitions merged: {counted(count, 'partition')}, end to end {describe_cost(latency)}"
        )
    if result.alternative:
        job.say(f"'{result.alternative}' measured fastest end to end ({describe_cost(result.latency)}): it is the placement")
    elif signature(result.parts) != signature(parts):
        job.say(f"calibrated op-level placement: {len(result.parts)} partitions, {describe_cost(result.latency)}")
    return list(result.parts)
