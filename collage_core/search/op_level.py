"""Op-level search: the cheapest executable placement of every operator on measured candidates.

A placement is a set of candidates that covers each operator exactly once and whose parts can
run one after another: no part waits, directly or through other parts, on itself. Among those,
the search returns one with the least sum of measured seconds.

It is a uniform-cost (Dijkstra) search over the sets of operators covered so far, each held as
an int bitmask. Every such set is closed under predecessors, and a step adds one candidate
whose outside predecessors are all covered already, so any path from nothing to everything is
an executable placement in execution order, and every executable placement is such a path.

Without pruning, independent operators (weight transforms, parallel branches) can be covered in
any interleaving, and the number of covered sets grows exponentially with them. The search
therefore follows one canonical order per placement, the demand order (see
:func:`_steps_in_demand_order`), which visits few interleavings and loses no placement.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterator, Mapping, Optional, Sequence

import attrs

from collage_core.errors import CollageError, last_line
from collage_core.records import Candidate, Cost
from collage_core.search.graph import OpGraph

PROGRESS_EVERY = 1000


class NoPlacementError(CollageError):
    """The candidates cannot cover every operator exactly once in an executable order."""


@attrs.frozen
class _Step:
    """A usable candidate as bitmasks over operator indices; ``rank`` is its canonical position."""

    candidate: Candidate
    rank: int
    seconds: float
    nodes: int
    outside_preds: int
    outside_ancestors: int

    def is_ready(self, covered: int) -> bool:
        return self.outside_preds & ~covered == 0


def search_op_level(
    graph: OpGraph, candidates: Sequence[Candidate], costs: Mapping[str, Cost], on_progress: Optional[Callable[[int], None]] = None
) -> tuple[Candidate, ...]:
    """Return the cheapest executable exact cover of ``graph`` by ``candidates``, in execution order.

    Candidates whose cost is missing, invalid or unknown are never chosen. Ties are broken the
    same way whatever the order of ``candidates``. ``on_progress`` receives the number of
    search states expanded so far, every ``PROGRESS_EVERY`` states and once more at the end.
    Raises :class:`NoPlacementError` when no such cover exists.
    """
    steps = _usable_steps(graph, candidates, costs)
    _raise_for_uncovered_operator(graph, steps, candidates, costs)
    containing = _steps_by_operator(graph, steps)
    everything = (1 << len(graph)) - 1

    best_seconds = {0: 0.0}
    came_from: dict[int, tuple[int, _Step]] = {}
    # Ties in seconds pop the smaller covered set first; every input to the order is canonical.
    queue = [(0.0, 0)]
    expanded = 0
    furthest_uncovered = 0
    placement = None
    while queue:
        seconds, covered = heapq.heappop(queue)
        if seconds > best_seconds[covered]:
            continue
        if covered == everything:
            placement = _path_to(covered, came_from)
            break
        expanded += 1
        if on_progress is not None and expanded % PROGRESS_EVERY == 0:
            on_progress(expanded)
        furthest_uncovered = max(furthest_uncovered, _lowest_bit(~covered))
        for step in _steps_in_demand_order(containing, covered):
            after = covered | step.nodes
            after_seconds = seconds + step.seconds
            if after_seconds < best_seconds.get(after, math.inf):
                best_seconds[after] = after_seconds
                came_from[after] = (covered, step)
                heapq.heappush(queue, (after_seconds, after))
    if on_progress is not None:
        on_progress(expanded)
    if placement is None:
        raise NoPlacementError(
            "the valid candidates cannot be put in an executable order that covers every operator "
            f"exactly once; none gets past operator {furthest_uncovered} ({graph.ops[furthest_uncovered]})"
        )
    return placement


def _usable_steps(graph: OpGraph, candidates: Sequence[Candidate], costs: Mapping[str, Cost]) -> list[_Step]:
    """The candidates that can be chosen, deduplicated and in a canonical order."""
    ancestors = _ancestor_masks(graph)
    steps = []
    for candidate in sorted(set(candidates), key=lambda c: (c.sort_key, c.key)):
        if not candidate.nodes or min(candidate.nodes) < 0 or max(candidate.nodes) >= len(graph):
            raise ValueError(f"candidate {candidate.key} names operators outside the graph")
        cost = costs.get(candidate.key)
        if cost is None or not math.isfinite(cost.seconds):
            continue
        if cost.seconds < 0:
            raise ValueError(f"candidate {candidate.key} has a negative cost, which the search cannot order")
        # A group that a path leaves and re-enters would wait on itself: it can never be placed.
        if not graph.is_convex(candidate.nodes):
            continue
        nodes = _mask(candidate.nodes)
        steps.append(
            _Step(
                candidate=candidate,
                rank=len(steps),
                seconds=cost.seconds,
                nodes=nodes,
                outside_preds=_mask(p for n in candidate.nodes for p in graph.preds[n]) & ~nodes,
                outside_ancestors=_union(ancestors[n] for n in candidate.nodes) & ~nodes,
            )
        )
    return steps


def _raise_for_uncovered_operator(
    graph: OpGraph, steps: Sequence[_Step], candidates: Sequence[Candidate], costs: Mapping[str, Cost]
) -> None:
    """One line naming the first operator no usable candidate covers and why: no candidate covers it, or those that
    do are invalid (the first reason given: a build error, a crash), unmeasured or cannot be placed."""
    uncovered = ~_union(step.nodes for step in steps) & ((1 << len(graph)) - 1)
    if not uncovered:
        return
    node = _lowest_bit(uncovered)
    covering = sorted({c for c in candidates if node in c.nodes}, key=lambda c: (c.sort_key, c.key))
    reasons = [f"{c.key}: {last_line(costs[c.key].reason).strip()}" for c in covering if c.key in costs and costs[c.key].reason]
    why = (
        "no candidate covers it"
        if not covering
        else f"none of the {len(covering)} candidates covering it can be placed (invalid, unmeasured or not convex)"
        + (f"; {reasons[0]}" if reasons else "")
    )
    raise NoPlacementError(f"no valid candidate covers operator {node} ({graph.ops[node]}): {why}")


def _steps_by_operator(graph: OpGraph, steps: Sequence[_Step]) -> tuple[tuple[_Step, ...], ...]:
    containing = [[] for _ in graph.ops]
    for step in steps:
        for node in _bits(step.nodes):
            containing[node].append(step)
    return tuple(map(tuple, containing))


def _steps_in_demand_order(containing: Sequence[Sequence[_Step]], covered: int) -> Iterator[_Step]:
    """The steps from ``covered`` that can be next in the demand order of some placement.

    Demand order places, each time, the part holding the lowest uncovered operator; while that
    part waits on uncovered operators, it places first the part holding the lowest of them, and
    so on back. The lowest uncovered ancestor of a convex part is always ready, and a part never
    demands itself again when the placement is executable, so this is an execution order of
    every placement. Its next part therefore contains a *demanded* operator: the lowest
    uncovered one, or the lowest uncovered ancestor of a waiting candidate that contains a
    demanded operator. Steps that contain none are in no placement's demand order, and skipping
    them keeps the optimum. (Requiring every step to contain the lowest uncovered operator is
    not enough: that operator's part may wait on a part that must go first.)
    """
    demanded = [_lowest_bit(~covered)]
    seen_demanded = set(demanded)
    yielded = set()
    for node in demanded:
        for step in containing[node]:
            if step.nodes & covered:
                continue
            if step.is_ready(covered):
                if step.rank not in yielded:
                    yielded.add(step.rank)
                    yield step
                continue
            waited_on = _lowest_bit(step.outside_ancestors & ~covered)
            if waited_on not in seen_demanded:
                seen_demanded.add(waited_on)
                demanded.append(waited_on)


def _ancestor_masks(graph: OpGraph) -> list[int]:
    ancestors = []
    for preds in graph.preds:
        ancestors.append(_union(ancestors[p] | 1 << p for p in preds))
    return ancestors


def _path_to(covered: int, came_from: Mapping[int, tuple[int, _Step]]) -> tuple[Candidate, ...]:
    path = []
    while covered:
        covered, step = came_from[covered]
        path.append(step.candidate)
    return tuple(reversed(path))


def _mask(nodes) -> int:
    return _union(1 << node for node in nodes)


def _union(masks) -> int:
    union = 0
    for mask in masks:
        union |= mask
    return union


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1
