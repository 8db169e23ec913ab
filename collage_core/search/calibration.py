"""The op-level search, calibrated against the placement's end-to-end latency.

Candidates are measured alone. Inside a whole model each partition also pays for what isolation
hides: handing tensors from one backend to the next, waking another thread pool, colder caches.
On ResNet-50 with DNNL and TVM, a placement whose candidates summed to 47.5 ms ran in 65 ms end
to end, and a placement with fewer, larger partitions ran faster although its candidates summed
to more. So after the op-level search the placement is measured end to end, the part of its
latency that its candidates do not explain (or that they over-count: the charge may be negative)
is spread over its partitions as a per-partition charge, and the search runs again with every
candidate charged that much. A new placement is
kept only if it measures faster end to end; the rounds stop when the search returns a placement
already measured, when nothing is left unexplained, or when a round does not improve.

Other placements of the same candidates (such as each backend wherever it can, the rest on
another) are measured the same way, and the fastest of all is the result: a placement that
measured slower end to end than another one measured is never returned. One whose candidates,
charged as the last round measured, predict more than PREDICTED_LOSS_FACTOR times the best
latency measured is not built: it cannot win (untuned TVM alone on BERT-base: its candidates sum
to seconds against a placement of 0.25 s, and building it took 34 s).

Last, where a backend compiles regions (``Backend.compiles_regions``: TVM), the fastest placement is
measured once more with that backend's adjacent partitions merged into regions, which it compiles as
one function each: its own fusion then makes one kernel of casts and elementwise chains that the
op-level search placed as separate partitions, because no single candidate covered them. The merged
placement is kept only if it measures faster end to end.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from collage_core.model.original_model import ORIGINAL_MODEL, runs_original
from collage_core.records import Candidate, Cost, Partition
from collage_core.search.graph import OpGraph
from collage_core.search.op_level import search_op_level

DEFAULT_ROUNDS = 2
# An alternative predicted slower than this many times the best measured latency is not built.
PREDICTED_LOSS_FACTOR = 2.0
# A candidate's cost charged with a negative charge keeps at least this share of itself.
CHARGED_FLOOR = 0.1
# How a placement with adjacent partitions merged into regions is named after the one it came from.
MERGED_SUFFIX = ", adjacent partitions merged into regions"


@attrs.frozen
class CalibrationRound:
    """One measured placement: its size, its candidates' summed cost, its latency, and the charge it implies."""

    partitions: int
    summed_s: float
    latency: Cost
    charge_per_partition_s: float


@attrs.frozen
class CalibrationResult:
    parts: tuple[Partition, ...]
    latency: Cost
    rounds: tuple[CalibrationRound, ...]
    alternative: str = ""  # the name of the alternative placement returned, if one was fastest
    # Alternatives not built because their candidates predicted a loss: (name, predicted seconds).
    predicted: tuple[tuple[str, float], ...] = ()
    # The fastest placement with adjacent partitions merged into regions (see ``merge``), as measured: (partitions, latency).
    merged: Optional[tuple[int, Cost]] = None


def signature(parts: Sequence[Partition]) -> tuple:
    """What tells placements apart: which backend runs which operators, and whether an engine runs the
    original model file rather than Collage's conversion of the same operators."""
    return tuple(sorted((p.backend, p.nodes) + ((ORIGINAL_MODEL,) if runs_original(p) else ()) for p in parts))


def charged(costs: dict, charge_s: float) -> dict:
    """Every measured cost plus ``charge_s`` (a negative charge takes off, never below CHARGED_FLOOR of
    the cost); invalid and unknown costs stay as they are."""
    return {
        key: Cost.measured(_charged_s(cost.median_s, charge_s), cost.spread_s, cost.repeats) if cost.is_measured else cost
        for key, cost in costs.items()
    }


def _charged_s(seconds: float, charge_s: float) -> float:
    """``seconds`` plus ``charge_s``, never below CHARGED_FLOOR of ``seconds``."""
    return max(seconds + charge_s, CHARGED_FLOOR * seconds)


def predicted_s(parts: Sequence[Partition], charge_per_partition_s: float) -> float:
    """What ``parts`` should take end to end: their candidates' costs, each charged as :func:`charged` does."""
    return sum(_charged_s(p.cost.median_s, charge_per_partition_s) for p in parts)


def _round(parts: Sequence[Partition], latency: Cost) -> CalibrationRound:
    """The charge goes both ways: positive when the placement ran slower end to end than its
    candidates add up to, negative when they over-count what it costs inside the model."""
    summed = sum(p.cost.median_s for p in parts)
    return CalibrationRound(len(parts), summed, latency, (latency.median_s - summed) / len(parts))


def calibrate(
    graph: OpGraph,
    candidates: Sequence[Candidate],
    costs: dict,
    parts: Sequence[Partition],
    evaluate: Callable[[Sequence[Partition]], Cost],
    rounds: int = DEFAULT_ROUNDS,
    alternatives: Sequence[tuple[str, Sequence[Partition]]] = (),
    prepare: Optional[Callable[[list[Sequence[Partition]]], object]] = None,
    merge: Optional[Callable[[Sequence[Partition]], Sequence[Partition]]] = None,
) -> CalibrationResult:
    """The fastest end to end of ``parts``, up to ``rounds`` re-searched placements and the named ``alternatives``.
    ``prepare(placements)`` is handed the alternatives about to be measured, for an evaluator that builds them all
    at once first (:meth:`EndToEndEvaluator.prepare`); it changes what is measured in no way. ``merge(placement)``
    gives the fastest of them with adjacent partitions merged into regions (:func:`~collage_core.search.regions.merged_regions`),
    measured last and kept when faster, named as the placement it came from with MERGED_SUFFIX."""
    best_parts, best = tuple(parts), evaluate(parts)
    if not best.is_measured:
        return CalibrationResult(best_parts, best, ())
    history = [_round(best_parts, best)]
    measured = {signature(best_parts)}
    for _ in range(rounds):
        charge = history[-1].charge_per_partition_s
        if charge == 0.0:
            break
        chosen = search_op_level(graph, candidates, charged(costs, charge))
        proposal = tuple(Partition.from_candidate(c, costs[c.key]) for c in chosen)
        if signature(proposal) in measured:
            break
        measured.add(signature(proposal))
        latency = evaluate(proposal)
        if not latency.is_measured:
            break
        history.append(_round(proposal, latency))
        if latency.median_s >= best.median_s:
            break
        best_parts, best = proposal, latency
    chosen, predicted = "", []

    def predicted_loss(alternative) -> Optional[float]:
        """The latency predicted for ``alternative`` when it is over PREDICTED_LOSS_FACTOR times the best: not built."""
        if all(p.cost.is_measured for p in alternative):
            guess = predicted_s(alternative, history[-1].charge_per_partition_s)
            if guess > PREDICTED_LOSS_FACTOR * best.median_s:
                return guess
        return None

    if prepare is not None:
        coming = {signature(a): a for _, a in alternatives if signature(a) not in measured and predicted_loss(a) is None}
        prepare(list(coming.values()))
    for name, alternative in alternatives:
        if signature(alternative) in measured:
            continue
        measured.add(signature(alternative))
        guess = predicted_loss(alternative)
        if guess is not None:
            predicted.append((name, guess))
            continue
        latency = evaluate(alternative)
        if latency.is_measured and latency.median_s < best.median_s:
            best_parts, best, chosen = tuple(alternative), latency, name
    merged = None
    if merge is not None:
        regions = tuple(merge(best_parts))
        if signature(regions) not in measured:
            latency = evaluate(regions)
            merged = (len(regions), latency)
            if latency.is_measured and latency.median_s < best.median_s:
                best_parts, best, chosen = regions, latency, (chosen or "the op-level placement") + MERGED_SUFFIX
    return CalibrationResult(best_parts, best, tuple(history), chosen, tuple(predicted), merged)
