"""Predicting a two-level placement's end-to-end latency from what the search has measured so far.

A genome's build takes seconds (BERT-base on 2 cores: about 9 s each), and most genomes of a large
model are far slower than the best: handing a few op groups back to the op level splits a
graph-level backend's one region into many, each a call of its own. The prediction lets the search
build only the genomes that could beat the best.

The model, learned from the placements measured end to end:

- an op-level partition costs its candidate's measured cost plus a charge per partition (what the
  op-level placement measured beyond its candidates' sum, as calibration finds it);
- a graph-level backend's region costs its operators' op-level costs times the backend's scale (its
  seed, the placement giving it all it supports, measured against the same operators' op-level
  costs), plus a charge per region: the median of what measured placements took beyond that, per
  region they had.

A prediction is None until every backend the placement uses has a scale. It is a guide, not a
bound: a genome is built when its prediction is within ``margin`` of the best measured latency, and
each build teaches the region charge. A placement stopped because a run outlasted its limit teaches
it too, with the limit as its latency (it took at least that long): on GPT-2 at batch 8 (2 cores)
21 placements that split ONNX Runtime's one region were each stopped after 15 s, every one
predicted within 10% of the best because the stopped ones before them had taught nothing.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from collage_core.measure.timing import stopped_limit
from collage_core.records import Cost, Partition
from collage_core.search.regions import OpGroup


class LatencyPredictor:
    """Learns from measured placements (:meth:`learn`) and predicts others (:meth:`predict`)."""

    def __init__(self, groups: Sequence[OpGroup]):
        self._op_level_s = {
            node: g.partition.cost.median_s / len(g.partition.nodes)
            for g in groups
            if g.partition.cost.is_measured
            for node in g.partition.nodes
        }
        self.kept_charge_s: Optional[float] = None
        self.scale: dict[str, float] = {}
        self._region_residuals: list[float] = []

    @property
    def region_charge_s(self) -> float:
        return statistics.median(self._region_residuals) if self._region_residuals else 0.0

    def _op_level(self, part: Partition) -> Optional[float]:
        costs = [self._op_level_s.get(node) for node in part.nodes]
        return None if None in costs else sum(costs)

    def predict(self, parts: Sequence[Partition]) -> Optional[float]:
        """Seconds ``parts`` should take end to end, or None when the model cannot say yet."""
        kept, regions = _kept_and_regions(parts)
        if self.kept_charge_s is None and kept:
            return None
        seconds = sum(p.cost.median_s + (self.kept_charge_s or 0.0) for p in kept)
        for region in regions:
            op_level = self._op_level(region)
            if op_level is None or region.backend not in self.scale:
                return None
            seconds += self.scale[region.backend] * op_level + self.region_charge_s
        return seconds

    def learn(self, parts: Sequence[Partition], cost: Cost) -> None:
        """Take in a placement measured end to end, or stopped at a run limit (then the limit, a lower
        bound of its latency, teaches the region charge only); another unmeasured cost teaches nothing."""
        seconds = cost.median_s if cost.is_measured else stopped_limit(cost)
        if seconds is None:
            return
        kept, regions = _kept_and_regions(parts)
        kept_s = sum(p.cost.median_s for p in kept)
        if not regions:
            if kept and cost.is_measured:
                self.kept_charge_s = (seconds - kept_s) / len(kept)
            return
        if kept and self.kept_charge_s is None:
            return
        rest_s = seconds - kept_s - len(kept) * (self.kept_charge_s or 0.0)
        unknown = {r.backend for r in regions} - set(self.scale)
        op_levels = [self._op_level(r) for r in regions]
        if None in op_levels:
            return
        if unknown:
            if cost.is_measured and len(unknown) == 1 and len({r.backend for r in regions}) == 1:
                self.scale[unknown.pop()] = max(rest_s, 0.0) / max(sum(op_levels), 1e-12)
            return
        explained = sum(self.scale[r.backend] * s for r, s in zip(regions, op_levels))
        self._region_residuals.append((rest_s - explained) / len(regions))


def _kept_and_regions(parts: Sequence[Partition]) -> tuple[list[Partition], list[Partition]]:
    """Op-level partitions (a measured candidate's cost) and graph-level regions (no cost of their own)."""
    return [p for p in parts if p.cost.is_measured], [p for p in parts if not p.cost.is_measured]
