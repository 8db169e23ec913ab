"""Placements as versioned JSON: what runs where, why (measured costs), and for which model and target."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import attrs

from collage_core.errors import CollageError
from collage_core.graph import OpGraph
from collage_core.records import Cost, Partition

FORMAT = "collage-placement"
VERSION = 1


class PlacementFileError(CollageError):
    """A placement file that cannot be read, or does not fit the model it is applied to."""


@attrs.frozen
class Placement:
    """A searched (or replayed) placement of a model's operators on backends."""

    model_name: str
    model_fingerprint: str
    operators: tuple[str, ...] = attrs.field(converter=tuple)
    target: dict = attrs.field(eq=False)
    device: str
    backends: dict = attrs.field(eq=False)
    search: str
    partitions: tuple[Partition, ...] = attrs.field(converter=tuple)

    @property
    def summed_cost_s(self) -> float:
        return sum(p.cost.seconds for p in self.partitions)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": {"name": self.model_name, "fingerprint": self.model_fingerprint, "operators": list(self.operators)},
            "target": self.target,
            "device": self.device,
            "backends": self.backends,
            "search": self.search,
            "summed_cost_s": _finite_or_none(self.summed_cost_s),
            "partitions": [
                {
                    "backend": p.backend,
                    "pattern": p.pattern,
                    "operators": list(p.nodes),
                    "ops": [self.operators[n] for n in p.nodes],
                    "key": p.key,
                    "cost": p.cost.to_json(),
                }
                for p in self.partitions
            ],
        }

    def save(self, path: os.PathLike) -> Path:
        """Write atomically: a reader never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        partial.replace(path)
        return path

    def check_fits(self, graph: OpGraph, origin: str = "placement") -> None:
        """Refuse a placement made for another model, naming the first mismatch."""
        for index, (expected, actual) in enumerate(zip(self.operators, graph.ops)):
            if expected != actual:
                raise PlacementFileError(f"{origin}: operator {index} is {expected} in the placement but {actual} in the model")
        if len(self.operators) != len(graph.ops):
            raise PlacementFileError(
                f"{origin}: the placement covers {len(self.operators)} operators but the model has {len(graph.ops)}"
            )


def _finite_or_none(value: float):
    return value if math.isfinite(value) else None


def load_placement(path: os.PathLike) -> Placement:
    """Read a placement file; any problem is a ``PlacementFileError`` naming the file and the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlacementFileError(f"{path}: no such placement file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlacementFileError(f"{path}: not JSON ({error})") from None
    return placement_from_json(data, str(path))


def placement_from_json(data: Any, origin: str) -> Placement:
    def fail(problem: str):
        raise PlacementFileError(f"{origin}: {problem}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        fail(f"not a Collage placement (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        fail(f"placement version {data.get('version')!r} is not supported (this Collage reads version {VERSION})")
    try:
        model = data["model"]
        operators = tuple(str(op) for op in model["operators"])
        partitions = []
        for number, item in enumerate(data["partitions"]):
            nodes = [int(n) for n in item["operators"]]
            if not nodes or any(not 0 <= n < len(operators) for n in nodes):
                fail(f"partition {number} names operators outside 0..{len(operators) - 1}")
            cost = Cost.from_json(item["cost"])
            partitions.append(Partition(str(item["backend"]), str(item["pattern"]), nodes, str(item["key"]), cost))
        placement = Placement(
            model_name=str(model["name"]),
            model_fingerprint=str(model["fingerprint"]),
            operators=operators,
            target=dict(data["target"]),
            device=str(data["device"]),
            backends=dict(data["backends"]),
            search=str(data["search"]),
            partitions=tuple(partitions),
        )
    except PlacementFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        fail(f"malformed placement ({type(error).__name__}: {error})")
    covered = sorted(n for p in placement.partitions for n in p.nodes)
    if covered != list(range(len(placement.operators))):
        fail("partitions do not cover every operator exactly once")
    return placement
