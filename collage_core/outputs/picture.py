"""A placement as a Graphviz graph: operators filled by backend, partitions as clusters, the costliest outlined in red."""

from __future__ import annotations

import html
import textwrap

from collage_core.outputs.explain import (
    TOP_COUNT,
    TOP_SHARE,
    counted,
    describe_cost,
    measured_total_s,
    most_expensive,
    partitions_in_operator_order,
    short_op_name,
)
from collage_core.outputs.placement_file import Placement, PlacementFileError, described_search

# Light fills keep black labels readable; no red among them, red marks the costliest partitions.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5")
HIGHLIGHT = "#d62728"
OUTLINE = "#707070"
# Small nodes and tight spacing keep a 400-operator model (BERT-base) legible on one page.
GRAPH_ATTRIBUTES = 'rankdir=TB, newrank=true, nodesep=0.12, ranksep=0.2, fontname="Helvetica", fontsize=10, labelloc=t'
NODE_ATTRIBUTES = 'shape=box, style="filled,rounded", fontname="Helvetica", fontsize=8, width=0, height=0, margin="0.05,0.02", penwidth=0.5'
EDGE_ATTRIBUTES = 'arrowsize=0.4, penwidth=0.6, color="#606060"'
# The title's why-line is wrapped at this many characters, so that it does not set the picture's width.
TITLE_CHARACTERS = 90


def backend_colours(placement: Placement) -> dict[str, str]:
    """One fill per backend, by name order, so the same backends get the same colours in every picture."""
    names = sorted(set(placement.backends) | {part.backend for part in placement.partitions})
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(names)}


def placement_dot(placement: Placement, origin: str = "placement") -> str:
    """The DOT text of the placement; refuses a placement file written without the operator graph."""
    if not placement.inputs_of:
        raise PlacementFileError(
            f"{origin}: written without the operator graph (model.inputs_of), so it cannot be drawn; "
            "re-run collage optimize to write a placement that can"
        )
    colours = backend_colours(placement)
    top = {part: rank for rank, part in enumerate(most_expensive(placement), start=1)}
    total = measured_total_s(placement)
    lines = [
        "digraph placement {",
        f"  graph [{GRAPH_ATTRIBUTES}, label={_quote(_title(placement, total))}];",
        f"  node [{NODE_ATTRIBUTES}];",
        f"  edge [{EDGE_ATTRIBUTES}];",
        f"  legend [shape=plaintext, style=\"\", margin=0, label=<{_legend(placement, colours, len(top))}>];",
    ]
    for number, part in enumerate(partitions_in_operator_order(placement), start=1):
        rank = top.get(part)
        about = f"#{number} {part.backend} {part.pattern}: {describe_cost(part)}"
        if len(part.nodes) == 1:
            note = f"top {rank}: {describe_cost(part)}" if rank else ""
            lines.append("  " + _node(placement, part.nodes[0], colours[part.backend], about, note))
            continue
        label = f"{part.backend} {part.pattern}\n{describe_cost(part)}"
        outline = f'color="{OUTLINE}", penwidth=1'
        if rank:
            label = f"top {rank}: {label} ({100 * part.cost.median_s / total:.1f}%)"
            outline = f'color="{HIGHLIGHT}", fontcolor="{HIGHLIGHT}", penwidth=3'
        lines.append(f"  subgraph cluster_{number} {{")
        lines.append(f"    graph [label={_quote(label)}, tooltip={_quote(about)}, style=rounded, fontsize=8, margin=4, {outline}];")
        lines += ["    " + _node(placement, node, colours[part.backend], about) for node in part.nodes]
        lines.append("  }")
    for node, producers in enumerate(placement.inputs_of):
        lines += [f"  op{producer} -> op{node};" for producer in producers]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _node(placement: Placement, node: int, fill: str, about: str, note: str = "") -> str:
    label = f"{node} {short_op_name(placement.operators[node])}" + (f"\n{note}" if note else "")
    outline = f', color="{HIGHLIGHT}", fontcolor="{HIGHLIGHT}", penwidth=3' if note else ""
    return f'op{node} [label={_quote(label)}, fillcolor="{fill}", tooltip={_quote(about)}{outline}];'


def _title(placement: Placement, total_s: float) -> str:
    title = (
        f"{placement.model_name}: {counted(len(placement.operators), 'operator')}, "
        f"{counted(len(placement.partitions), 'partition')}, {described_search(placement.search)}"
    )
    title += f"; measured partitions sum to {total_s * 1e3:.3f} ms" if total_s else ""
    why = textwrap.wrap(f"why this placement: {placement.why_chosen}", TITLE_CHARACTERS) if placement.why_chosen else []
    return "\n".join([title, *why])


def _legend(placement: Placement, colours: dict[str, str], top_count: int) -> str:
    """An HTML-like table: one row per backend with its fill, and what the red outline means."""
    rows = []
    for backend, fill in colours.items():
        parts = [part for part in placement.partitions if part.backend == backend]
        operators = sum(len(part.nodes) for part in parts)
        rows.append(
            f'<tr><td bgcolor="{fill}">{html.escape(backend)}</td>'
            f"<td>{counted(len(parts), 'partition')}, {counted(operators, 'operator')}</td></tr>"
        )
    if top_count:
        rows.append(
            f'<tr><td colspan="2"><font color="{HIGHLIGHT}">red outline: the {top_count} costliest partitions '
            f"(top {TOP_COUNT}, and any over {TOP_SHARE:.0%} of the summed cost)</font></td></tr>"
        )
    return f'<table border="0" cellborder="1" cellspacing="0" cellpadding="3">{"".join(rows)}</table>'


def _quote(text: str) -> str:
    """A DOT string; a newline becomes DOT's centred line break."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
