"""Where the placements of several shapes of one model differ, and the measured costs that made them differ.

Each shape's placement puts every operator of the model on a backend. Operators whose backend changes from one
shape to another are grouped by their kind and by the backends they get, shape by shape ("12 relax.matmul:
cublas at batch=1, cudnn at batch=8"), and each group shows, at every shape, the cheapest measured candidate of
each of those backends that holds one of its operators: the costs the search weighed. When the shapes'
placements do not list the same operators (a model imported differently at some shape), only the number of
operators per backend is compared.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from collage_core.outputs.placement_file import Placement

# At most this many groups of moving operators are listed, the largest first.
SHOWN_GROUPS = 8


def placement_differences(labels: Sequence[str], placements: Sequence[Placement]) -> list[str]:
    """Lines saying where the placements (one per shape, labelled ``labels``) differ and why (see the module)."""
    counts = [Counter(p.backend for p in placement.partitions for _ in p.nodes) for placement in placements]
    backends = sorted({b for c in counts for b in c})
    changing = [b for b in backends if len({c.get(b, 0) for c in counts}) > 1]
    moved = _moved_operators(placements)
    if not changing and moved == {}:
        return ["every shape's placement puts each operator on the same backend"]
    lines = ["where the placements differ:"]
    for backend in changing:
        lines.append(f"  {backend} runs " + ", ".join(f"{c.get(backend, 0)} at {label}" for label, c in zip(labels, counts)))
    if moved is None:
        lines.append("  (the shapes' placements list different operators, so only their numbers per backend are compared)")
        return lines
    groups = Counter((placements[0].operators[node], chosen) for node, chosen in moved.items())
    lines.append("operators that change backend with the shape, and the cheapest measured candidate of each backend holding one:")
    for (name, chosen), count in groups.most_common(SHOWN_GROUPS):
        lines.append(f"  {count} {name}: " + ", ".join(f"{backend} at {label}" for backend, label in zip(chosen, labels)))
        example = min(node for node, backends_of in moved.items() if backends_of == chosen and placements[0].operators[node] == name)
        for label, placement in zip(labels, placements):
            costs = _cheapest_by_backend(placement, example, set(chosen))
            if costs:
                lines.append(f"    at {label}: " + ", ".join(costs))
    if len(groups) > SHOWN_GROUPS:
        lines.append(f"  ... and {len(groups) - SHOWN_GROUPS} more kinds")
    return lines


def _moved_operators(placements: Sequence[Placement]) -> Optional[dict]:
    """{operator index: its backend at each shape} for the operators whose backend changes; None when the
    placements do not list the same operators."""
    if len({placement.operators for placement in placements}) > 1:
        return None
    where = [{node: p.backend for p in placement.partitions for node in p.nodes} for placement in placements]
    moved = {}
    for node in sorted(where[0]):
        chosen = tuple(backend_of.get(node, "?") for backend_of in where)
        if len(set(chosen)) > 1:
            moved[node] = chosen
    return moved


def _cheapest_by_backend(placement: Placement, node: int, backends: set) -> list[str]:
    """For each of ``backends``, its cheapest measured candidate holding ``node`` in ``placement``: pattern, cost
    and the number of operators it holds, cheapest first."""
    best = {}
    for candidate in (*placement.considered, *placement.partitions):
        if candidate.backend in backends and node in candidate.nodes and candidate.cost.is_measured:
            if candidate.backend not in best or candidate.cost.median_s < best[candidate.backend].cost.median_s:
                best[candidate.backend] = candidate
    ordered = sorted(best.values(), key=lambda candidate: candidate.cost.median_s)
    return [f"{c.pattern} {c.cost.median_s * 1e6:.1f} us ({len(c.nodes)} op{'s' if len(c.nodes) != 1 else ''})" for c in ordered]
