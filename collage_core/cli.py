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

import attrs

from collage_core import optimizer
from collage_core.api_checks import BOOLEAN, Rule, unwritable_because
from collage_core.backends import discover_backends
from collage_core.build.deploy import carried_dir
from collage_core.errors import CollageError, interrupt_within, note_interrupt, signals_noted
from collage_core.inspection import inspect_model, render_inspection
from collage_core.measure import remote
from collage_core.measure.progress import Narrator
from collage_core.model.dtypes import FP32, PRECISIONS
from collage_core.model.layout import ASKABLE, AUTO
from collage_core.options import OptimizeOptions, command_line_paths, field_at, with_values
from collage_core.outputs import output_folder
from collage_core.outputs.dispatch import ShapeDispatch
from collage_core.outputs.explain import explain
from collage_core.outputs.mlf_export import export_mlf
from collage_core.outputs.placement_file import holds_several_shapes, load_placement, load_shape_placements
from collage_core.outputs.profiled_result import PLACEMENTS_FILE, ProfiledModel, render_profiles_report
from collage_core.outputs.report import format_table, render_report
from collage_core.outputs.result import SEARCH_PICTURE, SEARCHED_PLACEMENT_FILE
from collage_core.outputs.shape_differences import placement_differences
from collage_core.outputs.show import write_picture
from collage_core.plugins import get_plugin_manager

EXIT_ERROR = 1
EXIT_NUMERICS = 3
EXIT_WARNINGS = 4
# A file system full (or over quota) or read-only: one line naming the file, whatever was writing it.
STORAGE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@signals_noted()
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    terminated_before = signal.signal(signal.SIGTERM, _terminated)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>` prints where every thread is, to stderr
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stderr without a descriptor
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    warnings = _WarningsKept()
    logging.getLogger("collage").addHandler(warnings)
    try:
        status = args.command(args)
        sys.stdout.flush()  # a reader that went away (collage show | head) shows here, not as Python exits
        if warnings.messages:
            print(
                f"collage: {len(warnings.messages)} warning(s) in this run, the first: {warnings.messages[0]}"
                + ("" if getattr(args, "strict", False) else " (--strict makes warnings fail the run)"),
                file=sys.stderr,
            )
            if getattr(args, "strict", False) and status == 0:
                return EXIT_WARNINGS
        return status
    except CollageError as error:
        if interrupt_within(error) is not None:  # an error a signal caused, in a step that words its errors for users
            return _interrupted(error)
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
        signal.signal(signal.SIGTERM, terminated_before)


def _interrupted(error: BaseException) -> int:
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
    raise note_interrupt(Terminated())


def _option(parser, path: str, *flags: str, default_said: str = "", **how) -> None:
    """The option ``flags`` for the field ``path`` of :class:`OptimizeOptions` (``"two_level.population"`` for a
    nested record's): its default, help and check are the field's (``default_said``: the command's own default, said
    in the help); the parsed value is kept under ``path``.
    A field that is False by default is a switch that sets it; one that is True, a ``--no-...`` switch
    that clears it; any other reads a value and refuses one its rule does (argparse's usage error)."""
    field = field_at(path)
    rule, help = field.metadata["rule"], field.metadata["help"]
    if rule is BOOLEAN:
        action = "store_false" if field.default else "store_true"
        parser.add_argument(
            *flags, dest=path, action=action, default=field.default, help=f"do not {help}" if field.default else help, **how
        )
        return
    if default_said:
        help = f"{help} (default: {default_said})"
    elif field.default is not None and "default" not in help:
        help = f"{help} (default: %(default)s)"
    if rule.choices is None:
        how.setdefault("metavar", flags[-1].lstrip("-").upper().replace("-", "_"))
    parser.add_argument(*flags, dest=path, type=_read_by(rule), default=field.default, help=help, choices=rule.choices, **how)


def _read_by(rule: Rule) -> Callable[[str], object]:
    """An argparse type: the value the text stands for, refused with the rule's problem."""

    def read(text: str) -> object:
        try:
            value = rule.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        problem = rule.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return read


def options_from(args: argparse.Namespace) -> OptimizeOptions:
    """The options ``collage optimize`` was given, as the record the Python API takes (every option
    left out at the record's default)."""
    return with_values({path: getattr(args, path) for path in command_line_paths()})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="collage", description="Place each part of a model on the fastest backend.")
    commands = parser.add_subparsers()

    backends = commands.add_parser("backends", help="list installed backends, whether they run here, and why not")
    backends.add_argument("--rpc-tracker", metavar="HOST:PORT", help="list the servers of this TVM RPC tracker and what each key runs")
    backends.add_argument("--rpc-key", metavar="KEY", help="with --rpc-tracker: only the servers of this key")
    backends.set_defaults(command=_backends)

    strict = argparse.ArgumentParser(add_help=False)
    strict.add_argument(
        "--strict",
        action="store_true",
        help=f"exit with status {EXIT_WARNINGS} when anything warned (a plugin that failed to load, "
        "a pattern check or hook that raised), even if the run succeeded",
    )

    inspect = commands.add_parser(
        "inspect", parents=[strict], help="the imported Relax and what each backend's patterns match and refuse, without measuring"
    )
    inspect.add_argument("model", help="an ONNX file")
    _option(inspect, "target", "--target")
    _option(inspect, "backends", "--backends", metavar="A,B")
    inspect.add_argument("--no-relax", action="store_true", help="leave out the imported Relax")
    inspect.add_argument("--candidates", action="store_true", help="list every candidate with its operators")
    inspect.add_argument("--precision", choices=PRECISIONS, default=FP32, help="inspect the model converted to this precision")
    inspect.add_argument(
        "--layout", choices=ASKABLE, default=AUTO, help="inspect the model with its convolutions in this layout (auto: as optimize chooses)"
    )
    inspect.add_argument(
        "--shapes",
        metavar="SIZES",
        help="inspect a model with symbolic dimensions at this one shape, written as optimize's --shapes (batch=1 sequence=128)",
    )
    inspect.set_defaults(command=_inspect)

    optimize = commands.add_parser("optimize", parents=[strict], help="measure, search, build and verify a placement for a model")
    optimize.add_argument("model", help="an ONNX file")
    _option(optimize, "target", "--target")
    _option(optimize, "backends", "--backends", metavar="A,B")
    _option(
        optimize,
        "output_dir",
        "-o",
        "--output",
        metavar="FOLDER",
        default_said="collage-out/MODEL, and collage-out/MODEL/replay with --placement",
    )
    _option(optimize, "placement", "--placement", metavar="FILE")
    compare = optimize.add_mutually_exclusive_group()
    compare_help = field_at("compare_backends").metadata["help"]
    compare.add_argument("--compare", dest="compare_backends", action="store_const", const=True, default=None, help=compare_help)
    compare.add_argument("--no-compare", dest="compare_backends", action="store_const", const=False, help=f"do not {compare_help}")
    _option(optimize, "cost_db", "--cost-db", metavar="FILE")
    _option(optimize, "remeasure_invalid", "--remeasure-invalid")
    _option(optimize, "remeasure_held_up", "--remeasure-held-up")
    _option(optimize, "search", "--search")
    _option(optimize, "two_level.budget_s", "--budget", metavar="S")
    _option(optimize, "two_level.population", "--population", metavar="N")
    _option(optimize, "two_level.generations", "--generations", metavar="N")
    _option(optimize, "two_level.patience", "--patience", metavar="N")
    _option(optimize, "two_level.min_gain", "--min-gain", metavar="F")
    _option(optimize, "two_level.predict_margin", "--predict-margin", metavar="F")
    optimize.add_argument(
        "--build-every-genome",
        dest="two_level.predict_margin",
        action="store_const",
        const=None,
        default=argparse.SUPPRESS,
        help=field_at("two_level.predict_margin").metadata["help_for_none"],
    )
    _option(optimize, "two_level.seed", "--seed", metavar="N")
    _option(optimize, "latency", "--latency")
    _option(optimize, "baseline_limit_s", "--baseline-limit", metavar="S")
    _option(optimize, "calibration_rounds", "--calibration-rounds", metavar="N")
    _option(optimize, "tune_budget_s", "--tune-budget-s", metavar="S")
    _option(optimize, "settings.build_workers", "--jobs", metavar="N")
    _option(optimize, "precision", "--precision")
    _option(optimize, "layout", "--layout")
    _option(optimize, "accuracy_budget", "--accuracy-budget", metavar="E")
    _option(optimize, "accuracy_blocks", "--accuracy-blocks", metavar="N")
    _option(optimize, "verify", "--no-verify")
    _option(optimize, "settings.cuda_graphs", "--no-cuda-graphs")
    _option(optimize, "rpc_tracker", "--rpc-tracker", metavar="HOST:PORT")
    _option(optimize, "rpc_key", "--rpc-key", metavar="KEY")
    _option(optimize, "shapes", "--shapes", metavar="SIZES")
    optimize.set_defaults(command=_optimize)

    export = commands.add_parser(
        "export",
        parents=[strict],
        help="rebuild a placement (no search: its candidates are not measured), export it for deployment, and load and run what was written once in a new process",
    )
    export.add_argument("model", help="the ONNX file the placement was made for")
    export.add_argument("--placement", required=True, help="a placement.json written by collage optimize")
    export.add_argument("--format", choices=["mlf"], default="mlf", help="mlf: Model Library Format tar (default)")
    export.add_argument(
        "-o",
        "--output",
        required=True,
        help="the tar to write, e.g. model.tar (one that does not load and run is left as model.tar.partial)",
    )
    _option(export, "target", "--target")
    export.add_argument(
        "--shapes",
        metavar="SIZES",
        help="with a placement of one shape of a model with symbolic dimensions (a --shapes run's shape-K/placement.json): that shape",
    )
    export.set_defaults(command=_export)

    show = commands.add_parser("show", help="draw a placement, or explain why each partition was chosen")
    show.add_argument("placement", help="a placement.json written by collage optimize")
    show.add_argument(
        "-o",
        "--output",
        default=None,
        help="write the picture here: .svg, .png, .html (picture and explanation) or .dot (without -o: print the explanation)",
    )
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
            availability = f"yes, by default on {','.join(default)}; on {','.join(named_on)} when named (--backends ...,{name})"
        backend = info.backend
        rows.append([name, backend.kind, ",".join(backend.device_kinds), backend.version, info.plugin, availability])
    print(format_table(["backend", "kind", "devices", "version", "plugin", "available"], rows))
    for failure in pm.failures:
        print(f"plugin {failure.name} failed: {failure.reason}")
    if args.rpc_tracker:
        print(f"\nservers of the RPC tracker at {args.rpc_tracker}:")
        print(remote.describe(args.rpc_tracker, args.rpc_key))
        for kind, label in (("cpu", "CPU targets"), ("cuda", "--target cuda")):
            chosen = [info for info in discover_backends(pm).values() if kind in info.backend.device_kinds]
            names = [info.name for info in remote.measurable_remotely(pm, chosen, lambda line: None)]
            print(f"backends measurable there ({label}; when available here): {', '.join(names)}")
    return 0


def default_output(model: str) -> Path:
    """``collage-out/<the model file's name>``, that name as a file name that stays in ``collage-out``
    (a model file called ``...onnx`` has the stem ``..``), or beside it when another file of that name
    holds it (see :func:`collage_core.outputs.output_folder.default_for`)."""
    return output_folder.default_for(model)


def _optimize(args) -> int:
    options = options_from(args)
    if options.compare_backends and options.placement is None and options.rpc_tracker is None:
        raise CollageError(
            "--compare is for --placement or --rpc-tracker: a search here compares its placement with the baselines unless --no-compare"
        )
    if options.output_dir is not None and str(options.output_dir) == "":
        raise CollageError("-o names an empty folder name: name a folder, or leave -o out for collage-out/MODEL")
    output = Path(options.output_dir) if options.output_dir else default_output(args.model)
    if options.placement and not options.output_dir:
        output = output / "replay"  # a replay leaves the searched run's files as they are
    taken = output_folder.named_for(args.model)
    if not options.output_dir and output.parts[:2] != taken.parts:  # another model file of this name has the plain folder
        print(f"{taken} holds the outputs of {output_folder.recorded_model_file(taken)}: writing to {output}", file=sys.stderr)
    result = optimizer.optimize(args.model, options=attrs.evolve(options, output_dir=output))
    if isinstance(result, ProfiledModel):
        return _shapes_saved(result, output)
    print(render_report(result))
    library = output_folder.library_file(output, result.model.name)
    saved = [output / "placement.json", library, output / "report.txt", output / "results.json"]
    saved += [output / SEARCH_PICTURE] * result.drew_search
    saved += [f"{output / SEARCHED_PLACEMENT_FILE} (the search's placement, which lost the contest; replay it with --placement)"] * (
        result.searched_placement is not None
    )
    carried = carried_dir(library)
    saved += [f"{carried}/ (the native kernels the library carries)"] * carried.is_dir()
    print(f"\nsaved: {', '.join(str(path) for path in saved)}")
    if result.verification is not None and not result.verification.passed:
        return EXIT_NUMERICS
    return 0


def _shapes_saved(result: ProfiledModel, output: Path) -> int:
    print(render_profiles_report(result))
    library = output_folder.library_file(output, result.name)
    saved = [output / PLACEMENTS_FILE, library, output / "report.txt", output / "results.json"]
    saved += [f"{output}/shape-1/ to shape-{len(result.shapes)}/ (each shape's own run)"]
    print(f"\nsaved: {', '.join(str(path) for path in saved)}")
    return 0 if result.verified else EXIT_NUMERICS


def _inspect(args) -> int:
    inspection = inspect_model(
        args.model, target=args.target, backends=args.backends, precision=args.precision, layout=args.layout, shapes=args.shapes
    )
    print(render_inspection(inspection, show_relax=not args.no_relax, show_candidates=args.candidates))
    return 0


def _export(args) -> int:
    if Path(args.output).is_dir():
        raise CollageError(f"{args.output}: is a folder; -o names the tar to write (-o model.tar); nothing was built")
    output_folder.refuse_special_file(args.output)
    for given, what in ((args.model, "the model"), (args.placement, "the placement")):
        if Path(given).exists() and Path(args.output).exists() and Path(given).samefile(args.output):
            raise CollageError(f"{args.output}: is {what} to export; name another file for the tar; nothing was built")
    problem = unwritable_because(Path(args.output).parent)
    if problem:
        raise CollageError(f"{args.output}: cannot be written ({problem}); nothing was built")
    if holds_several_shapes(args.placement):
        placements = load_shape_placements(args.placement)[1]
    else:
        placements = [load_placement(args.placement)]
    backends = sorted({p.backend for placement in placements for p in placement.partitions})
    # The replay's library and files are only a means to the tar: kept in a folder removed however the export ends.
    # The replay says what it builds and checks (minutes for a large model); then the writing and the check in a new process.
    say = Narrator(True)
    with tempfile.TemporaryDirectory(prefix="collage-export-") as replay:
        options = OptimizeOptions(
            target=args.target,
            backends=backends,
            placement=args.placement,
            compare_backends=False,
            show_progress=True,
            output_dir=replay,
            shapes=args.shapes,
        )
        result = optimizer.optimize(args.model, options=options)
        say(f"writing {args.output} (Model Library Format), then loading and running it once in a new process")
        if isinstance(result, ProfiledModel):  # checked at its largest shape (the executor configuration's entry)
            check_inputs = result.shapes[result.dispatch.smallest_first()[-1]].model.random_inputs()
        else:
            check_inputs = result.model.random_inputs()
        path = export_mlf(result, args.output, check_inputs=check_inputs)
    print(f"saved: {path} (Model Library Format; loaded and run once in a new process; load it with collage_core.outputs.mlf.load_mlf)")
    failed = [check.verification for check in result.checks] if isinstance(result, ProfiledModel) else [result.verification]
    for verification in failed:
        if verification is not None and not verification.passed:
            print(verification.describe(), file=sys.stderr)
            return EXIT_NUMERICS
    return 0


def _show(args) -> int:
    if args.output:
        output_folder.refuse_special_file(args.output)
    if holds_several_shapes(args.placement):
        return _show_shapes(args)
    placement = load_placement(args.placement)
    if args.output:
        written = write_picture(placement, args.output, origin=args.placement)
        print(f"saved: {written}")
    if args.explain or not args.output:
        print(explain(placement))
    return 0


def _show_shapes(args) -> int:
    """Each shape's placement of a placements file: its explanation under the shape's name, then where the
    placements differ and why, and, with ``-o FILE``, a picture per shape (``FILE`` with ``-shapeK`` before its suffix)."""
    shapes, placements = load_shape_placements(args.placement)
    labels = [profile.label for profile in ShapeDispatch.from_json(shapes, args.placement).profiles]
    if args.output:
        output = Path(args.output)
        written = [
            write_picture(
                placement, output.with_name(f"{output.stem}-shape{index + 1}{output.suffix}"), origin=f"{args.placement}: shape {index + 1}"
            )
            for index, placement in enumerate(placements)
        ]
        print(f"saved: {', '.join(str(path) for path in written)}")
    if args.explain or not args.output:
        for index, (label, placement) in enumerate(zip(labels, placements)):
            print(f"shape {index + 1}: {label}\n{explain(placement)}\n")
        print("\n".join(placement_differences(labels, placements)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
