"""One row of a run's end-to-end table: a whole build's measured latency, and the names its rows go by."""

from __future__ import annotations

from typing import Optional

import attrs

from collage_core.records import Cost

# The returned placement's row: timed in turns with its closest rivals when they were, else one after another.
PLACEMENT = "placement"
# The search's own placement, when a baseline beat it in the contest in turns and was returned instead.
SEARCHED = "searched placement"
# How the rows of a contest's entrants measured one after another are told from their rows timed in turns.
ONE_AFTER_ANOTHER = "one after another"
# The returned placement built to launch kernel by kernel, on a CUDA target whose builds replay CUDA graphs.
WITHOUT_CUDA_GRAPHS = "placement without CUDA graphs"


@attrs.frozen
class EndToEnd:
    """The measured latency of one whole build: the chosen placement or a single-backend baseline,
    timed in turns with its rivals (side by side in one sitting) or one after another (each alone).
    Timed in turns, ``cost`` is its warm latency, back to back, and ``after_pause`` that of its first run
    after it sat idle ``paused_s`` (see collage_core.measure.in_turns)."""

    name: str
    cost: Cost
    operators_by_backend: dict = attrs.field(eq=False)
    timed_in_turns: bool = False
    after_pause: Optional[Cost] = None
    paused_s: Optional[float] = None
    # Which build the row measured (a digest of its placement: see collage_core.build.stage.build_id), so that the
    # report never compares a library with itself and does compare two builds of the same backend mix; "" if unknown.
    build: str = attrs.field(default="", eq=False)

    def to_json(self) -> dict:
        data = {
            "name": self.name,
            "cost": self.cost.to_json(),
            "operators_by_backend": self.operators_by_backend,
            "timed_in_turns": self.timed_in_turns,
        }
        if self.after_pause is not None:
            data.update(after_pause=self.after_pause.to_json(), paused_s=self.paused_s)
        if self.build:
            data["build"] = self.build
        return data

    @classmethod
    def from_json(cls, data: dict) -> "EndToEnd":
        after_pause = data.get("after_pause")
        return cls(
            str(data["name"]),
            Cost.from_json(data["cost"]),
            dict(data["operators_by_backend"]),
            bool(data.get("timed_in_turns", False)),
            None if after_pause is None else Cost.from_json(after_pause),
            data.get("paused_s"),
            str(data.get("build", "")),
        )
