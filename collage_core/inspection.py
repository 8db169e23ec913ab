"""``collage inspect``: what the backends see of a model, without measuring anything.

The imported Relax (what every pattern is matched against), then per backend its patterns, the
candidates each produced and the matches its checks refused, with their reasons: what a plugin
author reads while writing patterns, and what a user reads when a backend takes less than expected.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends, select_backends, serves
from collage_core.candidates.enumeration import Refusal, enumerate_candidates
from collage_core.model.layout import AUTO, MODEL, resolve, with_layout
from collage_core.model.model_import import load_model
from collage_core.model.precision import FP32, at_precision
from collage_core.model.relax_graph import RelaxGraph
from collage_core.model.shape_profiles import at_one_shape
from collage_core.outputs.report import format_table
from collage_core.plugins import get_plugin_manager

# Refusals of one pattern for one reason are listed once, with how many there were and the first's operators.
OPERATORS_SHOWN = 4


@attrs.frozen
class BackendView:
    """One backend's patterns over the model: candidates and refusals per pattern."""

    name: str
    patterns: tuple[str, ...]
    candidates: tuple = ()
    refusals: tuple[Refusal, ...] = ()

    def covered(self) -> frozenset:
        return frozenset(node for candidate in self.candidates for node in candidate.nodes)


@attrs.frozen
class Inspection:
    model_name: str
    target: str
    graph: Any = attrs.field(repr=False)
    relax_text: str = attrs.field(repr=False)
    views: tuple[BackendView, ...]
    unavailable: tuple[tuple[str, str], ...] = ()
    layout: str = MODEL  # the layout its convolutions were inspected in

    def broken_checks(self) -> list[Refusal]:
        return [refusal for view in self.views for refusal in view.refusals if refusal.broken]


def inspect_model(
    model,
    target: Any = None,
    backends: Optional[Sequence[str]] = None,
    example_inputs=None,
    precision: str = FP32,
    layout: str = AUTO,
    shapes: Optional[str] = None,
) -> Inspection:
    """Import ``model`` (its convolutions in ``layout``, chosen as ``optimize`` chooses it by default; converted
    to ``precision``) and match the patterns of ``backends`` (default: every available one) against it; nothing
    is built or run, so a named backend is inspected even where it is not available, and a precision even on a
    machine that would not run it fast. An ONNX model with symbolic dimensions is inspected at the one shape
    ``shapes`` gives, written as ``optimize``'s ``shapes`` are (``"batch=1 sequence=128"``)."""
    target = tvm_compat.make_target(target)
    if shapes is None:
        loaded = load_model(model, example_inputs)
    else:
        static, name = at_one_shape(model, shapes, "inspect")
        loaded = load_model(static, name=name)
    imported = at_precision(with_layout(loaded, resolve(layout, target, precision, loaded.mod)), precision)
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    unavailable = tuple(
        (name, info.availability.reason)
        for name, info in infos.items()
        if not info.availability.available and (backends is None or name in backends)
    )
    if backends is None:
        chosen = [info for info in select_backends(infos, target=target) if serves(info, target)]
    else:  # a named backend is inspected even where it cannot run: matching patterns needs no device
        unknown = [name for name in backends if name not in infos]
        if unknown:
            select_backends(infos, unknown)  # raises, naming the installed ones
        chosen = [infos[name] for name in backends if serves(infos[name], target)]
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    views = []
    for info in chosen:
        patterns = contribute_patterns(pm, info.backend, target, imported.precision)
        refusals: list[Refusal] = []
        candidates = enumerate_candidates(graph, patterns, refusals)
        views.append(BackendView(info.name, tuple(p.name for p in patterns), tuple(candidates), tuple(refusals)))
    return Inspection(
        imported.name,
        tvm_compat.device_name(target),
        graph,
        imported.mod.script(show_meta=False),
        tuple(views),
        unavailable,
        imported.layout,
    )


def render_inspection(inspection: Inspection, show_relax: bool = True, show_candidates: bool = False) -> str:
    ops = inspection.graph.graph.ops
    sections = []
    if show_relax:
        sections += ["# The imported Relax, which the patterns are matched against", inspection.relax_text, ""]
    in_layout = f", convolutions in {inspection.layout.upper()}" if inspection.layout != MODEL else ""
    sections.append(f"Model {inspection.model_name}: {len(ops)} operators on {inspection.target}{in_layout}")
    rows = []
    for view in inspection.views:
        rows.append(
            [view.name, str(len(view.patterns)), str(len(view.candidates)), f"{len(view.covered())} of {len(ops)}", str(len(view.refusals))]
        )
    sections.append(format_table(["backend", "patterns", "candidates", "operators covered", "matches refused"], rows))
    for name, reason in inspection.unavailable:
        sections.append(
            f"{name}: not available here ({reason})"
            + ("; its patterns are inspected all the same" if any(view.name == name for view in inspection.views) else "")
        )
    for view in inspection.views:
        sections += ["", f"## {view.name}", _pattern_table(view, ops)]
        if view.refusals:
            sections += ["", "refused matches (pattern, how many, the first's operators: reason):"]
            sections += [f"  {line}" for line in _refusal_lines(view.refusals, ops)]
        if show_candidates:
            sections += ["", "candidates (pattern: operators):"]
            sections += [f"  {c.pattern}: {_operators(c.nodes, ops, limit=None)}" for c in view.candidates]
    uncovered = set(range(len(ops))) - set().union(*(view.covered() for view in inspection.views))
    if uncovered:
        counts = Counter(ops[node] for node in uncovered)
        sections += ["", "operators no selected backend takes: " + ", ".join(f"{op} x{n}" for op, n in sorted(counts.items()))]
    broken = inspection.broken_checks()
    if broken:
        sections += [
            "",
            f"{len(broken)} matches were refused because a check raised (a bug in the plugin): {broken[0].pattern}: {broken[0].reason}",
        ]
    return "\n".join(sections)


def _pattern_table(view: BackendView, ops) -> str:
    made = Counter(candidate.pattern for candidate in view.candidates)
    refused = Counter(refusal.pattern for refusal in view.refusals)
    rows = [[name, str(made[name]), str(refused[name])] for name in view.patterns if made[name] or refused[name]]
    silent = len(view.patterns) - len(rows)
    table = format_table(["pattern", "candidates", "refused"], rows) if rows else "no pattern matched"
    return table + (f"\n({silent} more patterns matched nothing)" if silent else "")


def _refusal_lines(refusals: Sequence[Refusal], ops) -> list[str]:
    first: dict[tuple[str, str], Refusal] = {}
    counts: Counter = Counter()
    for refusal in refusals:
        key = (refusal.pattern, refusal.reason)
        first.setdefault(key, refusal)
        counts[key] += 1
    return [
        f"{pattern} x{counts[(pattern, reason)]}, {_operators(first[(pattern, reason)].nodes, ops)}: {reason}"
        for pattern, reason in sorted(first)
    ]


def _operators(nodes, ops, limit: Optional[int] = OPERATORS_SHOWN) -> str:
    ordered = sorted(nodes)
    shown = ordered if limit is None else ordered[:limit]
    text = ", ".join(f"{node} {ops[node]}" for node in shown)
    return text + (f", ... ({len(ordered)} in all)" if len(shown) < len(ordered) else "")
