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
therefore follows one canonical order per placement, the lowest-first order (see
:func:`_steps_in_lowest_first_order`), which visits few interleavings and loses no placement.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterator, Mapping, Optional, Sequence

import attrs

from collage_core.errors import CollageError
from collage_core.graph import OpGraph
from collage_core.records import Candidate, Cost

PROGRESS_EVERY = 1000


class NoPlacementError(CollageError):
    """The candidates cannot cover every operator exactly once in an executable order."""


@attrs.frozen
class _Step:
    """A usable candidate as bitmasks over operator indices."""

    candidate: Candidate
    seconds: float
    nodes: int
    lowest: int
    outside_preds: int
    outside_succs: tuple[int, ...]

    def is_ready(self, covered: int) -> bool:
        return self.nodes & covered == 0 and self.outside_preds & ~covered == 0


@attrs.frozen
class _StepIndex:
    """The usable steps, found by their lowest operator and by each operator they contain."""

    pred_masks: tuple[int, ...]
    by_lowest: tuple[tuple[_Step, ...], ...]
    containing: tuple[tuple[_Step, ...], ...]

    @classmethod
    def from_steps(cls, graph: OpGraph, steps: Sequence[_Step]) -> "_StepIndex":
        by_lowest = [[] for _ in graph.ops]
        containing = [[] for _ in graph.ops]
        for step in steps:
            by_lowest[step.lowest].append(step)
            for node in _bits(step.nodes):
                containing[node].append(step)
        return cls(
            pred_masks=tuple(_mask(preds) for preds in graph.preds),
            by_lowest=tuple(map(tuple, by_lowest)),
            containing=tuple(map(tuple, containing)),
        )


def search_op_level(
    graph: OpGraph,
    candidates: Sequence[Candidate],
    costs: Mapping[str, Cost],
    on_progress: Optional[Callable[[int], None]] = None,
) -> tuple[Candidate, ...]:
    """Return the cheapest executable exact cover of ``graph`` by ``candidates``, in execution order.

    Candidates whose cost is missing, invalid or unknown are never chosen. Ties are broken the
    same way whatever the order of ``candidates``. ``on_progress`` receives the number of
    search states expanded so far, every ``PROGRESS_EVERY`` states and once more at the end. Raises
    :class:`NoPlacementError` when no such cover exists.
    """
    steps = _usable_steps(graph, candidates, costs)
    _raise_for_uncovered_operator(graph, steps)
    index = _StepIndex.from_steps(graph, steps)
    everything = (1 << len(graph)) - 1
    sources = _mask(node for node, preds in enumerate(index.pred_masks) if preds == 0)

    best_seconds = {0: 0.0}
    came_from: dict[int, tuple[int, _Step]] = {}
    # Ties in seconds pop the smaller covered set first; every input to the order is canonical.
    queue = [(0.0, 0, sources)]
    expanded = 0
    furthest_uncovered = 0
    placement = None
    while queue:
        seconds, covered, ready = heapq.heappop(queue)
        if seconds > best_seconds[covered]:
            continue
        if covered == everything:
            placement = _path_to(covered, came_from)
            break
        expanded += 1
        if on_progress is not None and expanded % PROGRESS_EVERY == 0:
            on_progress(expanded)
        furthest_uncovered = max(furthest_uncovered, _lowest_bit(ready))
        for step in _steps_in_lowest_first_order(index, covered, ready):
            after = covered | step.nodes
            after_seconds = seconds + step.seconds
            if after_seconds < best_seconds.get(after, math.inf):
                best_seconds[after] = after_seconds
                came_from[after] = (covered, step)
                heapq.heappush(queue, (after_seconds, after, _ready_after(index, ready, after, step)))
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
                seconds=cost.seconds,
                nodes=nodes,
                lowest=min(candidate.nodes),
                outside_preds=_mask(p for n in candidate.nodes for p in graph.preds[n]) & ~nodes,
                outside_succs=tuple(sorted({s for n in candidate.nodes for s in graph.succs[n]} - candidate.nodes)),
            )
        )
    return steps


def _raise_for_uncovered_operator(graph: OpGraph, steps: Sequence[_Step]) -> None:
    coverable = 0
    for step in steps:
        coverable |= step.nodes
    uncovered = ~coverable & ((1 << len(graph)) - 1)
    if uncovered:
        node = _lowest_bit(uncovered)
        raise NoPlacementError(f"no valid candidate covers operator {node} ({graph.ops[node]})")


def _steps_in_lowest_first_order(index: _StepIndex, covered: int, ready: int) -> Iterator[_Step]:
    """The steps from ``covered`` that keep to the lowest-first order of some placement.

    ``ready`` holds the uncovered operators whose predecessors are all covered. Order the parts
    of a placement lowest-first: each time, place the part with the lowest operator among the
    parts that are ready. That is an execution order, and a unique one. When it places part C,
    every ready operator r below min(C) lies in a part that is not ready yet (a ready one would
    have a lowest operator <= r and go first): a usable candidate that contains r, is disjoint
    from ``covered`` and C, and still waits on an uncovered operator. A step without such a
    witness for every lower ready operator is in no placement's lowest-first order, so skipping
    it keeps the optimum. (Requiring C to contain the lowest ready operator is not enough: that
    operator's part may wait on a part that must go first.)
    """
    witnesses_below: list[list[int]] = []
    for node in _bits(ready):
        for step in index.by_lowest[node]:
            if step.is_ready(covered) and all(
                any(witness & step.nodes == 0 for witness in witnesses) for witnesses in witnesses_below
            ):
                yield step
        witnesses = [s.nodes for s in index.containing[node] if s.nodes & covered == 0 and not s.is_ready(covered)]
        if not witnesses:
            return
        witnesses_below.append(witnesses)


def _ready_after(index: _StepIndex, ready: int, after: int, step: _Step) -> int:
    """The ready operators once ``step`` is covered too (``after`` includes it)."""
    ready &= ~step.nodes
    for succ in step.outside_succs:
        if index.pred_masks[succ] & ~after == 0:
            ready |= 1 << succ
    return ready


def _path_to(covered: int, came_from: Mapping[int, tuple[int, _Step]]) -> tuple[Candidate, ...]:
    path = []
    while covered:
        covered, step = came_from[covered]
        path.append(step.candidate)
    return tuple(reversed(path))


def _mask(nodes) -> int:
    mask = 0
    for node in nodes:
        mask |= 1 << node
    return mask


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1
