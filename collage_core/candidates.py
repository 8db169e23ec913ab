"""Every match of every backend's patterns over the model graph, overlapping ones included."""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from tvm import relax
from tvm.relax import dpl

from collage_core import tvm_compat
from collage_core.records import Candidate, Pattern, PatternMatch
from collage_core.relax_graph import RegionError, RelaxGraph

log = logging.getLogger("collage")


def enumerate_candidates(graph: RelaxGraph, patterns: Sequence[Pattern]) -> list[Candidate]:
    """All (backend, pattern, operators) matches that pass their checks and can be cut out as a function.

    The same operators matched by two patterns of one backend stay two candidates: a backend may
    lower them differently. The list is sorted, so the result does not depend on pattern order.
    """
    var2val = relax.analysis.get_var2val(graph.func)
    node_of_call = {graph.call(node): node for node in range(len(graph.graph))}
    found: dict[tuple, Candidate] = {}
    for pattern in patterns:
        for root in range(len(graph.graph)):
            nodes, calls, matched = _match(pattern, graph.call(root), var2val, node_of_call)
            if nodes is None or root not in nodes or (pattern.backend, pattern.name, nodes) in found:
                continue
            if not graph.graph.is_convex(nodes):
                continue
            try:
                region = graph.region(nodes)
            except RegionError:
                continue
            if pattern.check is not None:
                bound_vars = tuple(graph.bindings[graph.op_bindings[node]].var for node in sorted(nodes))
                if not _check(pattern, PatternMatch(pattern, calls, matched, bound_vars, region.outputs)):
                    continue
            try:
                standalone = graph.standalone_module(nodes)
            except RegionError:
                continue
            key = tvm_compat.structural_key(standalone)
            found[(pattern.backend, pattern.name, nodes)] = Candidate(pattern.backend, pattern.name, nodes, f"{pattern.name}:{key}")
    return sorted(found.values(), key=lambda candidate: candidate.sort_key)


def _match(pattern: Pattern, call, var2val, node_of_call):
    if not pattern.dpl.match(call, var2val):
        return None, (), {}
    matched = pattern.dpl.extract_matched_expr(call, var2val) or {}
    # A wildcard stands for an input of the group, even when that input is another operator.
    grouped = [expr for pat, expr in matched.items() if not isinstance(pat, dpl.WildcardPattern)] + [call]
    calls = tuple(sorted({node_of_call[e]: e for e in grouped if e in node_of_call}.items()))
    return frozenset(node for node, _ in calls), tuple(expr for _, expr in calls), dict(matched)


def _check(pattern: Pattern, match: PatternMatch) -> bool:
    try:
        return bool(pattern.check(match))
    except Exception as error:  # a check that breaks refuses the match; it must not end the run
        log.warning("pattern %s: check raised %s: %s; match refused", pattern.name, type(error).__name__, error)
        return False


def distinct_keys(candidates: Iterable[Candidate]) -> list[str]:
    return sorted({candidate.key for candidate in candidates})
