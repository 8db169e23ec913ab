"""The result table a user reads after an optimization."""

from __future__ import annotations

from collage_core.baselines import IN_TURNS, PREDICTED_PREFIX
from collage_core.precision import FP32
from collage_core.precision import describe as describe_precision
from collage_core.result import PLACEMENT, WITHOUT_CUDA_GRAPHS
from collage_core.timing import STOPPED_PREFIX
from collage_core.two_level import history_text


def _ms(cost) -> str:
    if cost.is_measured:
        return f"{cost.median_s * 1e3:10.3f} ms ±{cost.spread_s * 1e3:.3f}"
    if cost.reason.startswith((PREDICTED_PREFIX, STOPPED_PREFIX)):
        return cost.reason  # a baseline left unbuilt or stopped, not one that failed
    return f"invalid: {cost.reason}"


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(header, widths))]
    lines.append("  ".join("-" * width for width in widths))
    lines += ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def _best_other_build(entry, entries):
    """The fastest measured latency of a different build (another mix of backends) timed the same way
    as ``entry`` (in turns, or one after the other), or None: a library is not compared with itself."""
    in_turns = entry.name.endswith(IN_TURNS)
    return min(
        (other.cost.median_s for other in entries
         if other.cost.is_measured and other.name.endswith(IN_TURNS) == in_turns
         and other.operators_by_backend != entry.operators_by_backend),
        default=None,
    )


def _cuda_graphs_line(entries) -> str:
    """What replaying the placement as CUDA graphs gained, when it was also measured without them."""
    by_name = {entry.name: entry.cost for entry in entries}
    with_graphs, without = by_name.get(PLACEMENT), by_name.get(WITHOUT_CUDA_GRAPHS)
    if with_graphs is None or without is None or not (with_graphs.is_measured and without.is_measured):
        return ""
    return (f"CUDA graphs: {with_graphs.median_s * 1e3:.3f} ms replayed as graphs, {without.median_s * 1e3:.3f} ms "
            f"launching kernel by kernel ({without.median_s / with_graphs.median_s:.2f}x)")


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
        f"Model {placement.model_name}: {len(placement.operators)} operators on {placement.ran_on or placement.device}, "
        f"{placement.search} search" + (f" (placement measured on {placement.device})" if placement.ran_on else ""),
        format_table(["backend", "operators", "partitions", "summed cost", "share of op-level time"], rows),
    ]
    converted = describe_precision(placement.precision)
    if converted:
        sections.insert(1, converted + sixteen_bit_summary(placement, optimized.accuracy))
    placed = next((entry.cost for entry in optimized.end_to_end if entry.name == PLACEMENT), None)
    if total and placed is not None and placed.is_measured and all(p.cost.is_measured for p in placement.partitions):
        sections.append(f"the partitions' costs add up to {total * 1e3:.3f} ms; the placement measured "
                        f"{placed.median_s * 1e3:.3f} ms end to end ({100 * total / placed.median_s:.0f}% of it)")
    sections.append("")
    e2e_rows = []
    for entry in optimized.end_to_end:
        best_other = _best_other_build(entry, optimized.end_to_end)
        ratio = f"{entry.cost.median_s / best_other:.3f}" if best_other and entry.cost.is_measured else "-"
        mix = ", ".join(f"{b} {n}" for b, n in sorted(entry.operators_by_backend.items()))
        e2e_rows.append([entry.name, _ms(entry.cost), ratio, mix])
    sections.append(format_table(["end to end", "median latency", "vs best other build", "operators"], e2e_rows))
    graphs_line = _cuda_graphs_line(optimized.end_to_end)
    if graphs_line:
        sections.append(graphs_line)
    if optimized.measurement is not None:
        m = optimized.measurement
        sections.append(
            f"\ncandidates: {optimized.candidates} ({m.distinct} distinct); measured {m.measured} in {m.seconds:.1f} s, "
            f"{m.from_database} from the cost database, {m.invalid} invalid"
            + (f", {len(m.noisy)} noisy after two measurements" if m.noisy else "")
            + f"; search {optimized.search_s:.2f} s"
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


def sixteen_bit_summary(placement, accuracy) -> str:
    """What ran at 16 bits: partitions and operators, and the units an accuracy budget kept in float32."""
    if not placement.sixteen_bit_operators:
        return ""
    at_sixteen = sum(1 for part in placement.partitions if placement.precision_of(part) != FP32)
    text = (f"\n{len(placement.sixteen_bit_operators)} of {len(placement.operators)} operators compute on 16-bit values, "
            f"in {at_sixteen} of {len(placement.partitions)} partitions; the others compute in float32")
    if accuracy is not None:
        text += f"\n{accuracy.describe()}: units in float32 {list(accuracy.float32_units) or 'none'}"
    elif placement.float32_units:
        text += f"\nunits kept in float32 for an accuracy budget: {list(placement.float32_units)}"
    return text
