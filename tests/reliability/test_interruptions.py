"""SIGINT and SIGTERM while `collage optimize` measures and while it searches, then a rerun that loses nothing.

The model is a small CNN made here (18 operators, 33 distinct TVM candidates): what is checked does not
depend on the model, and the shipped ResNet's 64 candidates and larger builds took each test's runs
about twice as long.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MEASURED = re.compile(r"measured (\d+) in [\d.]+ s, (\d+) from the database, (\d+) invalid")
# Each line optimize says starts with the minutes and seconds since the run started.
STEP = r"\[\d+:\d\d\] "


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A residual CNN in ONNX (opset 17), seeded weights: two 3x3 convolution blocks with ReLU and a
    skip connection each, the second strided, then global average pooling and a linear layer."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights, nodes = [], []

    def const(name, shape):
        weights.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, size=shape).astype("float32"), name))
        return name

    def node(kind, inputs, name, **attributes):
        nodes.append(helper.make_node(kind, inputs, [name], **attributes))
        return name

    def conv(x, channels_in, channels_out, stride, name):
        return node(
            "Conv",
            [x, const(f"{name}.w", (channels_out, channels_in, 3, 3)), const(f"{name}.b", (channels_out,))],
            name,
            pads=[1, 1, 1, 1],
            strides=[stride, stride],
        )

    a = node("Relu", [conv("input", 3, 8, 1, "conv1")], "relu1")
    b = node("Relu", [node("Add", [conv(a, 8, 8, 1, "conv2"), a], "add2")], "relu2")
    c = node("Relu", [conv(b, 8, 16, 2, "conv3")], "relu3")
    d = node("Relu", [node("Add", [conv(c, 16, 16, 1, "conv4"), c], "add4")], "relu4")
    flat = node("Flatten", [node("GlobalAveragePool", [d], "pool")], "flat")
    node("Gemm", [flat, const("fc.w", (10, 16)), const("fc.b", (10,))], "output", transB=1)
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])],
        weights,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="collage-tests")
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    path = tmp_path_factory.mktemp("model") / "small_cnn.onnx"
    onnx.save(proto, path)
    return path


def _count(db: Path, table: str) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
            return connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


class Optimize:
    """`collage optimize` in the background, its stderr collected line by line as it comes."""

    def __init__(self, model: Path, db: Path, out: Path, *extra: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collage_core.cli", "optimize", str(model), "--cost-db", str(db), "--output", str(out), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            # A shell running the tests in the background ignores SIGINT for its children, and
            # Python then leaves it ignored; a user's terminal delivers it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_until(self, condition, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                pytest.fail("collage optimize ended before the moment to interrupt it:\n" + "\n".join(self.lines[-20:]))
            if time.monotonic() > deadline:
                self.process.kill()
                pytest.fail("the moment to interrupt never came")
            time.sleep(0.1)

    def finish(self, timeout_s: float = 900) -> int:
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return code


def _rerun(model: Path, db: Path, out: Path, *extra: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "collage_core.cli", "optimize", str(model), "--cost-db", str(db), "--output", str(out), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stderr


@pytest.mark.parametrize(
    "signum, code, word",
    # SIGTERM takes the same path as SIGINT here (20 s a run): it is slow; the search test below sends it.
    [(signal.SIGINT, 130, "interrupted"), pytest.param(signal.SIGTERM, 143, "terminated", marks=pytest.mark.slow)],
    ids=["SIGINT", "SIGTERM"],
)
def test_signal_during_measurement_keeps_every_cost_for_the_rerun(model, tmp_path, signum, code, word):
    db = tmp_path / "costs.sqlite"
    run = Optimize(model, db, tmp_path / "out", "--backends", "tvm", "--no-compare", "--calibration-rounds", "0")
    run.wait_until(lambda: _count(db, "costs") >= 5)
    run.process.send_signal(signum)
    assert run.finish() == code
    assert any(f"collage: {word}; costs measured so far are kept" in line for line in run.lines)
    kept = _count(db, "costs")
    assert kept >= 5
    found = MEASURED.search(_rerun(model, db, tmp_path / "again", "--backends", "tvm", "--no-compare", "--calibration-rounds", "0"))
    measured, from_database = int(found.group(1)), int(found.group(2))
    assert from_database >= kept and measured + from_database == _count(db, "costs")


# SIGINT's own path (exit 130, "interrupted") is covered by the measurement test above; here it
# repeats a minute of search, so it runs with --run-slow.
@pytest.mark.parametrize(
    "signum, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow, id="SIGINT"), pytest.param(signal.SIGTERM, 143, id="SIGTERM")]
)
def test_signal_during_the_evolutionary_search_keeps_measured_placements(model, tmp_path, signum, code):
    pytest.importorskip("onnxruntime")
    db = tmp_path / "costs.sqlite"
    search = (
        "--backends",
        "tvm,onnxruntime",
        "--search",
        "two-level",
        "--no-compare",
        "--calibration-rounds",
        "0",
        "--population",
        "4",
        "--generations",
        "2",
    )
    run = Optimize(model, db, tmp_path / "out", *search)
    run.wait_until(lambda: any(re.match(rf"{STEP}two-level search:", line) for line in run.lines) and _count(db, "end_to_end_costs") >= 2)
    run.process.send_signal(signum)
    assert run.finish() == code
    candidates, placements = _count(db, "costs"), _count(db, "end_to_end_costs")
    stderr = _rerun(model, db, tmp_path / "again", *search)
    found = MEASURED.search(stderr)
    assert int(found.group(1)) == 0 and int(found.group(2)) == candidates  # no candidate measured twice
    # Placements measured before the signal come from the database; only new ones are measured.
    measured_again = len(re.findall(rf"^{STEP}  placement of \d+ partitions:", stderr, flags=re.M))
    assert measured_again == _count(db, "end_to_end_costs") - placements


def test_a_worker_stream_closed_under_its_reader_ends_the_reading_quietly():
    """On SIGTERM the run closes its workers' pipes while their reader threads iterate them: the closed
    stream ends the reading as end of file does, with no traceback on stderr."""
    import io
    import queue

    from collage_core.measure.worker_client import MeasurementWorker

    stream = io.StringIO("first\nsecond\n")
    lines: queue.Queue = queue.Queue()
    next(stream)
    stream.close()
    MeasurementWorker._read(stream, lines)
    assert lines.get_nowait() is None


def test_an_interrupt_that_surfaces_as_another_error_still_stops_the_run_in_one_line(monkeypatch, capsys):
    """SIGTERM while a C extension initialises (``import onnxruntime``) reaches Python as a
    ``SystemError`` over ``Terminated``: the run ends as terminated (status 143, one line), and a plugin
    whose import it broke is not taken for a broken plugin."""
    from collage_core import cli, plugins
    from collage_core.errors import interrupt_within

    def raises_over_an_interrupt(interrupt):
        try:
            raise interrupt
        except KeyboardInterrupt:
            raise SystemError("initialization of _pybind_state raised unreported exception")

    with pytest.raises(SystemError) as surfaced:
        raises_over_an_interrupt(cli.Terminated())
    assert isinstance(interrupt_within(surfaced.value), cli.Terminated)
    assert interrupt_within(ValueError("plain")) is None

    def command(args):
        raises_over_an_interrupt(cli.Terminated())

    monkeypatch.setattr(cli, "_parser", lambda: _parser_running(command))
    assert cli.main(["run"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == "collage: terminated; costs measured so far are kept in the cost database"

    def importing(name):
        raises_over_an_interrupt(cli.Terminated())

    monkeypatch.setattr(plugins.importlib, "import_module", importing)
    with pytest.raises(cli.Terminated):
        plugins.get_plugin_manager(disabled=(), extra_modules=["a_plugin_being_imported"])


def _parser_running(command):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_subparsers().add_parser("run").set_defaults(command=command)
    return parser


def _signalled_inside_a_tvm_callback(signum=signal.SIGINT):
    """Calls, through TVM's FFI, a Python function that receives ``signum`` and waits for its handler: the
    interrupt the handler raises there comes out of TVM as a plain ``RuntimeError`` with an empty message."""
    import os

    import tvm_ffi

    def callback():
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the handler runs between two of these bytecodes
            time.sleep(0.001)

    tvm_ffi.convert(callback)()


def test_an_interrupt_raised_while_tvm_calls_back_into_python_stops_the_run_not_one_candidate(tmp_path):
    """A SIGINT that lands while TVM calls back into Python (cutting a candidate out of the model calls
    TVM) reached the run as a ``RuntimeError('')``: it was recorded as that candidate's failure, "cannot
    cut out the candidate", and the run went on as if Ctrl-C had not been pressed. While a run notes
    its signals, it is the interrupt."""
    from collage_core.errors import interrupt_within, signals_noted
    from collage_core.measure import measurement

    class Graph:
        def standalone_module(self, nodes):
            _signalled_inside_a_tvm_callback()

    candidate = type("Candidate", (), {"nodes": (0,)})()
    with pytest.raises(KeyboardInterrupt), signals_noted():
        measurement._cut_out(Graph(), candidate, tmp_path / "candidate.json")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back
    # Outside, TVM's error shows nothing of the interrupt: what the note is for.
    with pytest.raises(RuntimeError) as surfaced:
        _signalled_inside_a_tvm_callback()
    assert interrupt_within(surfaced.value) is None


def test_the_command_exits_as_interrupted_when_the_interrupt_came_out_of_tvm_as_another_error(monkeypatch, capsys):
    from collage_core import cli
    from collage_core.errors import CollageError

    def command(args):
        try:
            _signalled_inside_a_tvm_callback()
        except RuntimeError as error:  # a step that words its errors for users, as the model import does
            raise CollageError(f"cannot import the model: {error}") from None

    monkeypatch.setattr(cli, "_parser", lambda: _parser_running(command))
    assert cli.main(["run"]) == 128 + signal.SIGINT
    assert capsys.readouterr().err.strip() == "collage: interrupted; costs measured so far are kept in the cost database"
    monkeypatch.setattr(cli, "_parser", lambda: _parser_running(lambda args: _signalled_inside_a_tvm_callback(signal.SIGTERM)))
    assert cli.main(["run"]) == 128 + signal.SIGTERM


def test_a_note_counts_only_inside_the_outermost_block_and_leaving_it_restores_the_handler():
    """Nested blocks (the command calls optimize, which calls itself for each shape) keep the outer note; leaving
    the outermost clears it and puts Python's handler back; a signal noted after that (SIGTERM once the command
    has returned, in a process that goes on) turns no later error into an interrupt."""
    from collage_core.errors import interrupt_within, note_interrupt, signals_noted

    with signals_noted():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        with signals_noted():
            noted = note_interrupt(KeyboardInterrupt())
        assert interrupt_within(RuntimeError("")) is noted  # the inner block's end kept it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert interrupt_within(RuntimeError("")) is None
    note_interrupt(KeyboardInterrupt())  # outside any block: counts for nothing, and the next block starts clean
    assert interrupt_within(RuntimeError("")) is None
    with signals_noted():
        assert interrupt_within(RuntimeError("")) is None
