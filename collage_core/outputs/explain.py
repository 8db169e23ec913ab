"""Why each partition of a placement was chosen: its measured cost against the candidates it beat.

The search minimises the whole placement, not each partition: the cheapest candidate touching a
partition's operators may reach into operators that are better covered otherwise, and calibration
charges every partition for its hand-off, which favours fewer, larger partitions. So each partition
is compared with the cheapest other cover of exactly its operators, and cheaper candidates that
reach beyond them are named.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from typing import Optional, Sequence

from collage_core.model.precision import FP32
from collage_core.outputs.placement_file import Placement, described_search
from collage_core.outputs.report import format_table
from collage_core.records import INVALID, MEASURED, Partition
from collage_core.search.regions import region_pattern

# The costliest partitions are worth a look: the five most expensive, and any with a large share.
TOP_COUNT = 5
TOP_SHARE = 0.05
# Beyond this many operators a partition is summarised by operator kind instead of listed.
LISTED_OPERATORS = 8
# Candidates listed per partition; a graph-level region touches hundreds.
LISTED_CANDIDATES = 15
# Rivals named in one "why" line.
NAMED_RIVALS = 3


def counted(number: int, noun: str) -> str:
    """``1 partition``, ``2 partitions``."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def short_op_name(op: str) -> str:
    """``relax.nn.conv2d`` -> ``conv2d``."""
    return op.rsplit(".", 1)[-1]


def operator_ids(nodes: Sequence[int]) -> str:
    """Sorted operator ids as runs: ``0-2, 5, 7-9``."""
    runs: list[list[int]] = []
    for node in sorted(nodes):
        if runs and node == runs[-1][1] + 1:
            runs[-1][1] = node
        else:
            runs.append([node, node])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def describe_operators(nodes: Sequence[int], operators: Sequence[str]) -> str:
    if len(nodes) <= LISTED_OPERATORS:
        return ", ".join(f"{node} {short_op_name(operators[node])}" for node in nodes)
    kinds = Counter(short_op_name(operators[node]) for node in nodes)
    return f"{len(nodes)} operators ({operator_ids(nodes)}): " + ", ".join(f"{n} {op}" for op, n in kinds.most_common())


def describe_cost(part: Partition) -> str:
    cost = part.cost
    if cost.kind == MEASURED:
        return f"{cost.median_s * 1e3:.3f} ms"
    if cost.kind == INVALID:
        # A build error's reason can run to a whole log; its first line says what went wrong.
        reason = cost.reason.strip()
        return f"invalid: {reason.splitlines()[0] if reason else 'no reason recorded'}"
    return "measured end to end only"


def partitions_in_operator_order(placement: Placement) -> list[Partition]:
    return sorted(placement.partitions, key=lambda part: part.nodes[0])


def measured_total_s(placement: Placement) -> float:
    return sum(part.cost.median_s for part in placement.partitions if part.cost.is_measured)


def most_expensive(placement: Placement) -> list[Partition]:
    """The partitions worth a look, costliest first: the top ``TOP_COUNT`` and any over ``TOP_SHARE`` of the total."""
    measured = sorted((part for part in placement.partitions if part.cost.is_measured), key=lambda p: (-p.cost.median_s, p.nodes[0]))
    total = measured_total_s(placement)
    return [part for rank, part in enumerate(measured) if rank < TOP_COUNT or part.cost.median_s > TOP_SHARE * total]


def explain(placement: Placement) -> str:
    """A summary, then one block per partition in operator order."""
    numbers = {part: number for number, part in enumerate(partitions_in_operator_order(placement), start=1)}
    blocks = [summarise(placement, numbers)]
    top = {part: rank for rank, part in enumerate(most_expensive(placement), start=1)}
    for part, number in numbers.items():
        blocks.append(explain_partition(placement, part, number, top.get(part)))
    return "\n\n".join(blocks)


def summarise(placement: Placement, numbers: dict) -> str:
    total = measured_total_s(placement)
    by_backend: dict[str, list[Partition]] = defaultdict(list)
    for part in placement.partitions:
        by_backend[part.backend].append(part)
    rows = []
    for backend, parts in sorted(by_backend.items()):
        operators = sum(len(part.nodes) for part in parts)
        if all(part.cost.is_measured for part in parts):
            seconds = sum(part.cost.median_s for part in parts)
            cost, share = f"{seconds * 1e3:.3f} ms", f"{100 * seconds / total:.1f}%" if total else "-"
        else:
            cost, share = "measured end to end only", "-"
        rows.append([backend, str(len(parts)), str(operators), cost, share])
    top_rows = [
        [
            str(rank),
            f"#{numbers[part]}",
            part.backend,
            part.pattern,
            operator_ids(part.nodes),
            describe_cost(part),
            f"{100 * part.cost.median_s / total:.1f}%",
        ]
        for rank, part in enumerate(most_expensive(placement), start=1)
    ]
    heading = [
        f"{placement.model_name}: {counted(len(placement.operators), 'operator')} in "
        f"{counted(len(placement.partitions), 'partition')}, "
        f"{described_search(placement.search)} on {placement.device}",
        *([f"why this placement: {placement.why_chosen}"] if placement.why_chosen else []),
    ]
    if placement.precision != FP32:
        heading += ["", precision_line(placement)]
    lines = [*heading, "", *_table(["backend", "partitions", "operators", "summed cost", "share"], rows)]
    if top_rows:
        lines += [
            "",
            f"Most expensive partitions (top {TOP_COUNT}, and any over {TOP_SHARE:.0%} of the summed cost):",
            *_table(["top", "partition", "backend", "pattern", "operators", "cost", "share"], top_rows),
        ]
    return "\n".join(lines)


def precision_line(placement: Placement) -> str:
    at_sixteen = sum(1 for part in placement.partitions if placement.precision_of(part) != FP32)
    line = (
        f"precision {placement.precision}: {at_sixteen} of {counted(len(placement.partitions), 'partition')} compute on "
        f"16-bit values (marked [{placement.precision}] below), the others in float32"
    )
    if placement.float32_units:
        line += f"; units kept in float32 for the accuracy budget: {list(placement.float32_units)}"
    if placement.accuracy_budget is not None:
        error = "not measured" if placement.measured_error is None else f"{placement.measured_error:.3g}"
        line += f"; accuracy budget {placement.accuracy_budget:g}, measured error {error}"
    return line


def _table(header: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    return [indent + line.rstrip() for line in format_table(header, rows).splitlines()]


def explain_partition(placement: Placement, part: Partition, number: int, rank: Optional[int] = None) -> str:
    heading = f"#{number} {part.backend} {part.pattern}: {describe_cost(part)}" + (f" (top {rank})" if rank else "")
    if placement.precision != FP32:
        heading += f" [{placement.precision_of(part)}]"
    lines = [heading, f"  operators: {describe_operators(part.nodes, placement.operators)}"]
    if not placement.considered:
        lines.append("  no candidates recorded in this placement file; re-run collage optimize to see the alternatives")
        return "\n".join(lines)
    rivals = overlapping(placement.considered, part)
    listed = sorted([part, *rivals], key=_cheapest_first)
    # The chosen one is always shown, even behind many cheaper ones.
    shown = listed[:LISTED_CANDIDATES] if part in listed[:LISTED_CANDIDATES] else [*listed[: LISTED_CANDIDATES - 1], part]
    rows = [
        [
            "chosen" if candidate == part else "",
            candidate.backend,
            candidate.pattern,
            operator_ids(candidate.nodes),
            describe_cost(candidate),
        ]
        for candidate in shown
    ]
    lines.append("  candidates touching these operators, cheapest first:")
    lines += _table(["", "backend", "pattern", "operators", "cost"], rows, indent="    ")
    if len(listed) > len(shown):
        lines.append(f"    ... and {len(listed) - len(shown)} more")
    lines += ["  " + line for line in why(part, rivals, placement.why_chosen)]
    return "\n".join(lines)


def overlapping(considered: Sequence[Partition], part: Partition) -> list[Partition]:
    """Every considered candidate sharing an operator with ``part``, except ``part`` itself."""
    nodes = set(part.nodes)
    same = (part.backend, part.pattern, part.nodes)
    return [c for c in considered if nodes.intersection(c.nodes) and (c.backend, c.pattern, c.nodes) != same]


def _cheapest_first(part: Partition) -> tuple:
    order = {MEASURED: 0, INVALID: 2}.get(part.cost.kind, 1)
    return (order, part.cost.seconds, part.nodes, part.backend, part.pattern)


def why(part: Partition, rivals: Sequence[Partition], placement_why: str = "") -> list[str]:
    """Why ``part`` won against ``rivals``, the candidates touching its operators: one line, or two or three.
    A graph-level region won with its whole placement: ``placement_why`` says how, when the file says."""
    if part.cost.is_measured and part.pattern == region_pattern(part.backend):
        return [
            f"why: {part.backend}'s partitions merged into one region, which {part.backend} compiles as one function: "
            "calibration measured the placement faster end to end with them merged (its cost is theirs, summed as measured alone)"
        ]
    if not part.cost.is_measured:
        if placement_why:
            return ["why: a graph-level region, measured end to end only: it came with the whole placement (see why this placement, above)"]
        return [
            "why: a graph-level region, measured end to end only: the two-level search kept it because the "
            "whole placement measured faster with it"
        ]
    inside = [c for c in rivals if set(c.nodes) <= set(part.nodes)]
    cover = cheapest_cover(part.nodes, inside)
    mine = part.cost.median_s
    if cover is None:
        lines = [f"why: the only measured cover of these operators: {mine * 1e3:.3f} ms"]
    elif cover[0] >= mine:
        lines = [f"why: cheapest cover of these operators: {mine * 1e3:.3f} ms vs {_describe_cover(cover)}"]
    else:
        lines = [
            f"why: not the cheapest cover of these operators in isolation: {_describe_cover(cover)} vs {mine * 1e3:.3f} ms;",
            "     chosen for the whole placement: calibration charges every partition its hand-off time "
            "(or the cheaper pieces cannot run in order)",
        ]
    beyond = [c for c in rivals if c not in inside and c.cost.is_measured and c.cost.median_s < mine]
    if beyond:
        named = ", ".join(
            f"{c.pattern} {c.cost.median_s * 1e3:.3f} ms ({operator_ids(c.nodes)})"
            for c in sorted(beyond, key=_cheapest_first)[:NAMED_RIVALS]
        )
        more = f" and {len(beyond) - NAMED_RIVALS} more" if len(beyond) > NAMED_RIVALS else ""
        lines.append(f"     cheaper candidates reach into other partitions; the search minimises the whole placement: {named}{more}")
    return lines


def _describe_cover(cover: tuple[float, tuple[Partition, ...]]) -> str:
    seconds, pieces = cover
    return f"{' + '.join(piece.pattern for piece in pieces)} {seconds * 1e3:.3f} ms"


def cheapest_cover(nodes: Sequence[int], pieces: Sequence[Partition]) -> Optional[tuple[float, tuple[Partition, ...]]]:
    """The least summed measured cost of covering exactly ``nodes`` with ``pieces`` inside them, or None if none do."""
    starting_at: dict[int, list[Partition]] = defaultdict(list)
    for piece in pieces:
        if piece.cost.is_measured:
            starting_at[piece.nodes[0]].append(piece)

    # Each step covers the lowest uncovered operator, so each cover is found once.
    @functools.cache
    def best(uncovered: frozenset) -> Optional[tuple[float, tuple[Partition, ...]]]:
        if not uncovered:
            return 0.0, ()
        options = []
        for piece in starting_at[min(uncovered)]:
            if uncovered.issuperset(piece.nodes):
                rest = best(uncovered.difference(piece.nodes))
                if rest is not None:
                    options.append((piece.cost.median_s + rest[0], (piece, *rest[1])))
        return min(options, key=lambda option: option[0], default=None)

    return best(frozenset(nodes))
