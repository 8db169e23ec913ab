"""The ``collage`` command."""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from collage_core import optimizer, tvm_compat
from collage_core.api_checks import TWO_LEVEL_LEAST, count_problem, number_problem, unwritable_because
from collage_core.backends import discover_backends
from collage_core.build.deploy import carried_dir
from collage_core.errors import CollageError, interrupt_within
from collage_core.inspection import inspect_model, render_inspection
from collage_core.measure.timing import DEFAULT_BASELINE_LIMIT_S, MAX_BUILD_WORKERS, MeasureSettings
from collage_core.model.precision import FP32, PRECISIONS
from collage_core.outputs.explain import explain
from collage_core.outputs.mlf_export import export_mlf
from collage_core.outputs.output_folder import safe_file_name
from collage_core.outputs.placement_file import load_placement
from collage_core.outputs.report import format_table, render_report
from collage_core.outputs.result import SEARCH_PICTURE, SEARCHED_PLACEMENT_FILE
from collage_core.outputs.show import write_picture
from collage_core.plugins import get_plugin_manager
from collage_core.search.calibration import DEFAULT_ROUNDS
from collage_core.search.two_level import TwoLevelSettings

DEFAULT_TWO_LEVEL = TwoLevelSettings()
EXIT_ERROR = 1
EXIT_NUMERICS = 3
EXIT_WARNINGS = 4
# A file system full (or over quota) or read-only: one line naming the file, whatever was writing it.
STORAGE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    signal.signal(signal.SIGTERM, _terminated)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>` prints where every thread is, to stderr
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stderr without a descriptor
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    warnings = _WarningsKept()
    logging.getLogger("collage").addHandler(warnings)
    try:
        status = args.command(args)
        sys.stdout.flush()  # a reader that went away (collage show | head) shows here, not as Python exits
        if warnings.messages:
            print(f"collage: {len(warnings.messages)} warning(s) in this run, the first: {warnings.messages[0]}"
                  + ("" if getattr(args, "strict", False) else " (--strict makes warnings fail the run)"), file=sys.stderr)
            if getattr(args, "strict", False) and status == 0:
                return EXIT_WARNINGS
        return status
    except CollageError as error:
        print(f"collage: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Terminated:
        print("collage: terminated; costs measured so far are kept in the cost database", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("collage: interrupted; costs measured so far are kept in the cost database", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # Stop quietly, as Unix tools do, with the status of a process SIGPIPE ended; what is left to print goes nowhere.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as error:
        if error.errno not in STORAGE_ERRORS:
            return _interrupted(error)
        print(f"collage: error: writing {error.filename or 'a file'} failed: {error.strerror}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:
        return _interrupted(error)
    finally:
        logging.getLogger("collage").removeHandler(warnings)


def _interrupted(error: Exception) -> int:
    """The exit of a run that an interrupt stopped where it surfaced as another error (SIGTERM while a
    C extension imports gives a ``SystemError`` over ``Terminated``); any other error is raised again."""
    interrupt = interrupt_within(error)
    if interrupt is None:
        raise error
    if isinstance(interrupt, Terminated):
        print("collage: terminated; costs measured so far are kept in the cost database", file=sys.stderr)
        return 128 + signal.SIGTERM
    print("collage: interrupted; costs measured so far are kept in the cost database", file=sys.stderr)
    return 128 + signal.SIGINT


class _WarningsKept(logging.Handler):
    """Prints Collage's warnings (a plugin that failed to load, a check or hook that raised) as they
    come, and keeps them for the summary at the end of the run."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.messages.append(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds like an interrupt (workers stopped, files closed)."""


def _terminated(signum, frame):
    raise Terminated()


def _whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        problem = count_problem(value, least)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return whole


def _number(least: float = 0.0, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number of at least ``least`` (``above``: more than it)."""
    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        problem = number_problem(value, least, above)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return number


def _target(text: str) -> str:
    """An argparse type: a target TVM makes (a name such as llvm or cuda, or JSON)."""
    try:
        tvm_compat.make_target(text)
    except CollageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collage", description="Place each part of a model on the fastest backend.")
    commands = parser.add_subparsers()

    backends = commands.add_parser("backends", help="list installed backends, whether they run here, and why not")
    backends.set_defaults(command=_backends)

    strict = argparse.ArgumentParser(add_help=False)
    strict.add_argument("--strict", action="store_true",
                        help=f"exit with status {EXIT_WARNINGS} when anything warned (a plugin that failed to load, "
                             "a pattern check or hook that raised), even if the run succeeded")

    inspect = commands.add_parser("inspect", parents=[strict], help="the imported Relax and what each backend's patterns "
                                  "match and refuse, without measuring")
    inspect.add_argument("model", help="an ONNX file")
    inspect.add_argument("--target", type=_target, default=None, help="a TVM target as JSON, or cuda (default: this CPU)")
    inspect.add_argument("--backends", default=None, help="comma-separated backends (default: every available one)")
    inspect.add_argument("--no-relax", action="store_true", help="leave out the imported Relax")
    inspect.add_argument("--candidates", action="store_true", help="list every candidate with its operators")
    inspect.add_argument("--precision", choices=PRECISIONS, default=FP32, help="inspect the model converted to this precision")
    inspect.set_defaults(command=_inspect)

    optimize = commands.add_parser("optimize", parents=[strict], help="measure, search, build and verify a placement for a model")
    optimize.add_argument("model", help="an ONNX file")
    optimize.add_argument("--target", type=_target, default=None, help='a TVM target as JSON, e.g. \'{"kind": "llvm"}\' (default: this CPU)')
    optimize.add_argument("--backends", default=None, help="comma-separated backends to use (default: every available one, except those `collage backends` says run only when named)")
    optimize.add_argument("-o", "--output", default=None,
                          help="directory for placement.json, the library and report.txt (default: collage-out/MODEL, "
                               "and collage-out/MODEL/replay with --placement)")
    optimize.add_argument("--placement", default=None,
                          help="replay this placement file instead of searching: build, verify and measure it, and "
                               "nothing else (no baselines, no contest, unless --compare)")
    optimize.add_argument("--compare", action="store_true",
                          help="with --placement: measure the baselines too and time the closest in turns beside the "
                               "replayed placement (which is returned whatever wins)")
    optimize.add_argument("--cost-db", default=None, help="cost database (default: $COLLAGE_COST_DB or the user cache)")
    optimize.add_argument("--remeasure-invalid", action="store_true",
                          help="measure again every candidate and placement whose stored cost is invalid (a build error, "
                               "a crash, a hang) instead of reading it; transient failures are measured again anyway")
    optimize.add_argument("--search", choices=["op-level", "two-level"], default=None,
                          help="two-level (default when a graph-level backend is selected) also evolves which op groups "
                          "go to graph-level backends, scored by end-to-end latency")
    optimize.add_argument("--budget", type=_number(0), default=DEFAULT_TWO_LEVEL.budget_s, help="two-level search budget: seconds of end-to-end measurement, those read from the cost database counted at what they took")
    optimize.add_argument("--population", type=_whole(TWO_LEVEL_LEAST["population"]), default=DEFAULT_TWO_LEVEL.population, help="two-level population")
    optimize.add_argument("--generations", type=_whole(TWO_LEVEL_LEAST["generations"]), default=DEFAULT_TWO_LEVEL.generations, help="two-level generations")
    optimize.add_argument("--patience", type=_whole(TWO_LEVEL_LEAST["patience"]), default=DEFAULT_TWO_LEVEL.patience,
                          help="two-level: stop after this many generations without a faster placement")
    optimize.add_argument("--min-gain", type=_number(0), default=DEFAULT_TWO_LEVEL.min_gain, metavar="F",
                          help="two-level: a generation counts as faster only when its best beats the one before by more "
                               "than the measurements' spread and by this fraction of it (default %(default)g)")
    optimize.add_argument("--predict-margin", type=_number(0), default=DEFAULT_TWO_LEVEL.predict_margin, metavar="F",
                          help="two-level: a genome whose latency, predicted from the placements measured so far, is over "
                               "the best by more than this fraction is not built (default %(default)g)")
    optimize.add_argument("--build-every-genome", action="store_true",
                          help="two-level: build and measure every genome, predicting none")
    optimize.add_argument("--seed", type=int, default=0, help="two-level random seed (same seed and costs, same result)")
    optimize.add_argument("--no-compare", action="store_true", help="do not build and measure single-backend baselines "
                          "(the default with --placement)")
    optimize.add_argument("--baseline-limit", type=_number(0), default=DEFAULT_BASELINE_LIMIT_S, metavar="S",
                          help="stop a baseline whose one run takes longer than S seconds and report it as "
                               f"stopped (default {DEFAULT_BASELINE_LIMIT_S:g}; 0: no limit)")
    optimize.add_argument(
        "--calibration-rounds", type=_whole(0), default=DEFAULT_ROUNDS,
        help="re-searches of the op-level placement with per-partition costs measured end to end (0: none)",
    )
    optimize.add_argument("--jobs", type=_whole(0), default=0, metavar="N",
                          help="build N candidates at once (default 0: half the cores, at most "
                               f"{MAX_BUILD_WORKERS}); they are timed one at a time after the builds")
    optimize.add_argument("--precision", choices=PRECISIONS, default=None,
                          help="fp32 (default: exact), bf16 (CPUs with AMX or AVX512-BF16, GPUs) or fp16 (GPUs): the model "
                               "is converted once by TVM's mixed-precision pass and verified within that precision's "
                               "tolerance; tf32 (GPUs): float32, with TF32 tensor-core kernels competing where a backend "
                               "has them; a replayed placement keeps its own")
    optimize.add_argument("--accuracy-budget", type=_number(0, above=True), default=None, metavar="E",
                          help="with --precision bf16 or fp16: the largest error allowed, as max |out - ref| over max |ref| "
                               "against the float32 reference on the verification inputs; parts of the model go back "
                               "to float32, chosen by measured error, until the placement holds it")
    optimize.add_argument("--no-cuda-graphs", action="store_true",
                          help="on a CUDA target, build placements that launch kernel by kernel instead of replaying "
                               "CUDA graphs (by default the report gives the placement's latency both ways)")
    optimize.set_defaults(command=_optimize)

    export = commands.add_parser("export", parents=[strict], help="rebuild a placement (no measuring), export it for "
                                 "deployment, and load and run what was written once in a new process")
    export.add_argument("model", help="the ONNX file the placement was made for")
    export.add_argument("--placement", required=True, help="a placement.json written by collage optimize")
    export.add_argument("--format", choices=["mlf"], default="mlf", help="mlf: Model Library Format tar (default)")
    export.add_argument("-o", "--output", required=True, help="the tar to write, e.g. model.tar (one that does not load "
                        "and run is left as model.tar.partial)")
    export.add_argument("--target", type=_target, default=None, help="a TVM target as JSON (default: this CPU)")
    export.set_defaults(command=_export)

    show = commands.add_parser("show", help="draw a placement, or explain why each partition was chosen")
    show.add_argument("placement", help="a placement.json written by collage optimize")
    show.add_argument("-o", "--output", default=None, help="write the picture here: .svg, .png, .html (picture and "
                      "explanation) or .dot (without -o: print the explanation)")
    show.add_argument("--explain", action="store_true", help="with -o, print the explanation as well")
    show.set_defaults(command=_show)
    return parser


def _backends(args) -> int:
    pm = get_plugin_manager()
    rows = []
    for name, info in discover_backends(pm).items():
        availability = "yes" if info.availability.available else f"no: {info.availability.reason}"
        default = info.backend.chosen_by_default
        if info.availability.available and not default:
            availability = f"yes, when named (--backends ...,{name})"
        elif info.availability.available and not isinstance(default, bool):
            named_on = [kind for kind in info.backend.device_kinds if kind not in default]
            availability = (f"yes, by default on {','.join(default)}; on {','.join(named_on)} when named "
                            f"(--backends ...,{name})")
        backend = info.backend
        rows.append([name, backend.kind, ",".join(backend.device_kinds), backend.version, info.plugin, availability])
    print(format_table(["backend", "kind", "devices", "version", "plugin", "available"], rows))
    for failure in pm.failures:
        print(f"plugin {failure.name} failed: {failure.reason}")
    return 0


def default_output(model: str) -> Path:
    """``collage-out/<the model file's name>``, that name as a file name that stays in ``collage-out``
    (a model file called ``...onnx`` has the stem ``..``)."""
    return Path("collage-out") / safe_file_name(Path(model).stem)


def _optimize(args) -> int:
    if args.compare and not args.placement:
        raise CollageError("--compare is for --placement: a search compares its placement with the baselines unless --no-compare")
    if args.compare and args.no_compare:
        raise CollageError("--compare and --no-compare contradict each other")
    output = Path(args.output) if args.output else default_output(args.model)
    if args.placement and not args.output:
        output = output / "replay"  # a replay leaves the searched run's files as they are
    result = optimizer.optimize(
        args.model,
        target=args.target,
        backends=args.backends.split(",") if args.backends else None,
        placement=args.placement,
        cost_db=args.cost_db,
        output_dir=output,
        compare_backends=args.compare or (not args.placement and not args.no_compare),
        baseline_limit_s=args.baseline_limit or None,
        calibration_rounds=args.calibration_rounds,
        settings=MeasureSettings(build_workers=args.jobs, cuda_graphs=not args.no_cuda_graphs),
        search=args.search,
        precision=args.precision,
        accuracy_budget=args.accuracy_budget,
        remeasure_invalid=args.remeasure_invalid,
        two_level=TwoLevelSettings(
            population=args.population, generations=args.generations, patience=args.patience, budget_s=args.budget,
            min_gain=args.min_gain, seed=args.seed, predict_margin=None if args.build_every_genome else args.predict_margin,
        ),
    )
    print(render_report(result))
    saved = [output / "placement.json", output / f"{result.model.name}.so", output / "report.txt"]
    saved += [output / SEARCH_PICTURE] * (output / SEARCH_PICTURE).exists()
    saved += [f"{output / SEARCHED_PLACEMENT_FILE} (the search's placement, which lost the contest; replay it with "
              f"--placement)"] * (result.searched_placement is not None)
    carried = carried_dir(output / f"{result.model.name}.so")
    saved += [f"{carried}/ (the native kernels the library carries)"] * carried.is_dir()
    print(f"\nsaved: {', '.join(str(path) for path in saved)}")
    if result.verification is not None and not result.verification.passed:
        return EXIT_NUMERICS
    return 0


def _inspect(args) -> int:
    inspection = inspect_model(args.model, target=args.target,
                               backends=args.backends.split(",") if args.backends else None, precision=args.precision)
    print(render_inspection(inspection, show_relax=not args.no_relax, show_candidates=args.candidates))
    return 0


def _export(args) -> int:
    problem = unwritable_because(Path(args.output).parent)
    if problem:
        raise CollageError(f"{args.output}: cannot be written ({problem}); nothing was built")
    backends = sorted({p.backend for p in load_placement(args.placement).partitions})
    # The replay's library and files are only a means to the tar: kept in a folder removed however the export ends.
    with tempfile.TemporaryDirectory(prefix="collage-export-") as replay:
        result = optimizer.optimize(
            args.model, target=args.target, backends=backends, placement=args.placement, compare_backends=False,
            show_progress=False, output_dir=replay,
        )
        path = export_mlf(result, args.output, check_inputs=result.model.random_inputs())
    print(f"saved: {path} (Model Library Format; loaded and run once in a new process; load it with "
          "collage_core.outputs.mlf.load_mlf)")
    if result.verification is not None and not result.verification.passed:
        print(result.verification.describe(), file=sys.stderr)
        return EXIT_NUMERICS
    return 0


def _show(args) -> int:
    placement = load_placement(args.placement)
    if args.output:
        written = write_picture(placement, args.output, origin=args.placement)
        print(f"saved: {written}")
    if args.explain or not args.output:
        print(explain(placement))
    return 0


if __name__ == "__main__":
    sys.exit(main())
