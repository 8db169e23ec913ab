"""The operator graph the search works on: operators in topological order and their data edges."""

from __future__ import annotations

import functools

import attrs


@attrs.frozen
class OpGraph:
    """Operators of a model's dataflow block, in binding order (a topological order).

    ``preds[i]`` holds the operators whose results operator ``i`` reads, directly or through
    glue bindings (tuples, tuple items) that are not operators themselves.
    """

    ops: tuple[str, ...] = attrs.field(converter=tuple)
    preds: tuple[frozenset[int], ...] = attrs.field(converter=lambda ps: tuple(frozenset(p) for p in ps))

    def __attrs_post_init__(self):
        if len(self.ops) != len(self.preds):
            raise ValueError("OpGraph: ops and preds differ in length")
        for node, preds in enumerate(self.preds):
            if any(not 0 <= p < node for p in preds):
                raise ValueError(f"OpGraph: operator {node} reads an operator that is not before it")

    def __len__(self) -> int:
        return len(self.ops)

    @functools.cached_property
    def succs(self) -> tuple[frozenset[int], ...]:
        succs = [set() for _ in self.ops]
        for node, preds in enumerate(self.preds):
            for pred in preds:
                succs[pred].add(node)
        return tuple(frozenset(s) for s in succs)

    def is_convex(self, nodes: frozenset[int]) -> bool:
        """True if no path leaves ``nodes`` and comes back into them (the group can be one function)."""
        last = max(nodes)
        frontier = [s for n in nodes for s in self.succs[n] if s not in nodes and s < last]
        seen = set(frontier)
        while frontier:
            node = frontier.pop()
            for succ in self.succs[node]:
                if succ in nodes:
                    return False
                if succ < last and succ not in seen:
                    seen.add(succ)
                    frontier.append(succ)
        return True
