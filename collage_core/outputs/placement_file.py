"""Placements as versioned JSON: what runs where, why (measured costs), and for which model and target."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import attrs

from collage_core.build.deploy import installed_backends, recorded_versions, tell_other_versions
from collage_core.errors import CollageError
from collage_core.model.layout import LAYOUTS, MODEL
from collage_core.model.original_model import contender_name, engine_of, kind_of, runs_original
from collage_core.model.precision import DTYPES, FP32, PRECISIONS
from collage_core.records import Cost, Partition
from collage_core.search.graph import OpGraph

FORMAT = "collage-placement"
VERSION = 1
# Every shape's placement of a run with shape profiles (placements.json; see collage_core.optimize_shapes).
SHAPES_FORMAT = "collage-shape-placements"
SHAPES_VERSION = 1


class PlacementFileError(CollageError):
    """A placement file that cannot be read, or does not fit the model it is applied to."""


# The best placement of a two-level search still running (or killed), saved as the search goes; the finished run's
# files replace it with placement.json, so that placement.json always describes the library beside it.
SEARCH_BEST_FILE = "search-best-placement.json"
# A baseline's placement, saved beside a run's (baselines/<name>.json), says so in its ``search``: "baseline: tvm alone".
BASELINE_PREFIX = "baseline: "


def described_search(search: str) -> str:
    """How a placement was made, from its ``search``, for a heading: ``op-level search``, or for a baseline's
    placement (``baseline: tvm alone``) ``baseline tvm alone``."""
    if search.startswith(BASELINE_PREFIX):
        return f"baseline {search.removeprefix(BASELINE_PREFIX)}"
    return f"{search} search"


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
    # Optional, for pictures and explanations: each operator's producers among the operators,
    # and every candidate the search considered, with its measured cost.
    inputs_of: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=lambda v: tuple(tuple(i) for i in v))
    considered: tuple[Partition, ...] = attrs.field(default=(), converter=tuple, eq=False, repr=False)
    # Set when the placement was replayed on another device than the one its costs were measured on.
    ran_on: str = attrs.field(default="", eq=False)
    # The precision the model was converted to before placing (see collage_core.model.precision); a replay converts it the same.
    precision: str = attrs.field(default=FP32, validator=attrs.validators.in_(PRECISIONS))
    # The layout the model's convolutions were placed in (see collage_core.model.layout); a replay changes it the same.
    layout: str = attrs.field(default=MODEL, validator=attrs.validators.in_(LAYOUTS))
    # Units of the converted model given back float32 arithmetic to hold an accuracy budget (collage_core.model.widening),
    # and the operators that still compute on 16-bit values; a replay widens the same units.
    float32_units: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    sixteen_bit_operators: tuple[int, ...] = attrs.field(default=(), converter=tuple, eq=False)
    # With an accuracy budget: the budget and the error the placement's outputs measured against the reference.
    accuracy_budget: Optional[float] = attrs.field(default=None, eq=False)
    measured_error: Optional[float] = attrs.field(default=None, eq=False)
    # Why this placement was returned: the search that found it, or the contest in turns it won (see optimize).
    why_chosen: str = attrs.field(default="", eq=False)
    # Set when the placement is an engine's own session over the original model file (collage_core.model.original_model):
    # {"engine": backend, "format": "onnx", "sha256": the file's digest}; a replay refuses any other file.
    original_model: Optional[dict] = attrs.field(default=None, eq=False)

    def precision_of(self, part: Partition) -> str:
        """The precision ``part`` computes at: the placement's where it touches 16-bit values, else fp32."""
        return self.precision if set(part.nodes) & set(self.sixteen_bit_operators) else FP32

    @property
    def summed_cost_s(self) -> float:
        return sum(p.cost.seconds for p in self.partitions)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": {
                "name": self.model_name,
                "fingerprint": self.model_fingerprint,
                "operators": list(self.operators),
                "inputs_of": [list(preds) for preds in self.inputs_of],
            },
            "candidates": [_partition_json(c, self.operators) for c in self.considered],
            "target": self.target,
            "device": self.device,
            **({"ran_on": self.ran_on} if self.ran_on else {}),
            "backends": self.backends,
            "search": self.search,
            "precision": self.precision,
            **({"layout": self.layout} if self.layout != MODEL else {}),
            **({"float32_units": list(self.float32_units)} if self.float32_units else {}),
            **({"sixteen_bit_operators": list(self.sixteen_bit_operators)} if self.sixteen_bit_operators else {}),
            **(
                {"accuracy_budget": self.accuracy_budget, "measured_error": _finite_or_none(self.measured_error)}
                if self.accuracy_budget is not None
                else {}
            ),
            **({"why_chosen": self.why_chosen} if self.why_chosen else {}),
            **({"original_model": self.original_model} if self.original_model is not None else {}),
            "summed_cost_s": _finite_or_none(self.summed_cost_s),
            "partitions": [_partition_json(p, self.operators) for p in self.partitions],
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
            raise PlacementFileError(f"{origin}: the placement covers {len(self.operators)} operators but the model has {len(graph.ops)}")


def _partition_json(part: Partition, operators) -> dict:
    return {
        "backend": part.backend,
        "pattern": part.pattern,
        "operators": list(part.nodes),
        "ops": [operators[n] for n in part.nodes],
        "key": part.key,
        "cost": part.cost.to_json(),
    }


def _finite_or_none(value: float):
    return value if math.isfinite(value) else None


def load_placement(path: os.PathLike, pm=None) -> Placement:
    """Read a placement file; any problem is a ``PlacementFileError`` naming the file and the problem.
    A placement measured with other versions of the backends it uses than those installed (by ``pm``,
    default every plugin) is read with a warning naming each such backend and both versions."""
    path = Path(path)
    data = _read_json(path)
    if isinstance(data, dict) and data.get("format") == SHAPES_FORMAT:
        raise PlacementFileError(
            f"{path}: holds the placements of {len(data.get('placements') or [])} shapes; each shape's own is "
            "shape-K/placement.json beside it, and collage optimize MODEL --placement (or collage export) takes this file whole"
        )
    placement = placement_from_json(data, str(path))
    _tell_versions(str(path), placement, pm)
    return placement


def _tell_versions(origin: str, placement: Placement, pm) -> None:
    used = {part.backend for part in placement.partitions}
    recorded = {name: version for name, version in recorded_versions(placement.backends).items() if name in used}
    tell_other_versions(origin, recorded, installed_backends(pm), "its costs and choices may not hold here", made="measured")


def _read_json(path: Path) -> Any:
    if path.exists() and not path.is_file():  # a folder, or a device such as /dev/zero that reads without end
        raise PlacementFileError(f"{path}: {'a folder' if path.is_dir() else 'not a regular file'}, not a placement file")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PlacementFileError(f"{path}: no such placement file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlacementFileError(f"{path}: not JSON ({error})") from None
    except RecursionError:
        raise PlacementFileError(f"{path}: not a placement (its JSON is nested too deeply to read)") from None
    except OSError as error:
        raise PlacementFileError(f"{path}: cannot be read ({error.strerror})") from None


def holds_several_shapes(path: Optional[os.PathLike]) -> bool:
    """Whether ``path`` is a placements file of several shapes (``placements.json``), which a replay builds whole."""
    if path is None:
        return False
    try:
        data = _read_json(Path(path))
    except PlacementFileError:
        return False  # the replay reads it again and says what is wrong with it
    return isinstance(data, dict) and data.get("format") == SHAPES_FORMAT


def load_shape_placements(path: os.PathLike, pm=None) -> tuple[dict, list[Placement]]:
    """A placements file of several shapes: its shapes record (what :class:`~collage_core.outputs.dispatch.ShapeDispatch`
    reads) and each shape's placement, in order; any problem is a ``PlacementFileError`` naming the file."""
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict) or data.get("format") != SHAPES_FORMAT:
        raise PlacementFileError(f"{path}: not a placements file of several shapes ({SHAPES_FORMAT})")
    if data.get("version") != SHAPES_VERSION:
        raise PlacementFileError(f"{path}: version {data.get('version')!r} (this Collage reads {SHAPES_VERSION})")
    shapes, placements = data.get("shapes"), data.get("placements")
    profiles = shapes.get("profiles") if isinstance(shapes, dict) else None
    if not isinstance(placements, list) or not isinstance(profiles, list) or len(placements) != len(profiles) or not placements:
        raise PlacementFileError(f"{path}: must list the shapes and one placement for each")
    read = [placement_from_json(item, f"{path}: shape {index + 1}") for index, item in enumerate(placements)]
    for index, placement in enumerate(read):
        _tell_versions(f"{path}: shape {index + 1}", placement, pm)
    return shapes, read


def placement_from_json(data: Any, origin: str) -> Placement:
    def fail(problem: str):
        raise PlacementFileError(f"{origin}: {problem}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        fail(f"not a Collage placement (expected \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        fail(f"placement version {version!r} is not a number (this Collage reads version {VERSION})")
    if version != VERSION:
        fail(f"placement version {version} is not supported (this Collage reads version {VERSION})")
    try:
        model = data["model"]
        operators = tuple(str(op) for op in model["operators"])

        def partitions_of(items, what: str) -> list[Partition]:
            read = []
            if not isinstance(items, list):
                fail(f"{what}s must be a list")
            for number, item in enumerate(items):
                nodes = list(_numbers(item["operators"], f"{what} {number}'s operators", fail))
                if not nodes or any(not 0 <= n < len(operators) for n in nodes):
                    fail(f"{what} {number} names operators outside 0..{len(operators) - 1}")
                cost = _checked_cost(Cost.from_json(item["cost"]), f"{what} {number}", fail)
                read.append(Partition(str(item["backend"]), str(item["pattern"]), nodes, str(item["key"]), cost))
            return read

        partitions = partitions_of(data["partitions"], "partition")
        considered = partitions_of(data.get("candidates", []), "candidate")
        inputs_of = [list(_numbers(preds, "model.inputs_of", fail)) for preds in model.get("inputs_of", [])]
        if inputs_of and (len(inputs_of) != len(operators) or any(not 0 <= n < i for i, p in enumerate(inputs_of) for n in p)):
            fail("model.inputs_of does not list earlier operators for each operator")
        precision = str(data.get("precision", FP32))
        if precision not in PRECISIONS:
            fail(f"unknown precision {precision!r} (Collage knows {', '.join(PRECISIONS)})")
        layout = str(data.get("layout", MODEL))
        if layout not in LAYOUTS:
            fail(f"unknown layout {layout!r} (Collage knows {', '.join(LAYOUTS)})")
        float32_units = _numbers(data.get("float32_units", []), "float32_units", fail)
        sixteen_bit = _numbers(data.get("sixteen_bit_operators", []), "sixteen_bit_operators", fail)
        if float32_units and precision not in DTYPES:
            fail(f"float32_units given for a {precision} placement (they belong to bf16 or fp16 ones)")
        if any(not 0 <= n < len(operators) for n in sixteen_bit):
            fail(f"sixteen_bit_operators names operators outside 0..{len(operators) - 1}")
        placement = Placement(
            precision=precision,
            layout=layout,
            float32_units=float32_units,
            sixteen_bit_operators=sixteen_bit,
            accuracy_budget=_optional_number(data.get("accuracy_budget"), "accuracy_budget", fail),
            measured_error=_optional_number(data.get("measured_error"), "measured_error", fail),
            model_name=str(model["name"]),
            model_fingerprint=str(model["fingerprint"]),
            operators=operators,
            target=dict(data["target"]),
            device=str(data["device"]),
            ran_on=str(data.get("ran_on", "")),
            backends=dict(data["backends"]),
            search=str(data["search"]),
            partitions=tuple(partitions),
            inputs_of=inputs_of,
            considered=considered,
            why_chosen=str(data.get("why_chosen", "")),
            original_model=_original_model(data.get("original_model"), partitions, fail),
        )
    except PlacementFileError:
        raise
    except KeyError as error:
        fail(f"malformed placement (it has no {error.args[0]!r} field)")
    except (TypeError, ValueError, AttributeError, OverflowError) as error:
        fail(f"malformed placement (a field of the wrong kind: {error})")
    covered = sorted(n for p in placement.partitions for n in p.nodes)
    if covered != list(range(len(placement.operators))):
        fail("partitions do not cover every operator exactly once")
    return placement


def _original_model(value, partitions, fail) -> Optional[dict]:
    """The ``original_model`` record, checked against the partitions: such a placement is one partition
    of that engine's own session, and a partition of an engine's own session belongs to such a placement."""
    if value is None:
        if any(runs_original(part) for part in partitions):
            fail("a partition runs the original model file, but the placement does not say which file (original_model)")
        return None
    if not isinstance(value, dict) or not all(isinstance(value.get(field), str) for field in ("engine", "format", "sha256")):
        fail('original_model must say the engine, format and sha256 of the file its placement runs')
    if engine_of(partitions) != value["engine"]:
        fail(f"original_model says the file runs on {value['engine']}'s own session, but the partitions are not that one session")
    return {field: value[field] for field in ("engine", "format", "sha256")}


def _checked_cost(cost: Cost, where: str, fail) -> Cost:
    """A measured cost's numbers are finite and not negative: the search adds them up and compares them."""
    if cost.is_measured and not (0 <= cost.median_s < math.inf and 0 <= cost.spread_s < math.inf and cost.repeats >= 0):
        fail(
            f"{where}'s cost is measured as median {cost.median_s} s, spread {cost.spread_s} s, {cost.repeats} repeats; "
            "a measured cost is a finite, non-negative number of seconds"
        )
    return cost


def _numbers(value, field: str, fail) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        fail(f"{field} must be a list of non-negative integers")
    return tuple(value)


def _optional_number(value, field: str, fail) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        fail(f"{field} must be a non-negative number")
    return float(value)


def check_same_file(placement, imported, origin: str) -> None:
    """Refuse, in one line, a placement of an engine's own session made for another file than ``imported``'s."""
    recorded = placement.original_model
    if recorded is None:
        return
    engine = recorded["engine"]
    if imported.original is None:
        raise PlacementFileError(
            f"{origin}: runs the original {recorded['format'].upper()} file on {contender_name(engine)}, "
            f"but this model is {kind_of(imported)}: give Collage that file"
        )
    if imported.original.digest != recorded["sha256"]:
        module = (
            " (a PyTorch module's file is its ONNX export, which changes with its weights and with the PyTorch version)"
            if imported.source == "torch"
            else ""
        )
        raise PlacementFileError(
            f"{origin}: runs the original model file on {contender_name(engine)}, made from a file "
            f"of SHA-256 {recorded['sha256'][:12]}..., and this model's is {imported.original.digest[:12]}...{module}: "
            f"it is another model; optimize this one"
        )
