"""Bad arguments end a run in one line naming the option, the argument or the file and the problem,
before anything is imported or measured: ``collage``'s options (argparse's usage error, exit 2), the
Python API's arguments (:class:`ArgumentError`), model files and their inputs, the output folder; and
``collage show | head`` ends quietly as Unix tools do."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import collage_core
from collage_core import cli
from collage_core.api_checks import ArgumentError
from collage_core.cli import main
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import ModelImportError, load_model
from collage_core.search.two_level import TwoLevelSettings
from collage_core.tvm_compat import TargetError

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny_resnet.onnx"


def run_main(argv: list[str], capfd) -> tuple[int, list[str]]:
    """``cli.main(argv)``'s status (argparse's 2 included) and the lines it wrote to stderr."""
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own handler
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, capfd.readouterr().err.splitlines()


@pytest.mark.parametrize(
    "option, value, problem",
    [
        ("--baseline-limit", "-1", "must be at least 0, not -1"),
        ("--baseline-limit", "nan", "must be a finite number, not nan"),
        ("--generations", "-3", "must be at least 0, not -3"),
        ("--budget", "-5", "must be at least 0, not -5"),
        ("--budget", "inf", "must be a finite number, not inf"),
        ("--population", "0", "must be at least 2, not 0"),
        ("--population", "1", "must be at least 2, not 1"),
        ("--patience", "0", "must be at least 1, not 0"),
        ("--jobs", "-1", "must be at least 0, not -1"),
        ("--jobs", "two", "must be a whole number, not 'two'"),
        ("--calibration-rounds", "-1", "must be at least 0, not -1"),
        ("--min-gain", "-0.1", "must be at least 0, not -0.1"),
        ("--predict-margin", "-1", "must be at least 0, not -1"),
        ("--accuracy-budget", "0", "must be more than 0, not 0"),
        ("--target", "{not json", "target '{not json' is not JSON"),
        ("--target", "nonsense", "target 'nonsense': Target kind \"nonsense\" is not defined."),
    ],
)
def test_out_of_range_options_are_refused_by_name_before_anything_runs(option, value, problem, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code, stderr = run_main(["optimize", str(MODEL), f"{option}={value}"], capfd)
    assert code == 2 and stderr[-1].startswith(f"collage optimize: error: argument {option}: {problem}"), stderr
    assert not (tmp_path / "collage-out").exists()


def test_a_target_given_as_json_or_a_known_name_is_taken(tmp_path):
    parser = cli._parser()
    for target in ('{"kind": "llvm"}', "cuda", "llvm"):
        assert parser.parse_args(["optimize", str(MODEL), "--target", target]).target == target


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"backends": "tvm"}, "optimize: backends must be a list of backend names, e.g. ['tvm'], not the string 'tvm'"),
        ({"backends": ["tvm", 3]}, "optimize: backends must be a list of backend names, not list ['tvm', 3]"),
        ({"target": 42}, "a target is a name (llvm, cuda), a JSON object or a tvm.target.Target, not 42"),
        ({"target": "{oops"}, "target '{oops' is not JSON"),
        ({"output_dir": 7}, "optimize: output_dir must be a path (str or os.PathLike), not 7"),
        ({"output_dir": ""}, "optimize: output_dir is an empty string: name a folder, or leave it out for a temporary one"),
        ({"cost_db": ["costs.sqlite"]}, "optimize: cost_db must be a path (str or os.PathLike), not list ['costs.sqlite']"),
        ({"settings": {"build_workers": 2}}, "optimize: settings must be a collage_core.measure.timing.MeasureSettings, not dict"),
        ({"two_level": TwoLevelSettings(population=1)}, "optimize: two_level.population must be at least 2, not 1"),
        ({"settings": MeasureSettings(build_workers=-1)}, "optimize: settings.build_workers must be at least 0, not -1"),
        ({"baseline_limit_s": -1.0}, "optimize: baseline_limit_s must be at least 0, not -1"),
        ({"calibration_rounds": 1.5}, "optimize: calibration_rounds must be a whole number, not 1.5"),
        ({"accuracy_budget": float("nan")}, "optimize: accuracy_budget must be a finite number, not nan"),
        ({"search": "one-level"}, "optimize: search must be one of op-level, two-level, not 'one-level'"),
        ({"verify": "yes"}, "optimize: verify must be True or False, not 'yes'"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_python_api_arguments_of_the_wrong_type_are_refused_in_one_line_before_the_model_is_read(arguments, message, tmp_path):
    with pytest.raises((ArgumentError, TargetError)) as refused:
        collage_core.optimize(str(tmp_path / "no-such-model.onnx"), **arguments)  # read after the checks: never here
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_an_output_folder_under_a_file_is_refused_before_anything_is_measured(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    code, stderr = run_main(["optimize", str(MODEL), "-o", str(tmp_path / "file" / "out")], capfd)
    assert code == 1 and stderr == [
        f"collage: error: {tmp_path / 'file' / 'out'}: the output folder cannot be written "
        f"({tmp_path / 'file'} is not a folder); nothing was measured"
    ]
    code, stderr = run_main(["export", str(MODEL), "--placement", "p.json", "-o", str(tmp_path / "file" / "x.tar")], capfd)
    assert code == 1 and stderr == [
        f"collage: error: {tmp_path / 'file' / 'x.tar'}: cannot be written ({tmp_path / 'file'} is not a folder); nothing was built"
    ]
    (tmp_path / "folder").mkdir()
    code, stderr = run_main(["export", str(MODEL), "--placement", "p.json", "-o", str(tmp_path / "folder")], capfd)
    assert code == 1 and stderr == [
        f"collage: error: {tmp_path / 'folder'}: is a folder; -o names the tar to write (-o model.tar); nothing was built"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "folder"]  # nothing left beside them


MOUNTED = """
set -e
mkdir -p "$1/read-only" "$1/full"
mount -t tmpfs -o ro,size=1m none "$1/read-only"
mount -t tmpfs -o size=256k none "$1/full"
dd if=/dev/zero of="$1/full/filler" bs=4k 2>/dev/null || true
collage optimize "$2" -o "$1/read-only/out" || echo "status $?"
collage optimize "$2" -o "$1/full/out" || echo "status $?"
"""


def test_an_output_folder_on_a_read_only_or_full_file_system_is_refused_before_anything_is_measured(tmp_path):
    """In a user and mount namespace of its own (``unshare``), where this test mounts the file systems."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare cannot make a user and mount namespace here")
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", MOUNTED, "sh", str(tmp_path), str(MODEL)], capture_output=True, text=True, timeout=300
    )
    errors = [line for line in run.stderr.splitlines() if line.startswith("collage: error:")]
    assert errors == [
        f"collage: error: {tmp_path}/read-only/out: the output folder cannot be written (cannot write in "
        f"{tmp_path}/read-only (Read-only file system)); nothing was measured",
        f"collage: error: {tmp_path}/full/out: the output folder cannot be written (cannot write in "
        f"{tmp_path}/full (No space left on device)); nothing was measured",
    ], run.stderr[-3000:]
    assert run.stdout.splitlines() == ["status 1", "status 1"]


def test_a_file_system_filling_up_later_ends_the_run_in_one_line(monkeypatch, capfd):
    def fills_up(args):
        raise OSError(errno.ENOSPC, "No space left on device", "collage-out/m/m.so")

    monkeypatch.setattr(cli, "_optimize", fills_up)
    code, stderr = run_main(["optimize", str(MODEL)], capfd)
    assert code == 1 and stderr == ["collage: error: writing collage-out/m/m.so failed: No space left on device"]


def onnx_model(path: Path, shape) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_model_files_and_inputs_collage_cannot_take_are_refused_in_one_line_before_inputs_are_made(tmp_path, monkeypatch, capfd):
    cases = [
        (tmp_path, f"{tmp_path}: a folder, not an ONNX file"),
        (Path("/dev/zero"), "/dev/zero: not a regular file, not an ONNX file"),
        (
            onnx_model(tmp_path / "huge.onnx", [100_000, 100_000]),
            f"{tmp_path / 'huge.onnx'}: input 'x' is float32[100000, 100000], 1e+10 elements (37.3 GiB); Collage makes inputs "
            "of at most 4 GiB to check and time a model",
        ),
        (
            onnx_model(tmp_path / "empty.onnx", [0, 4]),
            f"{tmp_path / 'empty.onnx'}: input 'x' is float32[0, 4], zero-sized: it holds no data to place a model on; "
            "export it with every dimension at least 1",
        ),
    ]
    for path, message in cases:
        with pytest.raises(ModelImportError) as refused:
            load_model(str(path))
        assert str(refused.value) == message
    monkeypatch.chdir(tmp_path)
    code, stderr = run_main(["optimize", str(tmp_path / "huge.onnx"), "-o", str(tmp_path / "out")], capfd)
    assert code == 1 and [line for line in stderr if line.startswith("collage:")] == [f"collage: error: {cases[2][1]}"]


def test_collage_show_into_a_closed_pipe_ends_quietly_as_unix_tools_do(tmp_path):
    from test_hostile_inputs import VALID

    placement = tmp_path / "p.json"
    placement.write_text(json.dumps(VALID))
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "collage_core", "show", str(placement)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reader_gone.stdout.close()  # before it writes: its first write finds no reader
    _, stderr = reader_gone.communicate(timeout=300)
    assert reader_gone.returncode == 128 + signal.SIGPIPE
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr and b"collage: error" not in stderr, stderr.decode()


def test_collage_show_into_a_place_that_cannot_be_written_fails_in_one_line(tmp_path, capfd):
    from test_hostile_inputs import VALID

    placement = tmp_path / "p.json"
    placement.write_text(json.dumps(VALID))
    (tmp_path / "file").write_text("")
    code, stderr = run_main(["show", str(placement), "-o", str(tmp_path / "file" / "pic.dot")], capfd)
    errors = [line for line in stderr if line.startswith("collage")]
    assert code == 1 and errors == [f"collage: error: {tmp_path / 'file' / 'pic.dot'}: cannot write it (File exists: {tmp_path / 'file'})"]


def test_an_empty_output_folder_name_is_refused_rather_than_read_as_the_default(tmp_path, monkeypatch, capfd):
    """``-o ''`` (a variable that was never set) must not quietly write collage-out/MODEL instead."""
    monkeypatch.chdir(tmp_path)
    code, stderr = run_main(["optimize", str(MODEL), "-o", ""], capfd)
    assert code == 1 and stderr == ["collage: error: -o names an empty folder name: name a folder, or leave -o out for collage-out/MODEL"]
    assert not (tmp_path / "collage-out").exists()


def test_an_unknown_backend_is_refused_before_the_model_is_read_and_one_named_twice_is_chosen_once(tmp_path):
    from collage_core.backends import BackendError, discover_backends, select_backends
    from collage_core.plugins import get_plugin_manager

    with pytest.raises(BackendError, match=r"^unknown backend 'bogus' \(installed: .*tvm"):
        collage_core.optimize(str(tmp_path / "no-such-model.onnx"), backends=["tvm", "bogus"])  # the model is never read
    infos = discover_backends(get_plugin_manager())
    assert [info.name for info in select_backends(infos, ["tvm", "tvm"])] == ["tvm"]
