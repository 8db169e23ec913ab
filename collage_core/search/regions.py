"""Turning a genome (a backend choice per op group) into partitions: adjacent groups on one graph-level backend merge."""

from __future__ import annotations

from typing import Sequence

import attrs

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


def genome_key(parts: Sequence[Partition]) -> str:
    """A stable description of a decoded placement: equal placements, equal keys."""
    return ";".join(f"{p.backend}:{','.join(map(str, p.nodes))}" for p in sorted(parts, key=lambda p: p.nodes))
