"""Holding a 16-bit model to an accuracy budget: which units go back to float32.

With ``--accuracy-budget E`` at bf16 or fp16, the placement may differ from the float32 reference
by at most ``E`` (the largest ``|out - ref|`` over the largest ``|ref|``, on the verification
inputs). Error is measured, never guessed: each *probe* places the model with some units widened
(:mod:`collage_core.model.widening`) by the op-level search, builds that placement and compares its
outputs with the reference. The units are split into consecutive blocks; one probe per block, with
that block alone left at 16 bits, says how much error the block brings (these probes are built at
once, see :mod:`collage_core.model.probes`). Blocks go back to float32
in order of the error they bring, most first, and a probe confirms each choice; the first choice
that holds the budget is kept. Rounding errors from separate blocks are nearly independent, so the
predicted error of a choice is the root of the sum of squares of the errors of the blocks left at
16 bits; only choices predicted within the budget are probed. The last block a choice sent back to
float32 is then split in halves (and halves of halves), and each piece whose return to 16 bits
still holds the budget goes back, for at most four more probes.

Cost: one probe for the whole model at 16 bits (the answer when it already holds the budget), one
per block, then one per confirmation, usually one or two. Measured costs are shared with every
other run through the cost database, so each probe measures only candidates it has not seen.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import attrs

from collage_core.errors import CollageError

DEFAULT_BLOCKS = 8
DEFAULT_REFINEMENTS = 4  # probes spent giving parts of the last block sent back to float32 their 16 bits again
NEEDS_REFERENCE = (
    "an accuracy budget is held by measuring the outputs against the reference: it needs verification "
    "and a model with a reference (ONNX or PyTorch)"
)


class AccuracyBudgetError(CollageError):
    """A budget that cannot be held, or one asked of a precision it does not apply to."""


@attrs.frozen
class Probe:
    float32_units: tuple[int, ...]
    error: float
    why: str


@attrs.frozen
class Fit:
    """The units kept in float32, the error their placement measured, and every probe on the way."""

    budget: float
    units: int
    float32_units: tuple[int, ...]
    error: float
    probes: tuple[Probe, ...]

    def to_json(self) -> dict:
        return {
            "budget": self.budget,
            "units": self.units,
            "float32_units": list(self.float32_units),
            "error": self.error,
            "probes": [attrs.asdict(p) for p in self.probes],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Fit":
        return cls(
            float(data["budget"]),
            int(data["units"]),
            tuple(int(u) for u in data["float32_units"]),
            float(data["error"]),
            tuple(Probe(tuple(p["float32_units"]), float(p["error"]), str(p["why"])) for p in data["probes"]),
        )

    def describe(self) -> str:
        kept = len(self.float32_units)
        return (
            f"accuracy budget {self.budget:g}: {kept} of {self.units} units back in float32, "
            f"measured error {self.error:.3g} ({len(self.probes)} probes)"
        )


def _named(piece: Sequence[int]) -> str:
    return f"unit {piece[0]}" if len(piece) == 1 else f"units {piece[0]}-{piece[-1]}"


def _halves(piece: Sequence[int]) -> list[tuple[int, ...]]:
    if len(piece) < 2:
        return []
    middle = len(piece) // 2
    return [tuple(piece[:middle]), tuple(piece[middle:])]


def load_fit(path: Path, key: str) -> Optional[Fit]:
    """The fit saved at ``path`` under ``key`` (the run before, same model, budget, backends and code), or None."""
    try:
        data = json.loads(path.read_text())
        return Fit.from_json(data["fit"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: the probes run again


def save_fit(path: Path, key: str, fitted: Fit) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"key": key, "fit": fitted.to_json()}, indent=1))
    partial.replace(path)


def blocks_of(units: int, count: int) -> list[tuple[int, ...]]:
    """``units`` numbers split into at most ``count`` consecutive blocks of nearly equal size."""
    count = max(1, min(count, units))
    edges = [round(i * units / count) for i in range(count + 1)]
    return [tuple(range(edges[i], edges[i + 1])) for i in range(count) if edges[i + 1] > edges[i]]


def fit(
    units: int,
    budget: float,
    errors_of: Callable[[list[tuple[int, ...]]], list[float]],
    blocks: int = DEFAULT_BLOCKS,
    say: Optional[Callable[[str], None]] = None,
    refinements: int = DEFAULT_REFINEMENTS,
) -> Fit:
    """The float32 units that hold ``budget``; ``errors_of([float32_units, ...])`` builds and measures
    probes, the blocks' probes in one call (they do not depend on each other, so they may be built at once)."""
    if not budget > 0:
        raise AccuracyBudgetError(f"the accuracy budget must be a positive relative error, not {budget}")
    say = say or (lambda message: None)
    probes: list[Probe] = []

    def probe_all(asked: Sequence[tuple[Sequence[int], str]]) -> list[float]:
        """The error of each ``(float32_units, why)``; a variant measured before is not probed again."""
        known = {p.float32_units: p.error for p in probes}
        chosen = [tuple(sorted(float32_units)) for float32_units, _ in asked]
        new: dict[tuple[int, ...], str] = {}  # variant -> why, in the order asked
        for variant, (_, why) in zip(chosen, asked):
            if variant not in known:
                new.setdefault(variant, why)
        for (variant, why), error in zip(new.items(), errors_of(list(new)) if new else []):
            known[variant] = error
            probes.append(Probe(variant, error, why))
            say(f"accuracy probe {len(probes)}: {len(variant)} of {units} units in float32 ({why}): error {error:.3g}")
        return [known[c] for c in chosen]

    def probe(float32_units: Sequence[int], why: str) -> float:
        return probe_all([(float32_units, why)])[0]

    def done(chosen: Sequence[int], error: float) -> Fit:
        return Fit(budget, units, tuple(sorted(chosen)), error, tuple(probes))

    def refined(chosen: list[int], last: tuple[int, ...], error: float) -> tuple[list[int], float]:
        """``chosen`` with pieces of the ``last`` block sent back to 16 bits where the budget still holds:
        halves first, then their halves, at most ``refinements`` probes."""
        pending = _halves(last)
        for _ in range(refinements):
            if not pending:
                break
            piece = pending.pop(0)
            trial = [u for u in chosen if u not in piece]
            trial_error = probe(trial, f"{_named(piece)} back to 16 bits")
            if trial_error <= budget:
                chosen, error = trial, trial_error
            else:
                pending += _halves(piece)
        return chosen, error

    everything = tuple(range(units))
    error = probe((), "every unit at 16 bits")
    if error <= budget or units == 0:
        return done((), error)
    split = blocks_of(units, blocks)
    alone = dict(
        zip(split, probe_all([(tuple(u for u in everything if u not in block), f"{_named(block)} alone at 16 bits") for block in split]))
    )
    order = sorted(split, key=lambda block: -alone[block])
    chosen: list[int] = []
    for position, block in enumerate(order):
        chosen += block
        left = order[position + 1 :]
        predicted = math.sqrt(sum(alone[b] ** 2 for b in left))
        if not left:
            break
        if predicted <= budget:
            error = probe(chosen, f"predicted {predicted:.3g}")
            if error <= budget:
                return done(*refined(chosen, block, error))
    error = probe(everything, "every unit in float32")
    if error <= budget:
        return done(*refined(list(everything), order[-1], error))
    raise AccuracyBudgetError(
        f"accuracy budget {budget:g} is below what the placement measured with every unit in "
        f"float32 ({error:.3g}): raise the budget, or use --precision fp32"
    )
