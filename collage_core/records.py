"""The data model: frozen records that flow between plugins, the search and the build."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import attrs

OP_LEVEL = "op-level"
GRAPH_LEVEL = "graph-level"
BACKEND_KINDS = (OP_LEVEL, GRAPH_LEVEL)


@attrs.frozen
class Backend:
    """A backend a plugin registers: who runs the partitions placed on it."""

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(BACKEND_KINDS))
    device_kinds: tuple[str, ...] = attrs.field(converter=tuple)
    version: str
    description: str = ""
    # What running this backend's partitions needs besides TVM's runtime, in words a user can act
    # on; written beside exported libraries so that loading one says what to install.
    runtime_needs: str = ""
    # Whether lowering this backend's partitions runs anything on the device (tuning kernels there, as
    # cuBLAS and cuDNN do). When it does not, the core builds its candidates several at once and
    # times them one by one afterwards; when it does, each is built and timed alone.
    lowering_uses_device: bool = True
    # Whether Collage places on it when the user names no backends: True (on every device it serves),
    # False (only when named, ``--backends``), or the device kinds where it is chosen by default.
    # TorchInductor compiles each region for seconds, quick enough beside a GPU's other costs but not
    # on the CPU, so it says ("cuda",) and the default CPU run stays quick.
    chosen_by_default: bool | tuple[str, ...] = True
    # Whether partitions placed next to each other on this op-level backend may be compiled as one
    # (TVM fuses the elementwise operators, casts and reductions of what were separate partitions into
    # fewer kernels). Calibration then also measures its placement with them merged into regions, and
    # keeps whichever runs faster end to end.
    compiles_regions: bool = False
    # Whether this op-level backend's build of a whole model as one partition is that backend's own build of the
    # unpartitioned model (TVM's relax.build, which fuses and schedules across the whole function). A run that
    # compares baselines then measures it as "unpartitioned relax.build", and calibration does not merge a whole
    # placement into one region of it, which that baseline measures. The first chosen backend that says so is used.
    builds_whole_models: bool = False


@attrs.frozen
class Availability:
    """Whether a backend can run on this machine, and if not, what the user can do about it."""

    available: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> "Availability":
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason)


class PatternRefused(Exception):
    """Raised by a pattern's check: the backend does not take this match, for the reason given."""


@attrs.frozen
class Pattern:
    """A subgraph shape a backend can run.

    ``dpl`` is a TVM Relax dataflow pattern rooted at the last operator of the group; ``check``
    (optional) receives a :class:`PatternMatch` and says whether the backend really supports
    those shapes, dtypes and attributes: it returns True to take the match, and refuses it by
    raising :class:`PatternRefused` with the reason (``collage inspect`` shows it) or by returning
    False. Any other exception means the check itself is broken: the match is refused, and the run
    warns, says so in its closing summary and fails under ``--strict``. Names are ``"<backend>.<what>"``.
    """

    name: str
    dpl: Any = attrs.field(eq=False, repr=False)
    check: Optional[Callable[["PatternMatch"], bool]] = attrs.field(default=None, eq=False, repr=False)

    @property
    def backend(self) -> str:
        return self.name.split(".", 1)[0]


@attrs.frozen
class PatternMatch:
    """What a pattern's check sees: the matched Relax calls (root last) and the dpl's bindings.

    ``bound_vars[i]`` is the variable ``calls[i]`` is bound to, so a check can tell which call
    produced an argument; ``outputs`` are the variables of the group read after it; ``items`` maps each of
    the group's variables bound to an item of a call's tuple (a ``split``'s part) to that item.
    """

    pattern: Pattern
    calls: tuple = attrs.field(eq=False)
    matched: dict = attrs.field(eq=False, factory=dict)
    bound_vars: tuple = attrs.field(eq=False, factory=tuple)
    outputs: tuple = attrs.field(eq=False, factory=tuple)
    items: dict = attrs.field(eq=False, factory=dict)

    @property
    def root(self):
        return self.calls[-1]


MEASURED = "measured"
INVALID = "invalid"
UNKNOWN = "unknown"


@attrs.frozen
class Cost:
    """A measured latency, or why there is none.

    ``invalid``: the backend cannot run the candidate (build error, crash, timeout); infinite.
    ``unknown``: not measured yet. Only ``measured`` costs carry numbers (seconds).

    ``held_up_share``: a measured cost timed while other processes kept the processors busy carries the
    share of its timing that its threads spent waiting for one (see :mod:`collage_core.measure.processor_wait`);
    it may be too high. 0.0 for one timed on a machine that let it run.
    """

    kind: str = attrs.field(validator=attrs.validators.in_((MEASURED, INVALID, UNKNOWN)))
    median_s: float = math.inf
    spread_s: float = math.inf
    repeats: int = 0
    reason: str = ""
    held_up_share: float = 0.0

    @classmethod
    def measured(cls, median_s: float, spread_s: float, repeats: int, held_up_share: float = 0.0) -> "Cost":
        return cls(MEASURED, float(median_s), float(spread_s), int(repeats), held_up_share=float(held_up_share))

    @property
    def held_up(self) -> bool:
        """Whether this cost was timed while other processes kept its threads waiting for a processor."""
        return self.held_up_share > 0.0

    def with_held_up_share(self, share: float) -> "Cost":
        """This cost marked as timed while its threads waited ``share`` of the time (measured costs only)."""
        return attrs.evolve(self, held_up_share=float(share)) if self.is_measured else self

    @classmethod
    def invalid(cls, reason: str) -> "Cost":
        return cls(INVALID, reason=reason)

    @classmethod
    def unknown(cls) -> "Cost":
        return cls(UNKNOWN)

    @property
    def is_measured(self) -> bool:
        return self.kind == MEASURED

    @property
    def seconds(self) -> float:
        """The number the search adds up: the median if measured, infinity otherwise."""
        return self.median_s if self.is_measured else math.inf

    def to_json(self) -> dict:
        if self.is_measured:
            held_up = {"held_up_share": self.held_up_share} if self.held_up else {}
            return {"kind": self.kind, "median_s": self.median_s, "spread_s": self.spread_s, "repeats": self.repeats, **held_up}
        return {"kind": self.kind, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict) -> "Cost":
        if data["kind"] == MEASURED:
            share = data.get("held_up_share", 0.0)
            if not isinstance(share, (int, float)) or not math.isfinite(share) or share < 0:
                raise ValueError(f"held_up_share {share!r} is not a share of a timing")
            return cls.measured(data["median_s"], data["spread_s"], data["repeats"], share)
        return cls(data["kind"], reason=data.get("reason", ""))


@attrs.frozen
class Candidate:
    """One match of one backend's pattern over the model graph.

    ``nodes`` are operator indices of the :class:`~collage_core.search.graph.OpGraph`; ``key`` is the
    structural hash of the standalone function (same key, same measurement).
    """

    backend: str
    pattern: str
    nodes: frozenset[int] = attrs.field(converter=frozenset)
    key: str

    @property
    def sort_key(self) -> tuple:
        return (min(self.nodes), len(self.nodes), self.backend, self.pattern, tuple(sorted(self.nodes)))


@attrs.frozen
class Partition:
    """A candidate chosen by the search, with the cost it was chosen for."""

    backend: str
    pattern: str
    nodes: tuple[int, ...] = attrs.field(converter=lambda nodes: tuple(sorted(nodes)))
    key: str
    cost: Cost

    @classmethod
    def from_candidate(cls, candidate: Candidate, cost: Cost) -> "Partition":
        return cls(candidate.backend, candidate.pattern, candidate.nodes, candidate.key, cost)
