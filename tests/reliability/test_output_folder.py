"""The output folder is safe to kill and to share: names from inputs never lead out of it, a library
being written never harms the one before it, a second run into a folder in use stops in one line, and
a run's scratch files go with it, however it ends.

The model is one ReLU (a run takes seconds), placed on TVM alone at the op level, with no baselines and
no calibration. Runs are stopped at a known point, the export of their library, by the test plugin
``plugins_for_tests.broken_export``: nothing here depends on how fast anything runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from plugins_for_tests.broken_export import START_OF_A_LIBRARY

import collage_core
from collage_core import optimizer
from collage_core.build.deploy import carried_dir, read_runtime_file, write_runtime_file
from collage_core.errors import CollageError
from collage_core.outputs.output_folder import LOCK_FILE, NAME_BYTES, SCRATCH_PREFIX, held, library_file, safe_file_name

onnx = pytest.importorskip("onnx")

TESTS = Path(__file__).resolve().parents[1]
PLUGIN = "plugins_for_tests.broken_export"
# What a finished run leaves in its folder (for a model called relu).
FINISHED = {LOCK_FILE, ".collage-model", "finished.json", "placement.json", "relu.so", "relu.so.runtime.json", "report.txt", "results.json"}
HOSTILE = {
    "parent": "../../escaped",
    "absolute": "ABSOLUTE",  # a path in the test's own folder, outside the output folder
    "empty": "",
    "nul": "re\0lu",
    "long": "x" * 300,
    "non-ascii": "модель/../../名前",
}


def relu_model(graph_name: str = "relu"):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        graph_name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "relu.onnx"
    onnx.save(relu_model(), path)
    return path


@pytest.fixture(scope="module")
def cost_db(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("costs") / "costs.sqlite"


def optimize_into(out: Path, model, cost_db: Path):
    return collage_core.optimize(
        model,
        backends=["tvm"],
        search="op-level",
        compare_backends=False,
        calibration_rounds=0,
        output_dir=out,
        cost_db=cost_db,
        show_progress=False,
    )


def names_in(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_graph_name_writes_nothing_outside_the_output_folder(kind, tmp_path, cost_db):
    name = str(tmp_path / "elsewhere" / "escaped") if kind == "absolute" else HOSTILE[kind]
    out = tmp_path / "out" / "a" / "b"
    optimized = optimize_into(out, relu_model(name), cost_db)
    assert files_under(tmp_path) == files_under(out)
    library = optimized.library_path
    assert library.parent == out and library.is_file() and read_runtime_file(library)["library"] == library.name
    assert optimized.verification.passed


def test_a_plain_name_is_kept_and_none_leads_out_of_its_folder(tmp_path):
    for plain in ("tiny_resnet", "resnet-50.v1", "my model", "модель", "名前"):
        assert safe_file_name(plain) == plain
        assert library_file(tmp_path, plain) == tmp_path / f"{plain}.so"
    names = [*HOSTILE.values(), "/etc/passwd", "..", ".", "a/../../b", "a\\..\\b", "\n", "\udcff", "😀" * 300]
    for name in names:
        library = library_file(tmp_path, name)
        assert library.parent == tmp_path and library.resolve().parent == tmp_path.resolve(), name
        assert "\0" not in library.name and not library.name.startswith(".")
        assert len(f"{library.name}.runtime.json".encode()) <= NAME_BYTES + len(".so.runtime.json") < 255
    assert safe_file_name("x" * 300) != safe_file_name("x" * 299 + "y")  # cut names stay distinct


def test_a_backend_name_does_not_lead_out_of_the_carried_libraries(tmp_path):
    kernels = tmp_path / "kernels" / "libkernels.so"
    kernels.parent.mkdir()
    kernels.write_bytes(b"kernels")
    library = tmp_path / "out" / "m.so"
    library.parent.mkdir()
    library.write_bytes(b"library")
    needs = {"../../evil": {"kind": "op-level", "version": "1", "needs": ""}}
    write_runtime_file(library, needs, {"../../evil": [kernels]})
    (carried,) = read_runtime_file(library)["backends"]["../../evil"]["carried"]
    assert (library.parent / carried).resolve().is_relative_to(carried_dir(library).resolve())
    assert files_under(tmp_path) == {kernels, library, library.parent / "m.so.runtime.json", library.parent / carried}


def test_an_export_that_breaks_midway_leaves_the_library_before_intact_and_no_scratch(
    model, cost_db, tmp_path, load_test_plugin, monkeypatch
):
    out = tmp_path / "out"
    pm, _ = load_test_plugin(PLUGIN)
    monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: pm)
    first = optimize_into(out, model, cost_db)
    before = first.library_path.read_bytes()
    (out / "finished.json").unlink()  # so that the next run builds again
    monkeypatch.setenv("BROKEN_EXPORT", "raise")
    monkeypatch.setenv("BROKEN_EXPORT_INTO", str(out))
    with pytest.raises(CollageError, match="building or running the placement failed: .*broke midway"):
        optimize_into(out, model, cost_db)
    assert first.library_path.read_bytes() == before
    assert names_in(out) == FINISHED - {"finished.json"}  # no scratch, inputs or half-written file


class PausedRun:
    """``collage optimize`` of the ReLU into ``out`` in a process of its own, its workers' library exports
    paused (see plugins_for_tests.broken_export) until :meth:`go` or :meth:`stop`."""

    def __init__(self, out: Path, model: Path, cost_db: Path, handshake: Path):
        handshake.mkdir()
        self.handshake = handshake
        code = (
            "import sys\n"
            "from collage_core import optimizer\n"
            "from collage_core.cli import main\n"
            "from collage_core.plugins import get_plugin_manager\n"
            f"pm = get_plugin_manager(extra_modules=[{PLUGIN!r}])\n"
            "optimizer.get_plugin_manager = lambda: pm\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
            "BROKEN_EXPORT": "pause",
            "BROKEN_EXPORT_INTO": str(out),
            "BROKEN_EXPORT_DIR": str(handshake),
        }
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "optimize",
                str(model),
                "--backends",
                "tvm",
                "--search",
                "op-level",
                "--no-compare",
                "--calibration-rounds",
                "0",
                "--cost-db",
                str(cost_db),
                "-o",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )

    def wait_until_exporting(self) -> Path:
        """The path the run's library is being written to, once it is."""
        deadline = time.monotonic() + 300
        while not (self.handshake / "exporting").exists() or not (self.handshake / "exporting").read_text():
            assert self.process.poll() is None, self.process.communicate()
            assert time.monotonic() < deadline, "the run never exported its library"
            time.sleep(0.05)
        return Path((self.handshake / "exporting").read_text())

    def go(self) -> None:
        (self.handshake / "go").touch()

    def stop(self) -> None:
        (self.handshake / "stop").touch()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.communicate()


@pytest.fixture
def paused(model, cost_db, tmp_path):
    runs = []

    def start(out: Path) -> PausedRun:
        runs.append(PausedRun(out, model, cost_db, tmp_path / f"handshake-{len(runs)}"))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()


def test_a_run_killed_while_it_writes_the_library_leaves_the_library_before_intact(model, cost_db, tmp_path, paused):
    out = tmp_path / "out"
    first = optimize_into(out, model, cost_db)
    before = first.library_path.read_bytes()
    (out / "finished.json").unlink()
    run = paused(out)
    assert run.wait_until_exporting().read_bytes() == START_OF_A_LIBRARY
    os.killpg(run.process.pid, signal.SIGKILL)
    run.process.wait()
    assert first.library_path.read_bytes() == before
    # The next run into the folder clears what the killed one left (its scratch, the library half written).
    optimize_into(out, model, cost_db)
    assert names_in(out) == FINISHED


def test_a_run_stopped_after_building_its_library_leaves_the_run_befores_library_with_its_placement(model, cost_db, tmp_path, monkeypatch):
    """Ctrl-C during the baselines or the contest in turns, after the placement was built: the folder keeps the
    run before's library, runtime file and placement.json, which describe each other, and the next run finishes."""
    from collage_core import optimizer

    out = tmp_path / "out"
    optimize_into(out, model, cost_db)
    kept = ("relu.so", "relu.so.runtime.json", "placement.json", "report.txt", ".collage-model")  # the record too
    before = {name: (out / name).read_bytes() for name in kept}
    wider = relu_model()  # another model of the same name: another library in the same file
    for value in (*wider.graph.input, *wider.graph.output):
        value.type.tensor_type.shape.dim[1].dim_value = 16
    onnx.save(wider, tmp_path / "relu.onnx")
    build_and_compare = optimizer.build_stage.build_and_compare

    def interrupted(*args, **kwargs):
        build_and_compare(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizer.build_stage, "build_and_compare", interrupted)
    with pytest.raises(KeyboardInterrupt):
        optimize_into(out, tmp_path / "relu.onnx", cost_db)
    assert {name: (out / name).read_bytes() for name in kept} == before
    monkeypatch.undo()
    after = optimize_into(out, tmp_path / "relu.onnx", cost_db)
    assert after.library_path == out / "relu.so" and (out / "relu.so").read_bytes() != before["relu.so"]
    assert after.run(np.ones((1, 16), np.float32))[0].shape == (1, 16) and names_in(out) == FINISHED


def test_a_second_run_into_a_folder_in_use_stops_in_one_line_and_the_first_finishes(model, cost_db, tmp_path, paused, capsys):
    from collage_core.cli import main

    out = tmp_path / "out"
    first = paused(out)
    first.wait_until_exporting()
    status = main(
        ["optimize", str(model), "--backends", "tvm", "--search", "op-level", "--no-compare", "--cost-db", str(cost_db), "-o", str(out)]
    )
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        f"collage: error: {out} is in use by another Collage run (pid {first.process.pid}); wait for it to end or "
        "choose another output directory"
    ]
    first.go()
    _, err = first.process.communicate(timeout=300)
    assert first.process.returncode == 0 and "Traceback" not in err, err
    assert names_in(out) == FINISHED
    # Its lock went with it: the same command now runs.
    assert (
        main(
            ["optimize", str(model), "--backends", "tvm", "--search", "op-level", "--no-compare", "--cost-db", str(cost_db), "-o", str(out)]
        )
        == 0
    )


def test_sigterm_leaves_nothing_of_the_runs_scratch(model, cost_db, tmp_path, paused):
    out = tmp_path / "out"
    run = paused(out)
    run.wait_until_exporting()
    assert [name for name in names_in(out) if name.startswith(SCRATCH_PREFIX)]  # the run's inputs are in there
    run.process.send_signal(signal.SIGTERM)
    _, err = run.process.communicate(timeout=120)
    assert run.process.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert err.splitlines()[-1] == "collage: terminated; costs measured so far are kept in the cost database"
    assert not out.exists()  # the run made it and wrote nothing to keep in it: nothing of it is left


def test_a_dead_runs_lock_is_free_and_its_scratch_is_cleared(tmp_path):
    """A holder killed by SIGKILL: the kernel drops its lock, and the next holder removes what it left."""
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import sys, time\nfrom collage_core.outputs.output_folder import held\n"
        "with held(sys.argv[1]) as scratch:\n"
        "    (scratch / 'inputs.npz').write_bytes(b'inputs')\n"
        "    print(scratch, flush=True)\n"
        "    time.sleep(300)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        scratch = Path(holder.stdout.readline().strip())
        assert (scratch / "inputs.npz").is_file()
        with pytest.raises(CollageError, match=f"in use by another Collage run \\(pid {holder.pid}\\)"):
            with held(out):
                pass
    finally:
        holder.kill()
        holder.wait()
    with held(out) as mine:
        assert not scratch.exists() and names_in(out) == {LOCK_FILE, mine.name}
    assert names_in(out) == {LOCK_FILE}


def test_a_write_that_fails_names_the_file_not_its_temporary(tmp_path):
    from collage_core.outputs.output_folder import write_text

    with pytest.raises(FileNotFoundError) as raised:
        write_text(tmp_path / "gone" / "report.txt", "text")
    assert raised.value.filename == str(tmp_path / "gone" / "report.txt")


def test_the_default_output_folder_stays_in_collage_out_whatever_the_model_file_is_called():
    from collage_core.cli import default_output

    assert default_output("models/tiny_resnet.onnx") == Path("collage-out/tiny_resnet")
    for hostile in ("...onnx", "../x/..onnx", ".onnx"):
        folder = default_output(hostile)
        assert folder.parent == Path("collage-out") and folder.name not in ("", ".", ".."), (hostile, folder)


def test_another_model_run_into_a_folder_says_so_and_leaves_no_library_of_the_first(model, cost_db, tmp_path, capsys):
    """-o naming the folder of another model's run: that run's placement, report and library are replaced, and its
    library (another name, which its results.json named) goes too; a library of the user's stays."""
    out = tmp_path / "out"
    optimize_into(out, model, cost_db)
    assert {"relu.so", "relu.so.runtime.json"} <= names_in(out)
    for name in ("mine.so", "mine.so.runtime.json"):  # a library of the user's, which no results.json there names
        (out / name).write_text(name)
    other = tmp_path / "other" / "sigmoid.onnx"
    other.parent.mkdir()
    proto = relu_model("sigmoid")
    proto.graph.node[0].op_type = "Sigmoid"
    onnx.save(proto, other)
    capsys.readouterr()
    result = collage_core.optimize(
        other, backends=["tvm"], search="op-level", compare_backends=False, calibration_rounds=0, output_dir=out, cost_db=cost_db
    )
    said = capsys.readouterr().err
    assert f"{out} holds the outputs of another model file, {model}: this run's replace them" in said
    assert names_in(out) == {name.replace("relu", "sigmoid") for name in FINISHED} | {"mine.so", "mine.so.runtime.json"}
    assert json.loads((out / "placement.json").read_text())["model"]["name"] == "sigmoid"
    np.testing.assert_allclose(result.run(np.zeros((1, 8), np.float32))[0], np.full((1, 8), 0.5, np.float32), rtol=1e-6)


def test_model_files_of_one_name_keep_their_default_output_folders_apart(tmp_path, monkeypatch):
    """a/model.onnx and b/model.onnx: the first run's folder is the plain name, the other file's is beside it,
    each the same run after run; a folder whose model file is gone is taken by the next file of that name."""
    from collage_core.outputs.output_folder import default_for, record_model_file, recorded_model_file

    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"
    for file in (first, second):
        file.parent.mkdir()
        file.write_bytes(b"")
    plain = Path("collage-out/model")
    assert default_for(first) == default_for(second) == plain  # nothing kept yet
    plain.mkdir(parents=True)
    record_model_file(plain, "a/model.onnx")  # as a run given a relative path keeps it
    assert recorded_model_file(plain) == str(first)
    assert default_for(first) == default_for(str(first)) == plain
    beside = default_for(second)
    assert beside.parent == plain.parent and beside.name.startswith("model-") and beside != plain
    assert default_for(second) == beside and default_for(tmp_path / "a" / ".." / "b" / "model.onnx") == beside
    first.unlink()
    assert default_for(second) == plain
    (plain / ".collage-model").write_text("{not json")
    assert recorded_model_file(plain) is None and default_for(second) == plain


def test_the_cli_writes_a_second_model_file_of_one_name_beside_the_first(model, tmp_path, monkeypatch, capsys):
    """Each run keeps its model file's path in its folder; a second file of the same name gets a folder of its own,
    and the run says where it writes and why."""
    import shutil

    from collage_core.cli import main
    from collage_core.outputs.output_folder import recorded_model_file

    monkeypatch.chdir(tmp_path)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(model, tmp_path / folder / "model.onnx")
    run = ["optimize", "--backends", "tvm", "--no-compare", "--search", "op-level", "--cost-db", str(tmp_path / "costs.sqlite")]
    assert main([*run, "a/model.onnx"]) == 0
    assert recorded_model_file(Path("collage-out/model")) == str(tmp_path / "a" / "model.onnx")
    capsys.readouterr()
    assert main([*run, "b/model.onnx"]) == 0
    said = capsys.readouterr().err
    (beside,) = [path for path in Path("collage-out").iterdir() if path.name != "model"]
    assert f"collage-out/model holds the outputs of {tmp_path / 'a' / 'model.onnx'}: writing to {beside}" in said
    assert recorded_model_file(beside) == str(tmp_path / "b" / "model.onnx")
    assert (beside / "placement.json").exists() and (Path("collage-out/model") / "placement.json").exists()


def test_a_run_without_an_output_folder_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """Its library lives in a temporary folder as long as the result that runs it; a failed run removes it at once."""
    import gc
    import tempfile

    from tvm import relax

    import collage_core
    from collage_core.testing import function_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    relu = function_module(lambda bb, x: relax.op.nn.relu(x), (2, 8))
    options = dict(
        backends=["tvm"],
        search="op-level",
        compare_backends=False,
        calibration_rounds=0,
        cost_db=tmp_path / "costs.sqlite",
        show_progress=False,
    )
    result = collage_core.optimize(relu, **options)
    (folder,) = [path for path in tmp_path.iterdir() if path.name.startswith("collage-")]
    assert result.library_path.parent == folder and result.run(np.ones((2, 8), "float32"))[0].shape == (2, 8)
    del result
    gc.collect()
    assert not folder.exists()
    with pytest.raises(Exception):
        collage_core.optimize(relu, placement=tmp_path / "no such placement.json", **options)
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("collage-")]


def test_temporary_files_of_a_run_and_of_its_workers_go_with_its_scratch(model, tmp_path, load_test_plugin, monkeypatch):
    """What the run and its workers leave in their temporary folder (a killed linker's files) lands in
    the run's scratch, removed with it; the second run's workers come from the zygote the first
    started, under the first run's TMPDIR, and still use the second's."""
    import tempfile

    pm, _ = load_test_plugin("plugins_for_tests.leaky_temporary_files")
    monkeypatch.setattr(optimizer, "get_plugin_manager", lambda: pm)
    monkeypatch.delenv("COLLAGE_FRESH_WORKERS", raising=False)
    out = tmp_path / "out"
    scratches, zygotes, log, seen = [], set(), tmp_path / "leaks.txt", 0
    monkeypatch.setenv("LEAKY_TEMPORARY_FILES", str(log))
    for run in ("first", "second"):
        outside = tmp_path / f"tmp-{run}"
        outside.mkdir()
        monkeypatch.setenv("TMPDIR", str(outside))
        monkeypatch.setattr(tempfile, "tempdir", str(outside))
        optimize_into(out, model, tmp_path / f"{run}.sqlite")  # a database of its own: its workers build
        assert not list(outside.iterdir()), run
        assert tempfile.gettempdir() == str(outside) and os.environ["TMPDIR"] == str(outside)  # restored
        lines = log.read_text().splitlines()
        leaks, seen = [line.split(" ", 2) for line in lines[seen:]], len(lines)
        zygotes |= {parent for pid, parent, _ in leaks if pid != str(os.getpid())}
        (scratch,) = {Path(path).parent.parent for _, _, path in leaks}  # <scratch>/tmp/<file>
        assert scratch.parent == out and scratch.name.startswith(SCRATCH_PREFIX) and not scratch.exists()
        scratches.append(scratch)
    assert scratches[0] != scratches[1]
    assert len(zygotes) == 1, "the second run's workers should come from the zygote the first run started"
    assert not [name for name in names_in(out) if name.startswith(SCRATCH_PREFIX)]


def test_a_run_refused_because_the_folder_is_in_use_removes_nothing_of_it(model, tmp_path, monkeypatch):
    """Two runs into a folder that does not exist yet both make it; the one refused must leave it, with
    the holder's lock and scratch, to the one that holds it."""
    from collage_core.outputs import output_folder
    from collage_core.outputs.output_folder import OutputFolderInUse

    out = tmp_path / "new" / "out"
    out.mkdir(parents=True)  # as both runs did before either locked it
    monkeypatch.setattr(output_folder, "first_missing", lambda folder: tmp_path / "new")  # both saw it missing
    with held(out) as scratch:
        with pytest.raises(OutputFolderInUse):
            collage_core.optimize(model, backends=["tvm"], search="op-level", output_dir=tmp_path / "new" / "out", show_progress=False)
        assert scratch.is_dir() and (out / LOCK_FILE).exists()
        with pytest.raises(OutputFolderInUse):
            with held(out, made=tmp_path / "new"):
                pass
        assert scratch.is_dir() and (out / LOCK_FILE).exists()


def test_a_run_that_fails_before_writing_removes_the_folders_it_made_while_it_holds_them(tmp_path):
    out = tmp_path / "new" / "out"
    out.mkdir(parents=True)
    with pytest.raises(ValueError):
        with held(out, made=tmp_path / "new"):
            raise ValueError("the model does not exist")
    assert not (tmp_path / "new").exists()
    out.mkdir(parents=True)
    (out / "placement.json").write_text("{}")  # something of a run before: kept
    with pytest.raises(ValueError):
        with held(out, made=tmp_path / "new"):
            raise ValueError("the model does not exist")
    assert (out / "placement.json").exists()


def test_a_lock_file_removed_as_a_run_locks_it_refuses_the_run(tmp_path, monkeypatch):
    """A run that locked the lock file another run had just removed (with the folder it made) does not
    take that file for the folder's lock."""
    import fcntl

    from collage_core.outputs import output_folder
    from collage_core.outputs.output_folder import OutputFolderInUse

    out = tmp_path / "out"
    out.mkdir()

    flock = fcntl.flock

    def flock_after_removal(descriptor, operation):
        (out / LOCK_FILE).unlink(missing_ok=True)  # the other run's cleanup, between this run's open and its lock
        return flock(descriptor, operation)

    monkeypatch.setattr(output_folder.fcntl, "flock", flock_after_removal)
    with pytest.raises(OutputFolderInUse, match="was removed by another Collage run"):
        with held(out):
            pass


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_left_alone(tmp_path):
    """In a folder others can write to, a link named like the lock file must not make the run overwrite its target."""
    victim = tmp_path / "victim.txt"
    victim.write_text("important\n")
    for kind in ("link", "folder"):
        out = tmp_path / f"out-{kind}"
        out.mkdir()
        if kind == "link":
            (out / LOCK_FILE).symlink_to(victim)
        else:
            (out / LOCK_FILE).mkdir()
        with pytest.raises(CollageError) as refused:
            with held(out):
                pass
        assert str(refused.value).startswith(str(out / LOCK_FILE)) or "cannot write into it" in str(refused.value)
        assert "\n" not in str(refused.value)
    assert victim.read_text() == "important\n"


def test_a_tar_that_cannot_be_written_whole_leaves_nothing_and_names_its_file(tmp_path, monkeypatch):
    """A full disk midway through writing an export: one line naming the tar, and no half-written file."""
    import errno
    import tarfile

    from collage_core.outputs import mlf_export

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "addfile", full)
    target = tmp_path / "x.tar"
    with pytest.raises(CollageError) as refused:
        mlf_export._write_tar(target, {"metadata.json": b"{}"})
    assert str(refused.value) == f"{target}: writing it failed (No space left on device); nothing of it was left"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["export", "show"])
def test_a_pipe_named_as_the_file_to_write_is_refused_and_left_a_pipe(command, tmp_path, capsys):
    """``-o /dev/null`` must not put a regular file in the device's place: every file is written by renaming a new
    one onto its name, so a name that is a device, a pipe or a socket is refused before anything is built (a pipe
    here: making a device needs root)."""
    from collage_core.cli import main

    pipe = tmp_path / ("model.tar" if command == "export" else "picture.svg")
    os.mkfifo(pipe)
    placement = tmp_path / "placement.json"  # never read: the name to write is checked first
    arguments = ["export", str(TESTS.parent / "models" / "tiny_resnet.onnx"), "--placement", str(placement)]
    assert main([*arguments, "-o", str(pipe)] if command == "export" else ["show", str(placement), "-o", str(pipe)]) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"collage: error: {pipe}: is a pipe, not a file Collage can replace; name a regular file to write"]
    assert pipe.is_fifo() and sorted(path.name for path in tmp_path.iterdir()) == [pipe.name]


@pytest.mark.parametrize("overwritten", ["model", "placement"])
def test_an_export_named_after_its_own_model_or_placement_is_refused_and_leaves_it(overwritten, tmp_path, capsys):
    """``collage export m.onnx --placement p.json -o m.onnx`` would replace the model with the tar."""
    from collage_core.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes((TESTS.parent / "models" / "tiny_resnet.onnx").read_bytes())
    placement = tmp_path / "p.json"
    placement.write_text("{}")
    target = model if overwritten == "model" else placement
    before = target.read_bytes()
    assert main(["export", str(model), "--placement", str(placement), "-o", str(target)]) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"collage: error: {target}: is the {overwritten} to export; name another file for the tar; nothing was built"]
    assert target.read_bytes() == before


def test_a_result_saved_by_hand_holds_the_folder_as_a_run_does(model, cost_db, tmp_path):
    """``OptimizedModel.save`` into a folder another run is writing into is refused in one line and
    writes nothing there; into a free folder it takes the lock and leaves none held; an empty name,
    which would be the current folder, is refused."""
    result = optimize_into(None, model, cost_db)
    busy = tmp_path / "busy"
    busy.mkdir()
    code = "import sys, time\nfrom collage_core.outputs.output_folder import held\nwith held(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(300)\n"
    holder = subprocess.Popen([sys.executable, "-c", code, str(busy)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CollageError, match=f"{busy} is in use by another Collage run \\(pid {holder.pid}\\)"):
            result.save(busy)
        assert not (busy / "placement.json").exists() and not list(busy.glob("*.so"))
    finally:
        holder.kill()
        holder.wait()
    saved = result.save(tmp_path / "free" / "out")
    assert {"placement.json", "report.txt", "results.json", LOCK_FILE} <= names_in(saved)
    with held(saved):  # released once saved
        pass
    with pytest.raises(CollageError, match="OptimizedModel.save: the folder is an empty string"):
        result.save("")
