"""The options of :func:`collage_core.optimize`, held once in :class:`OptimizeOptions`: each field's default,
the rule its value must meet and a one-line help text. ``collage optimize`` builds its options from them
(see :func:`command_line_paths`) and hands the record it reads to ``optimize`` as the Python API does."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import attrs

from collage_core import tvm_compat
from collage_core.api_checks import (
    BACKEND_NAMES,
    BOOLEAN,
    PATH,
    ArgumentError,
    Rule,
    described,
    instance_of,
    number,
    one_of,
    refuse_unless_met,
    whole,
)
from collage_core.errors import CollageError
from collage_core.measure.in_turns import AFTER_PAUSE, LATENCIES, WARM
from collage_core.measure.timing import DEFAULT_BASELINE_LIMIT_S, MeasureSettings
from collage_core.model.accuracy_budget import DEFAULT_BLOCKS, NEEDS_REFERENCE, AccuracyBudgetError
from collage_core.model.dtypes import DTYPES, FP32, PRECISIONS
from collage_core.model.layout import ASKABLE
from collage_core.search.calibration import DEFAULT_ROUNDS
from collage_core.search.stage import OP_LEVEL_SEARCH, TWO_LEVEL
from collage_core.search.two_level import TwoLevelSettings


def _target_problem(value: Any) -> str:
    try:
        tvm_compat.make_target(value)
    except CollageError as error:
        return str(error)
    return ""


TARGET = Rule(_target_problem, names_itself=True, error=tvm_compat.TargetError)  # TVM's message names the target


def _tracker_problem(value: Any) -> str:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    return "" if host and port.isdigit() else f"must be HOST:PORT (a TVM RPC tracker, such as 127.0.0.1:9190), not {value!r}"


RPC_TRACKER = Rule(_tracker_problem)
SHAPES = Rule(lambda value: "" if isinstance(value, str) and "=" in value else f"must list sizes such as \"batch=1,8\", not {value!r}")
RPC_KEY = Rule(lambda value: "" if isinstance(value, str) and value.strip() else f"must be a server key (a non-empty str), not {value!r}")


def _no_limit_at_zero(limit: Any) -> Any:
    """A limit of 0 seconds is no limit (None), as on the command line: a baseline stopped at once measures nothing."""
    return None if limit == 0 and not isinstance(limit, bool) else limit


@attrs.frozen
class OptimizeOptions:
    """How :func:`collage_core.optimize` places a model; each field's metadata holds its rule and help.
    Made, it is checked (:meth:`check`): a record that exists holds options that can run together."""

    target: Any = described(
        None, TARGET, 'a TVM target: a name such as llvm or cuda, or JSON such as \'{"kind": "llvm"}\' (default: this CPU)'
    )
    backends: Optional[Sequence[str]] = described(
        None,
        BACKEND_NAMES.or_none(),
        "the backends to place on, comma-separated (default: every available one, "
        "except those `collage backends` says run only when named)",
    )
    placement: Any = described(
        None,
        PATH.or_none(),
        "replay this placement file instead of searching: build, verify "
        "and measure it, and nothing else (no baselines, no contest, unless compared)",
    )
    search: Optional[str] = described(
        None,
        one_of((OP_LEVEL_SEARCH, TWO_LEVEL)).or_none(),
        "two-level (default when a graph-level backend is "
        "selected) also evolves which op groups go to graph-level backends, scored by end-to-end latency",
    )
    two_level: TwoLevelSettings = described(TwoLevelSettings(), instance_of(TwoLevelSettings), "the two-level search's settings")
    cost_db: Any = described(None, PATH.or_none(), "cost database (default: $COLLAGE_COST_DB or the user cache)")
    output_dir: Any = described(
        None,
        PATH.or_none(),
        "folder for placement.json, the library and report.txt, the best placement so far saved there as the search goes",
    )
    settings: MeasureSettings = described(MeasureSettings(), instance_of(MeasureSettings), "how hard to measure")
    compare_backends: Optional[bool] = described(
        None,
        BOOLEAN.or_none(),
        "measure each backend alone and TVM's unpartitioned build beside the placement and "
        "time the closest in turns: the fastest by a margin is returned, the replayed placement whatever wins "
        "(default: when searching here, not when replaying nor measuring on other machines)",
    )
    latency: str = described(
        WARM,
        one_of(LATENCIES),
        "which latency the contest in turns chooses the result by: warm (default), back to back, as a busy server "
        "runs; or after-pause, the first run after the device sat idle a second, as requests that come now and then "
        "run; the report gives both (it applies where baselines are compared)",
    )
    baseline_limit_s: Optional[float] = described(
        DEFAULT_BASELINE_LIMIT_S,
        number(0).or_none(),
        "stop a baseline whose one run takes longer than this many seconds and report it as stopped (0 or None: no limit)",
        converter=_no_limit_at_zero,
    )
    calibration_rounds: int = described(
        DEFAULT_ROUNDS, whole(0), "re-searches of the op-level placement with per-partition costs measured end to end (0: none)"
    )
    tune_budget_s: float = described(
        0.0,
        number(0),
        "seconds for tuning, after the search, the kernels of the placement's costliest partitions with backends that "
        "tune (MetaSchedule for TVM's partitions: collage-metaschedule), into a database per device that later runs "
        "reuse; the search then runs again with the tuned kernels as candidates of their own (0: no tuning)",
    )
    verify: bool = described(
        True, BOOLEAN, "verify the outputs against the model's reference (ONNX Runtime or PyTorch) within the precision's tolerance"
    )
    show_progress: bool = described(
        True, BOOLEAN, "say what the run is doing on stderr", api_only="the command always says what it is doing"
    )
    precision: Optional[str] = described(
        None,
        one_of(PRECISIONS).or_none(),
        "fp32 (default: exact), bf16 (CPUs with AMX or AVX512-BF16, GPUs) or fp16 "
        "(GPUs): the model is converted once by TVM's mixed-precision pass and verified within that precision's "
        "tolerance; tf32 (GPUs): float32, with TF32 tensor-core kernels competing where a backend has them; a "
        "replayed placement keeps its own",
    )
    layout: Optional[str] = described(
        None,
        one_of(ASKABLE).or_none(),
        "auto (default: nhwc for a model with 2-d convolutions at bf16 or fp16 on CUDA, else model), model (2-d "
        "convolutions as the model writes them, NCHW for ONNX) or nhwc: every convolution channel-last (NHWC, OHWI "
        "weights) by TVM's ConvertLayout before placing, for tensor-core kernels at 16 bits (cuDNN's fused engines, "
        "CUTLASS); the layout changes left are placed and measured like any operator; a replayed placement keeps its own",
    )
    accuracy_budget: Optional[float] = described(
        None,
        number(0, above=True).or_none(),
        "with precision bf16 or fp16: the largest error allowed, as max |out - "
        "ref| over max |ref| against the float32 reference on the verification inputs; parts of the model go back to "
        "float32, chosen by measured error, until the placement holds it",
    )
    accuracy_blocks: int = described(DEFAULT_BLOCKS, whole(1), "with an accuracy budget: how many blocks the model's units are probed in")
    remeasure_invalid: bool = described(
        False,
        BOOLEAN,
        "measure again every candidate and placement whose stored "
        "cost is invalid (a build error, a crash, a hang) instead of reading it; "
        "transient failures are measured again anyway",
    )
    remeasure_held_up: bool = described(
        False,
        BOOLEAN,
        "measure again every candidate and placement whose stored cost was timed while other processes kept its "
        "threads waiting for a processor (held up: it may be too high) instead of reading it",
    )
    rpc_tracker: Optional[str] = described(
        None,
        RPC_TRACKER.or_none(),
        "measure on the servers of a TVM RPC tracker at HOST:PORT, every free one at once, instead of here: candidates "
        "and placements are built here for the servers' CPU (read from a server unless --target is given) and timed "
        "and verified there; with --rpc-key",
    )
    rpc_key: Optional[str] = described(None, RPC_KEY.or_none(), "with --rpc-tracker: the key the servers are registered under")
    shapes: Optional[str] = described(
        None,
        SHAPES.or_none(),
        "optimize an ONNX model with symbolic dimensions for each shape listed, by dimension (\"batch=1,8 sequence=128,512\": "
        "every combination) or by input (\"input_ids=1x128,8x512\"), into one library that runs a call on its shape's "
        "placement, or on the smallest listed shape that covers it, padded where the model allows it; with a placement of one "
        "shape (a --shapes run's shape-K/placement.json), the one shape to replay it at",
    )

    def __attrs_post_init__(self):
        self.check()

    @classmethod
    def given(cls, options: Optional["OptimizeOptions"], chosen: Mapping[str, Any]) -> "OptimizeOptions":
        """``options`` (default: every default) with the fields named in ``chosen`` set as given there."""
        unknown = sorted(set(chosen) - set(attrs.fields_dict(cls)))
        if unknown:
            raise TypeError(f"optimize() got an unexpected keyword argument {unknown[0]!r}")
        if options is None:
            return cls(**chosen)
        refuse_unless_met("options", instance_of(cls), options)
        return attrs.evolve(options, **chosen)

    def check(self) -> None:
        """Each field meets its rule (a nested record's fields theirs), and the fields agree with each
        other; else the first problem, in one line naming the field."""
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            refuse_unless_met(field.name, field.metadata["rule"], value)
            if attrs.has(type(value)):
                for inner in attrs.fields(type(value)):
                    if "rule" in inner.metadata:
                        refuse_unless_met(f"{field.name}.{inner.name}", inner.metadata["rule"], getattr(value, inner.name))
        if self.latency == AFTER_PAUSE and not self.compares_backends():
            raise ArgumentError(
                "--latency after-pause chooses in the contest with the baselines, which this run does not measure: add --compare"
            )
        if (self.rpc_tracker is None) != (self.rpc_key is None):
            raise ArgumentError("--rpc-tracker and --rpc-key go together: the tracker's address and the key of its servers")
        if self.accuracy_budget is not None:
            if self.placement is not None:
                raise AccuracyBudgetError(
                    "--accuracy-budget searches; a placement file is replayed as it was made, with the units it kept in float32"
                )
            precision = self.precision or FP32
            if precision not in DTYPES:
                raise AccuracyBudgetError(
                    f"an accuracy budget needs --precision bf16 or fp16 (at {precision} there is nothing to give back)"
                )
            if not self.verify:
                raise AccuracyBudgetError(NEEDS_REFERENCE)

    def compares_backends(self) -> bool:
        """Whether the baselines are measured: as asked, or by default when searching here, not when replaying
        nor measuring on other machines (there ``--compare`` asks for them: each is built here and timed on a server,
        and the contest in turns runs on one server)."""
        if self.compare_backends is None:
            return self.placement is None and self.rpc_tracker is None
        return self.compare_backends


def keyword_signature(function: Callable) -> inspect.Signature:
    """``function``'s signature with its ``**chosen`` spelt out as one keyword per field, at the field's
    default: what ``help(collage_core.optimize)`` shows."""
    signature = inspect.signature(function)
    kept = [parameter for parameter in signature.parameters.values() if parameter.kind is not parameter.VAR_KEYWORD]
    keywords = [
        inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default) for field in attrs.fields(OptimizeOptions)
    ]
    return signature.replace(parameters=kept + keywords)


def field_at(path: str) -> attrs.Attribute:
    """The field a dotted path names: ``"precision"``, or a nested record's field such as ``"two_level.population"``."""
    record, field = OptimizeOptions, None
    for name in path.split("."):
        if record is None:
            raise KeyError(path)
        field = attrs.fields_dict(record)[name]
        record = type(field.default) if attrs.has(type(field.default)) else None
    return field


def command_line_paths() -> Iterator[str]:
    """Every option the ``collage optimize`` command takes, as the path of its field: the record's own fields
    (those marked ``api_only`` aside) and the nested records' fields that have a help text."""
    for field in attrs.fields(OptimizeOptions):
        if attrs.has(type(field.default)):
            yield from (f"{field.name}.{inner.name}" for inner in attrs.fields(type(field.default)) if "help" in inner.metadata)
        elif "api_only" not in field.metadata:
            yield field.name


def with_values(values: Mapping[str, Any]) -> OptimizeOptions:
    """The record with each field a path of ``values`` names set to its value, every other at its default."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        field_at(path)  # an unknown path is a KeyError here
        outer, _, inner = path.partition(".")
        if inner:
            nested.setdefault(outer, {})[inner] = value
        else:
            top[outer] = value
    for outer, inner_values in nested.items():
        top[outer] = attrs.evolve(top.get(outer, attrs.fields_dict(OptimizeOptions)[outer].default), **inner_values)
    return OptimizeOptions(**top)
