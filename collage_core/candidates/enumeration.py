"""Every match of every backend's patterns over the model graph, overlapping ones included."""

from __future__ import annotations

import logging
from typing import Iterable, Optional, Sequence

import attrs
from tvm import relax
from tvm.relax import dpl

from collage_core import tvm_compat
from collage_core.backends import BackendInfo, contribute_patterns
from collage_core.errors import reraise_interrupt
from collage_core.model.relax_graph import RegionError, RelaxGraph
from collage_core.records import Candidate, Pattern, PatternMatch, PatternRefused

log = logging.getLogger("collage")


@attrs.frozen
class Refusal:
    """A match a pattern's check refused: the operators, and why (``broken``: the check itself raised)."""

    pattern: str
    nodes: frozenset
    reason: str
    broken: bool = False


def candidates_for(pm, graph: RelaxGraph, chosen: Sequence[BackendInfo], target, precision: str) -> list[Candidate]:
    """Every candidate of the ``chosen`` backends' patterns for ``target`` at ``precision`` over ``graph``."""
    patterns = [pattern for info in chosen for pattern in contribute_patterns(pm, info.backend, target, precision)]
    return enumerate_candidates(graph, patterns)


def enumerate_candidates(graph: RelaxGraph, patterns: Sequence[Pattern], refusals: Optional[list] = None) -> list[Candidate]:
    """All (backend, pattern, operators) matches that pass their checks and can be cut out as a function.

    The same operators matched by two patterns of one backend stay two candidates: a backend may
    lower them differently. The list is sorted, so the result does not depend on pattern order.
    Each match a check refuses is appended to ``refusals`` (when given) as a :class:`Refusal`.
    """
    var2val = relax.analysis.get_var2val(graph.func)
    node_of_call = {graph.call(node): node for node in range(len(graph.graph))}
    found: dict[tuple, Candidate] = {}
    kept: list[Refusal] = []
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
                items = {
                    graph.bindings[index].var: graph.bindings[index].value
                    for index in region.bindings
                    if isinstance(graph.bindings[index].value, relax.TupleGetItem)
                }
                refused = _check(pattern, PatternMatch(pattern, calls, matched, bound_vars, region.outputs, items), nodes)
                if refused is not None:
                    kept.append(refused)
                    continue
            try:
                standalone = graph.standalone_module(nodes)
            except RegionError:
                continue
            key = tvm_compat.structural_key(standalone)
            found[(pattern.backend, pattern.name, nodes)] = Candidate(pattern.backend, pattern.name, nodes, f"{pattern.name}:{key}")
    broken = [refusal for refusal in kept if refusal.broken]
    for name in sorted({refusal.pattern for refusal in broken}):
        first = next(refusal for refusal in broken if refusal.pattern == name)
        count = sum(refusal.pattern == name for refusal in broken)
        log.warning("pattern %s: %s (on %d match%s, refused)", name, first.reason, count, "" if count == 1 else "es")
    if refusals is not None:
        refusals.extend(kept)
    return sorted(found.values(), key=lambda candidate: candidate.sort_key)


def _match(pattern: Pattern, call, var2val, node_of_call):
    if not pattern.dpl.match(call, var2val):
        return None, (), {}
    matched = pattern.dpl.extract_matched_expr(call, var2val) or {}
    # A wildcard stands for an input of the group, even when that input is another operator.
    grouped = [expr for pat, expr in matched.items() if not isinstance(pat, dpl.WildcardPattern)] + [call]
    calls = tuple(sorted({node_of_call[e]: e for e in grouped if e in node_of_call}.items()))
    return frozenset(node for node, _ in calls), tuple(expr for _, expr in calls), dict(matched)


def _check(pattern: Pattern, match: PatternMatch, nodes) -> Optional[Refusal]:
    """None when the check takes the match; else the refusal."""
    try:
        if pattern.check(match):
            return None
        return Refusal(pattern.name, nodes, "refused by its check (no reason given)")
    except PatternRefused as refused:
        return Refusal(pattern.name, nodes, str(refused))
    except Exception as error:  # a check that breaks refuses the match; it must not end the run (an interrupt does)
        reraise_interrupt(error)
        return Refusal(pattern.name, nodes, f"the check raised {type(error).__name__}: {error}", broken=True)


def distinct_keys(candidates: Iterable[Candidate]) -> list[str]:
    return sorted({candidate.key for candidate in candidates})
