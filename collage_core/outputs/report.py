"""The result table a user reads after an optimization."""

from __future__ import annotations

from collage_core.measure.in_turns import WARM
from collage_core.measure.threads import ThreadSettings
from collage_core.measure.timing import STOPPED_PREFIX
from collage_core.model.layout import MODEL
from collage_core.model.precision import FP32
from collage_core.model.precision import describe as describe_precision
from collage_core.outputs.end_to_end import ONE_AFTER_ANOTHER, PLACEMENT, WITHOUT_CUDA_GRAPHS
from collage_core.outputs.flops import count_flops
from collage_core.outputs.peak import throughput
from collage_core.outputs.placement_file import described_search
from collage_core.search.baselines import IN_TURNS, PREDICTED_PREFIX
from collage_core.search.two_level import history_text

# A latency whose runs' interquartile range is over this fraction of its median is marked noisy, its
# spread not printed as a ± that could read as "anywhere from zero": on a busy 2-core machine one
# baseline measured 8.8 ms with its quartiles 23 ms apart.
NOISY_SPREAD = 0.5


def in_turns_heading(latency: str = WARM) -> str:
    """The heading of the rows timed in turns, naming the latency the contest chose by."""
    chosen_by = "the warm latencies, back to back" if latency == WARM else "the latencies after a pause"
    return f"timed in turns, side by side in one sitting (the choice was made on {chosen_by}; compare them only with each other):"


IN_TURNS_HEADING = in_turns_heading(WARM)
ONE_AFTER_ANOTHER_HEADING = (
    "measured one after another, each build alone in its own worker (the machine's speed "
    "drifts between them; compare them only with each other):"
)


def is_noisy(cost) -> bool:
    return cost.is_measured and cost.spread_s > NOISY_SPREAD * cost.median_s


def _ms(cost) -> str:
    # The threads' waits are summed: with several threads they may add up to more than the wall time.
    held_up = f" held up (its threads waited for a processor {cost.held_up_share:.0%} of its time, summed)" if cost.held_up else ""
    if is_noisy(cost):
        return f"{cost.median_s * 1e3:10.3f} ms noisy (quartiles {cost.spread_s * 1e3:.3f} ms apart){held_up}"
    if cost.is_measured:
        return f"{cost.median_s * 1e3:10.3f} ms ±{cost.spread_s * 1e3:.3f}{held_up}"
    if cost.reason.startswith((PREDICTED_PREFIX, STOPPED_PREFIX)):
        return cost.reason  # a baseline left unbuilt or stopped, not one that failed
    return f"invalid: {cost.reason}"


def shown_name(entry) -> str:
    """A row's name in its section, whose heading says how it was timed."""
    return entry.name.removesuffix(f", {IN_TURNS}").removesuffix(f", {ONE_AFTER_ANOTHER}")


def headline(entries) -> str:
    """The returned placement's latency and how it was timed: the line a user reads first."""
    placed = next((entry for entry in entries if entry.name == PLACEMENT), None)
    if placed is None:
        return ""
    rivals = sum(1 for entry in entries if entry.timed_in_turns) - 1
    if not placed.timed_in_turns:
        return f"latency: {_ms(placed.cost).strip()}, measured one after another"
    how = f"timed in turns with {rivals} rival build{'s' if rivals != 1 else ''}"
    if placed.after_pause is None:  # a row kept from before the runs after a pause were kept apart
        return f"latency: {_ms(placed.cost).strip()}, {how}"
    return f"latency: {_ms(placed.cost).strip()} warm, back to back, {how}; {_after_pause(placed).strip()}"


def _after_pause(entry) -> str:
    """A row's latency after a pause, with how long it had been idle: ``     2.345 ms after 1.2 s idle``."""
    return f"{_ms(entry.after_pause)} after {entry.paused_s:.1f} s idle"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """``header`` and ``rows`` as a plain-text table: columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(header, widths))]
    lines.append("  ".join("-" * width for width in widths))
    lines += ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _best_other_build(entry, entries):
    """The fastest measured latency of a different build timed the same way as ``entry`` (in turns, or one
    after the other), or None: a library is not compared with itself. Rows that say which build they measured
    are told apart by it (two builds of the same backend mix are compared); others by their mix of backends."""
    return min(
        (
            other.cost.median_s
            for other in entries
            if other is not entry
            and other.cost.is_measured
            and other.timed_in_turns == entry.timed_in_turns
            and not _same_build(other, entry)
        ),
        default=None,
    )


def _same_build(one, other) -> bool:
    if one.build and other.build:
        return one.build == other.build
    return one.operators_by_backend == other.operators_by_backend


def _same_build_as(entry, earlier) -> str:
    """`` (the placement's build)``, naming the first earlier row of a table that measured the same library
    (rows that say which build they measured), so that two latencies of one build are not read as two builds."""
    if not entry.build or not entry.cost.is_measured:
        return ""
    first = next((other for other in earlier if other.build == entry.build and other.cost.is_measured), None)
    return f" (the {shown_name(first)}'s build)" if first is not None else ""


def _end_to_end_table(entries) -> str:
    """One section's rows; rows timed after a pause too (in turns) have a column for it."""
    after_pause = any(entry.after_pause is not None for entry in entries)
    rows = []
    for index, entry in enumerate(entries):
        best_other = _best_other_build(entry, entries)
        ratio = f"{entry.cost.median_s / best_other:.3f}" if best_other and entry.cost.is_measured else "-"
        mix = ", ".join(f"{b} {n}" for b, n in sorted(entry.operators_by_backend.items()))
        paused = [_after_pause(entry) if entry.after_pause is not None else "-"] if after_pause else []
        rows.append([shown_name(entry) + _same_build_as(entry, entries[:index]), _ms(entry.cost), *paused, ratio, mix])
    latency = ["median latency, warm", "after a pause"] if after_pause else ["median latency"]
    return format_table(["end to end", *latency, "vs best other build", "operators"], rows)


def _end_to_end_sections(entries, latency: str = WARM) -> list[str]:
    """The rows timed in turns, then those measured one after another, each under a heading that says
    so (and which ``latency`` the contest chose by); with no contest in turns, the one table alone."""
    in_turns = [entry for entry in entries if entry.timed_in_turns]
    one_after_another = [entry for entry in entries if not entry.timed_in_turns]
    if not in_turns:
        return [_end_to_end_table(one_after_another)]
    sections = [in_turns_heading(latency), _end_to_end_table(in_turns)]
    if one_after_another:
        sections += ["", ONE_AFTER_ANOTHER_HEADING, _end_to_end_table(one_after_another)]
    return sections


def _measured_alone(entries):
    """The returned placement's row measured one after another (the headline's, when no contest ran)."""
    by_name = {entry.name: entry for entry in entries}
    return by_name.get(f"{PLACEMENT}, {ONE_AFTER_ANOTHER}") or by_name.get(PLACEMENT)


def _cuda_graphs_line(entries) -> str:
    """What replaying the placement as CUDA graphs gained, when it was also measured without them (both
    one after another)."""
    by_name = {entry.name: entry.cost for entry in entries}
    alone = _measured_alone(entries)
    with_graphs, without = alone.cost if alone is not None else None, by_name.get(WITHOUT_CUDA_GRAPHS)
    if with_graphs is None or without is None or not (with_graphs.is_measured and without.is_measured):
        return ""
    return (
        f"CUDA graphs: {with_graphs.median_s * 1e3:.3f} ms replayed as graphs, {without.median_s * 1e3:.3f} ms "
        f"launching kernel by kernel ({without.median_s / with_graphs.median_s:.2f}x)"
    )


def placement_throughput(optimized):
    """The FLOPs of one run of the model over the returned placement's latency (the headline's), against the
    device's peak at the placement's precision (collage_core.outputs.peak), or None when it has no measured latency."""
    placed = next((entry.cost for entry in optimized.end_to_end if entry.name == PLACEMENT), None)
    if placed is None or not placed.is_measured or placed.median_s <= 0:
        return None
    flops = count_flops(optimized.model.mod).flops
    placement = optimized.placement
    return throughput(flops, placed.median_s, placement.ran_on or placement.device, placement.precision) if flops else None


def render_report(optimized) -> str:
    """Per backend: operators, partitions and share of measured time; then end-to-end latencies."""
    placement = optimized.placement
    total = sum(p.cost.seconds for p in placement.partitions if p.cost.is_measured)
    per_backend: dict = {}
    for part in placement.partitions:
        ops, parts, seconds, regions = per_backend.get(part.backend, (0, 0, 0.0, 0))
        measured = part.cost.seconds if part.cost.is_measured else 0.0
        per_backend[part.backend] = (ops + len(part.nodes), parts + 1, seconds + measured, regions + (not part.cost.is_measured))
    rows = []
    for name, (ops, parts, seconds, regions) in sorted(per_backend.items()):
        if regions:  # graph-level regions: only their end-to-end effect is measured
            rows.append([name, str(ops), str(parts), "whole regions", "-"])
        else:
            rows.append([name, str(ops), str(parts), f"{seconds * 1e3:.3f} ms", f"{100 * seconds / total:.1f}%" if total else "-"])
    sections = [
        f"Model {optimized.model.name}: {len(placement.operators)} operators on {placement.ran_on or placement.device}, "
        f"{described_search(placement.search)}"
        + (f", convolutions in {placement.layout.upper()}" if placement.layout != MODEL else "")
        + (f" (placement measured on {placement.device})" if placement.ran_on else ""),
        *[line for line in (headline(optimized.end_to_end), why_line(placement)) if line],
        *[work.describe() for work in [placement_throughput(optimized)] if work is not None],
        format_table(["backend", "operators", "partitions", "summed cost", "share of op-level time"], rows),
    ]
    converted = describe_precision(placement.precision)
    if converted:
        sections.insert(1, converted + sixteen_bit_summary(placement, optimized.accuracy))
    alone = _measured_alone(optimized.end_to_end)
    placed = None if alone is None else alone.cost
    if total and placed is not None and placed.is_measured and all(p.cost.is_measured for p in placement.partitions):
        sections.append(
            f"the partitions' costs add up to {total * 1e3:.3f} ms; the placement measured "
            f"{placed.median_s * 1e3:.3f} ms end to end one after another, as they were "
            f"({100 * total / placed.median_s:.0f}% of it)"
        )
    sections.append("")
    sections += _end_to_end_sections(optimized.end_to_end, optimized.chosen_by or WARM)
    graphs_line = _cuda_graphs_line(optimized.end_to_end)
    if graphs_line:
        sections.append(graphs_line)
    if optimized.measurement is not None:
        m = optimized.measurement
        sections.append(
            f"\ncandidates: {optimized.candidates}; {m.distinct} distinct ones of op-level backends, costed one by one: "
            f"measured {m.measured} in {m.seconds:.1f} s, "
            f"{m.from_database} from the cost database, {m.invalid} invalid"
            + (f", {len(m.noisy)} noisy after two measurements" if m.noisy else "")
            + (f", {len(m.held_up)} held up (timed while other processes kept the processors busy; may be too high)" if m.held_up else "")
            + f"; search {optimized.search_s:.2f} s"
        )
    if optimized.threads != ThreadSettings.machine_defaults():
        waiting = ", ".join(f"{name}={value}" for name, value in optimized.threads.waiting)
        sections.append(
            f"threads: {optimized.threads.tvm} in TVM's pool, {optimized.threads.backends} in each backend's "
            f"pool, idle threads waiting by {waiting} (not this machine's defaults)"
        )
    if optimized.two_level is not None:
        t = optimized.two_level
        sections.append(
            f"two-level search: {t.generations} generations, {t.measured} placements scored end to end "
            f"({t.from_database} from the cost database, {t.evaluated} evaluated), {t.predicted} predicted slower "
            f"and not built, in {t.seconds:.1f} s"
        )
        if t.history:
            sections.append(f"  operators by backend, generation by generation: {history_text(t.history)}")
    if optimized.verification is not None:
        sections.append(optimized.verification.describe())
    if optimized.phases_s:
        spent = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in optimized.phases_s.items())
        sections.append(f"time: {spent}; {sum(optimized.phases_s.values()):.1f} s in all")
    return "\n".join(sections)


def why_line(placement) -> str:
    """Why the placement was returned (see collage_core.build.stage), when its file says."""
    return f"why this placement: {placement.why_chosen}" if placement.why_chosen else ""


def sixteen_bit_summary(placement, accuracy) -> str:
    """What ran at 16 bits: partitions and operators, and the units an accuracy budget kept in float32."""
    if not placement.sixteen_bit_operators:
        return ""
    at_sixteen = sum(1 for part in placement.partitions if placement.precision_of(part) != FP32)
    text = (
        f"\n{len(placement.sixteen_bit_operators)} of {len(placement.operators)} operators compute on 16-bit values, "
        f"in {at_sixteen} of {len(placement.partitions)} partitions; the others compute in float32"
    )
    if accuracy is not None:
        text += f"\n{accuracy.describe()}: units in float32 {list(accuracy.float32_units) or 'none'}"
    elif placement.float32_units:
        text += f"\nunits kept in float32 for an accuracy budget: {list(placement.float32_units)}"
    return text
