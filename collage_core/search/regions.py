"""Turning a genome (a backend choice per op group) into partitions: adjacent groups on one graph-level backend merge;
and merging a placement's adjacent partitions on a backend that compiles regions (:func:`merged_regions`)."""

from __future__ import annotations

import heapq
from typing import Collection, Sequence

import attrs

from collage_core.model.original_model import runs_original
from collage_core.records import Cost, Partition
from collage_core.search.graph import OpGraph

KEEP = 0


@attrs.frozen
class OpGroup:
    """An op-level partition the two-level search may hand to a graph-level backend.

    ``choices`` lists the graph-level backends that support every operator of the group; gene
    value ``i`` (1-based) means ``choices[i - 1]``, and 0 keeps the op-level partition.
    """

    partition: Partition
    choices: tuple[str, ...]


def region_pattern(backend: str) -> str:
    return f"{backend}.region"


def whole_model_pattern(backend: str) -> str:
    """The pattern of the one partition of every operator that is ``backend``'s unpartitioned build (TVM's:
    ``tvm.whole_model``; see ``build.stage.whole_model_build``)."""
    return f"{backend}.whole_model"


def decode(graph: OpGraph, groups: Sequence[OpGroup], genome: Sequence[int]) -> list[Partition]:
    """Partitions for ``genome``: groups kept as they are, and merged regions per graph-level backend.

    Groups are visited in execution order. A group placed on a graph-level backend joins the
    regions of that backend it reads from, one by one, whenever the union stays convex and all
    partitions can still run in some order (so Q, K and V branches meet in their consumer's
    region); otherwise it starts a region of its own. Deterministic for a given genome.
    """
    parts: list[_Part] = []
    owner: dict[int, int] = {}
    for group, gene in zip(groups, genome):
        nodes = set(group.partition.nodes)
        if gene == KEEP:
            _place(parts, owner, _Part(group.partition.backend, nodes, group.partition))
            continue
        backend = group.choices[gene - 1]
        home = None
        readable = sorted({owner[p] for n in nodes for p in graph.preds[n] if p in owner})
        for index in readable:
            region = parts[index]
            if region.backend != backend or region.kept is not None or region.merged_into is not None:
                continue
            grown = nodes | region.nodes if home is None else parts[home].nodes | region.nodes
            if graph.is_convex(frozenset(grown)) and _runs_in_order(graph, parts, owner, grown):
                if home is None:
                    region.nodes |= nodes
                    for node in nodes:
                        owner[node] = index
                    home = index
                else:
                    parts[home].nodes |= region.nodes
                    for node in region.nodes:
                        owner[node] = home
                    region.merged_into = home
        if home is None:
            _place(parts, owner, _Part(backend, nodes, None))
    return [part.partition() for part in parts if part.merged_into is None]


@attrs.define
class _Part:
    backend: str
    nodes: set
    kept: Partition | None
    merged_into: int | None = None

    def partition(self) -> Partition:
        if self.kept is not None:
            return self.kept
        pattern = region_pattern(self.backend)
        return Partition(self.backend, pattern, self.nodes, f"{pattern}:{min(self.nodes)}", Cost.unknown())


def _place(parts, owner, part) -> None:
    for node in part.nodes:
        owner[node] = len(parts)
    parts.append(part)


def _runs_in_order(graph: OpGraph, parts, owner, grown: set) -> bool:
    """Whether making ``grown`` one part keeps the graph of parts free of cycles."""
    part_of = {node: ("grown" if node in grown else owner[node]) for node in owner}
    for node in grown:
        part_of[node] = "grown"
    edges: dict = {}
    for node, part in part_of.items():
        for pred in graph.preds[node]:
            if pred in part_of and part_of[pred] != part:
                edges.setdefault(part_of[pred], set()).add(part)
    indegree = {part: 0 for part in set(part_of.values())}
    for targets in edges.values():
        for target in targets:
            indegree[target] += 1
    ready = [part for part, degree in indegree.items() if degree == 0]
    seen = 0
    while ready:
        part = ready.pop()
        seen += 1
        for target in edges.get(part, ()):
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    return seen == len(indegree)


def merged_regions(graph: OpGraph, parts: Sequence[Partition], backends: Collection[str]) -> list[Partition]:
    """``parts`` with each backend of ``backends`` given its adjacent partitions as regions, merged as
    :func:`decode` merges a graph-level backend's groups (a region stays convex and every partition can still
    run in some order). A partition that joins no other stays as it is, candidate and measured cost; a region
    of several is a ``"<backend>.region"`` partition costed at its partitions' summed costs, as they measured alone
    (what the searches and predictions after calibration read; the placement's latency is measured end to end)."""
    ordered = execution_order(graph, parts)
    groups = [OpGroup(part, (part.backend,)) for part in ordered]
    genome = [1 if part.backend in backends and not runs_original(part) else KEEP for part in ordered]
    as_placed = {part.nodes: part for part in ordered}
    return [as_placed.get(part.nodes) or attrs.evolve(part, cost=_summed(ordered, part.nodes)) for part in decode(graph, groups, genome)]


def _summed(parts: Sequence[Partition], nodes) -> Cost:
    """The summed cost of the partitions of ``parts`` inside ``nodes``; unknown unless each was measured."""
    nodes = set(nodes)
    inside = [p.cost for p in parts if nodes.issuperset(p.nodes)]
    if not inside or not all(cost.is_measured for cost in inside):
        return Cost.unknown()
    return Cost.measured(sum(c.median_s for c in inside), sum(c.spread_s for c in inside), min(c.repeats for c in inside))


def execution_order(graph: OpGraph, parts: Sequence[Partition]) -> list[Partition]:
    """``parts`` in an order they can run in: each after those it reads from (ties: the lower first operator)."""
    owner = {node: index for index, part in enumerate(parts) for node in part.nodes}
    readers: list[set[int]] = [set() for _ in parts]
    waiting = [0] * len(parts)
    for index, part in enumerate(parts):
        for source in {owner[p] for n in part.nodes for p in graph.preds[n] if p in owner} - {index}:
            readers[source].add(index)
            waiting[index] += 1
    ready = [(min(part.nodes), index) for index, part in enumerate(parts) if waiting[index] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(parts[index])
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (min(parts[reader].nodes), reader))
    if len(order) != len(parts):
        raise ValueError("the partitions read from each other in a cycle")
    return order


def genome_key(parts: Sequence[Partition]) -> str:
    """A stable description of a decoded placement: equal placements, equal keys."""
    return ";".join(f"{p.backend}:{','.join(map(str, p.nodes))}" for p in sorted(parts, key=lambda p: p.nodes))
