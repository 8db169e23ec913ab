"""Model Library Format: the tar's layout and determinism, loading it back in a new process, and refusing broken tars.

Placements are made without measuring (:func:`placement_file`): graph-level regions named by hand,
op-level placements searched over made-up costs that favour one backend, and replayed by
``collage_core.optimize(..., placement=...)``. Every kind of placement is exported, loaded in a new
process and compared with ONNX Runtime on the original model within rtol 1e-4 and atol 1e-5 (the
model's outputs are of order 1; the backends' float32 kernels differ from ONNX Runtime's by about
1e-6 there). The CUDA test is marked ``gpu`` (run with ``--run-gpu``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
from runtime_only import RUNTIME_ONLY_CHECK

import collage_core
from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.cli import EXIT_WARNINGS, main
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.outputs import mlf, mlf_export
from collage_core.outputs.mlf import MLFError, check_in_new_process, load_mlf
from collage_core.outputs.mlf_export import export_mlf
from collage_core.outputs.placement_file import Placement, load_placement
from collage_core.plugins import get_plugin_manager
from collage_core.records import Cost, Partition
from collage_core.search.op_level import search_op_level
from collage_core.search.regions import region_pattern

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny_resnet.onnx"
RTOL, ATOL = 1e-4, 1e-5


def available(*names: str) -> bool:
    infos = discover_backends(get_plugin_manager())
    return all(name in infos and infos[name].availability.available for name in names)


def whole(backend: str):
    """Every operator in one region of a graph-level backend."""
    return lambda graph, pm, target: [region(backend, range(len(graph.graph)))]


def region(backend: str, nodes) -> Partition:
    nodes = tuple(nodes)
    return Partition(backend, region_pattern(backend), nodes, f"{region_pattern(backend)}:{min(nodes)}", Cost.unknown())


def halves(first: str, second: str):
    """The operators before the middle (in execution order) in a region of ``first``, the rest in one of ``second``."""

    def parts(graph, pm, target):
        middle = len(graph.graph) // 2
        return [region(first, range(middle)), region(second, range(middle, len(graph.graph)))]

    return parts


def tail_region(backend: str, tail: int, rest: str):
    """The last ``tail`` operators in a region of ``backend``, each other operator alone on ``rest``."""

    def parts(graph, pm, target):
        start = len(graph.graph) - tail
        singles = [Partition(rest, f"{rest}.op", (n,), f"{rest}.op:{n}", Cost.unknown()) for n in range(start)]
        return [*singles, region(backend, range(start, len(graph.graph)))]

    return parts


def op_level(favoured: str, rest: str):
    """The op-level placement searched over made-up costs: a partition of ``favoured`` costs half one of ``rest``."""

    def parts(graph, pm, target):
        installed = {name: info.backend for name, info in discover_backends(pm).items()}
        candidates = [c for name in (favoured, rest) for c in enumerate_candidates(graph, contribute_patterns(pm, installed[name], target))]
        costs = {c.key: Cost.measured(1e-3 if c.backend == favoured else 2e-3, 0.0, 1) for c in candidates}
        return [Partition.from_candidate(c, costs[c.key]) for c in search_op_level(graph.graph, candidates, costs)]

    return parts


def placement_file(path: Path, parts, model: Path = MODEL, target=None) -> Path:
    """A placement of ``model`` made without measuring (``parts(graph, pm, target)`` gives its partitions),
    recorded with the installed versions of its backends, as ``collage optimize`` writes one."""
    pm = get_plugin_manager()
    target = tvm_compat.make_target(target)
    imported = load_model(str(model))
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    partitions = parts(graph, pm, target)
    installed = {name: info.backend for name, info in discover_backends(pm).items()}
    return Placement(
        model_name=imported.name,
        model_fingerprint=imported.fingerprint,
        operators=graph.graph.ops,
        target=tvm_compat.target_to_dict(target),
        device=tvm_compat.device_name(target),
        backends={p.backend: {"version": installed[p.backend].version, "kind": installed[p.backend].kind} for p in partitions},
        search="made for a test, nothing measured",
        partitions=partitions,
    ).save(path)


def replayed(path: Path, model: Path = MODEL, target=None):
    """The placement file at ``path`` rebuilt and verified by ``optimize``, nothing measured but its end-to-end run."""
    backends = sorted({p.backend for p in load_placement(path).partitions})
    return collage_core.optimize(str(model), target=target, backends=backends, placement=path, compare_backends=False, show_progress=False)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    """tiny_resnet op-level on DNNL where its patterns cover the operators, TVM for the rest."""
    if not available("dnnl", "tvm"):
        pytest.skip("the DNNL backend is not available here")
    return replayed(placement_file(tmp_path_factory.mktemp("placement") / "placement.json", op_level("dnnl", "tvm")))


@pytest.fixture(scope="module")
def exported(optimized, tmp_path_factory):
    return export_mlf(optimized, tmp_path_factory.mktemp("export") / "tiny_resnet.tar")


def members(path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as archive:
        return {m.name: m for m in archive.getmembers()}


def test_layout_follows_model_library_format(exported):
    names = set(members(exported))
    assert {"metadata.json", "executor-config/relax-vm.json", "parameters/tiny_resnet.params", "src/relax.txt", "placement.json"} <= names
    assert {"codegen/host/lib/lib0.o", "codegen/host/lib/devc.o"} <= names


def test_metadata_describes_model_memory_targets_and_placement(exported, optimized):
    with tarfile.open(exported) as archive:
        metadata = json.loads(archive.extractfile("metadata.json").read())
        config = json.loads(archive.extractfile("executor-config/relax-vm.json").read())
        relax_text = archive.extractfile("src/relax.txt").read().decode()
        listed = {name: hashlib.sha256(archive.extractfile(name).read()).hexdigest() for name in metadata["files"]}
    assert metadata["version"] == 1 and metadata["model_name"] == "tiny_resnet" and metadata["executor"] == "relax-vm"
    assert metadata["export_datetime"].endswith("Z") and metadata["target"]["host"]["kind"] == "llvm"
    assert listed == metadata["files"]
    functions = {f["function"]: f for f in metadata["memory"]["functions"]}
    assert functions["main"]["input_bytes"] == 1 * 3 * 32 * 32 * 4 and functions["main"]["output_bytes"] == 10 * 4
    assert metadata["memory"]["constant_bytes"] > 0
    placed = {p.backend for p in optimized.placement.partitions}
    assert set(metadata["placement"]["backends"]) == placed
    assert sum(b["operators"] for b in metadata["placement"]["backends"].values()) == len(optimized.placement.operators)
    assert config["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert set(config["runtime_backends"]) == placed
    assert "collage.backend" in relax_text


def test_tar_is_deterministic_and_owned_by_root(optimized, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first, second = export_mlf(optimized, tmp_path / "a.tar"), export_mlf(optimized, tmp_path / "b.tar")
    assert first.read_bytes() == second.read_bytes()
    infos = list(members(first).values())
    assert [i.name for i in infos if i.isfile()] == sorted(i.name for i in infos if i.isfile())
    assert all(i.uid == 0 and i.gid == 0 and i.uname == "root" and i.mtime == 1700000000 for i in infos)
    with tarfile.open(first) as archive:
        assert json.loads(archive.extractfile("metadata.json").read())["export_datetime"] == "2023-11-14T22:13:20Z"


def test_native_kernels_travel_in_the_tar(exported, optimized):
    with tarfile.open(exported) as archive:
        config = json.loads(archive.extractfile("executor-config/relax-vm.json").read())
    names = set(members(exported))
    for backend, needs in config["runtime_backends"].items():
        assert needs["carried"] == (["runtime/dnnl/libcollage_dnnl.so"] if backend == "dnnl" else []), backend
        assert set(needs["carried"]) <= names


def test_loaded_in_a_new_process_with_tvm_runtime_alone_it_gives_the_outputs_it_gave_before_export(
    exported, optimized, tmp_path, runtime_only_env
):
    inputs = optimized.model.random_inputs()
    before = optimized.run(*inputs)
    np.savez(tmp_path / "inputs.npz", *inputs)
    code = RUNTIME_ONLY_CHECK + (
        "import sys, numpy as np\n"
        "from collage_core.outputs.mlf import load_mlf\n"
        "saved = np.load(sys.argv[2])\n"
        "outputs = load_mlf(sys.argv[1]).run(*[saved[f'arr_{i}'] for i in range(len(saved.files))])\n"
        "np.savez(sys.argv[3], *outputs)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(exported), str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**runtime_only_env, "CXX": "g++"},  # a linker, not TVM's compiler
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with np.load(tmp_path / "outputs.npz") as after:
        for index, expected in enumerate(before):
            np.testing.assert_array_equal(after[f"arr_{index}"], expected)


def test_parameters_round_trip_in_tvm_serialization(exported):
    loaded = load_mlf(exported)
    assert loaded.parameters and all(isinstance(v, np.ndarray) for v in loaded.parameters.values())
    stored = sum(v.nbytes for v in loaded.parameters.values())
    assert stored == loaded.metadata["memory"]["parameter_bytes"] <= loaded.metadata["memory"]["constant_bytes"]
    distinct = {(v.dtype.str, v.shape, v.tobytes()) for v in loaded.parameters.values()}
    assert len(distinct) == len(loaded.parameters)


def rewritten(source: Path, target: Path, change) -> Path:
    """A copy of the tar ``source`` with ``change(files)`` applied to its {name: bytes}."""
    with tarfile.open(source) as archive:
        files = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    change(files)
    with tarfile.open(target, "w") as archive:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return target


def _set_version(files, version):
    metadata = json.loads(files["metadata.json"])
    metadata["version"] = version
    files["metadata.json"] = json.dumps(metadata).encode()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda files: _set_version(files, 2), r"Model Library Format version 2 \(this Collage reads version 1\)"),
        (lambda files: files.pop("placement.json"), r"placement\.json is listed in metadata\.json but missing"),
        (
            lambda files: files.update({"codegen/host/lib/lib0.o": bytes(len(files["codegen/host/lib/lib0.o"]))}),
            r"codegen/host/lib/lib0\.o does not match its SHA-256",
        ),
        (
            lambda files: files.update({"codegen/host/lib/lib0.o": b"\0" * 64}),
            r"codegen/host/lib/lib0\.o is 64 bytes in the tar, and metadata\.json declares \d+",
        ),
        (lambda files: files.pop("metadata.json"), r"no metadata\.json"),
    ],
    ids=["other-version", "missing-part", "corrupt-object", "other-size", "no-metadata"],
)
def test_broken_tars_are_refused_saying_what_is_wrong(exported, tmp_path, change, message):
    broken = rewritten(exported, tmp_path / "broken.tar", change)
    with pytest.raises(MLFError, match=rf"broken\.tar: {message}"):
        load_mlf(broken)


def test_a_file_that_is_not_a_tar_is_refused(tmp_path):
    not_tar = tmp_path / "model.tar"
    not_tar.write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(MLFError, match=r"model\.tar: not a readable tar"):
        load_mlf(not_tar)


def test_cli_export_writes_a_tar_that_loads_and_leaves_no_temporary_files(optimized, tmp_path):
    placement = optimized.placement.save(tmp_path / "placement.json")
    (tmp_path / "tmp").mkdir()
    result = subprocess.run(
        ["collage", "export", str(MODEL), "--placement", str(placement), "--format", "mlf", "-o", str(tmp_path / "out.tar")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loaded and run once in a new process" in result.stdout and "Scope Loaded" not in result.stderr
    assert not (tmp_path / "out.tar.partial").exists()
    # No folder of the replay's library, of the check's inputs or of its unpacked tar (a backend's telemetry leaves a file).
    assert [entry.name for entry in (tmp_path / "tmp").iterdir() if entry.is_dir()] == []
    loaded = load_mlf(tmp_path / "out.tar")
    inputs = optimized.model.random_inputs()
    for actual, expected in zip(loaded.run(*inputs), optimized.run(*inputs)):
        np.testing.assert_array_equal(actual, expected)


def test_cli_export_of_a_placement_for_another_model_fails_in_one_line(optimized, tmp_path):
    placement = optimized.placement.save(tmp_path / "placement.json")
    result = subprocess.run(
        ["collage", "export", str(ROOT / "models" / "tiny_bert.onnx"), "--placement", str(placement), "-o", str(tmp_path / "x.tar")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1 and not (tmp_path / "x.tar").exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("collage: error:")]
    assert len(errors) == 1 and "placement.json: operator 0 is relax.nn.conv2d in the placement" in errors[0]


KINDS = {
    "onnxruntime alone": (whole("onnxruntime"), ("onnxruntime",)),
    "openvino alone": (whole("openvino"), ("openvino",)),
    "onnxruntime then openvino": (halves("onnxruntime", "openvino"), ("onnxruntime", "openvino")),
    "inductor region beside tvm": (tail_region("inductor", 4, "tvm"), ("inductor", "tvm")),
    "dnnl and tvm": (op_level("dnnl", "tvm"), ("dnnl", "tvm")),
}


# Inductor's region compiles with torch.compile in the export and again in the new process: with --run-slow.
@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.slow) if "inductor" in kind else kind for kind in KINDS])
def test_every_kind_of_placement_exports_and_loads_in_a_new_process(kind, tmp_path):
    parts, backends = KINDS[kind]
    if not available(*backends):
        pytest.skip(f"not every backend of {kind} is available here")
    placed = replayed(placement_file(tmp_path / "placement.json", parts))
    assert {p.backend for p in placed.placement.partitions} == set(backends)
    tar = export_mlf(placed, tmp_path / "model.tar")
    names = set(members(tar))
    assert {"codegen/host/lib/lib0.o", "codegen/host/lib/devc.o"} <= names  # compiled host code, whatever the placement
    assert not [name for name in names if name.startswith("codegen/") and name.endswith((".c", ".cc"))]
    inputs = placed.model.random_inputs(seed=3)
    outputs = check_in_new_process(tar, inputs)
    reference = placed.model.reference(inputs)
    assert len(outputs) == len(reference)
    for actual, expected in zip(outputs, reference):
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_the_lowered_ir_says_what_each_partition_calls_under_numbered_names(exported, optimized):
    with tarfile.open(exported) as archive:
        metadata = json.loads(archive.extractfile("metadata.json").read())
        texts = {
            m.name: archive.extractfile(m).read().decode() for m in archive.getmembers() if m.name.startswith("src/lowered/") and m.isfile()
        }
        relax_text = archive.extractfile("src/relax.txt").read().decode()
    lowered = {entry["function"]: entry for entry in metadata["lowered"]}
    assert lowered["main"]["member"] == "src/lowered/000-main.txt"
    functions = set(re.findall(r"def (collage_\w+)\(", relax_text))
    assert set(lowered) == functions | {"main"} and set(texts) == {entry["member"] for entry in lowered.values()}
    assert all(re.fullmatch(r"src/lowered/\d{3}-[A-Za-z0-9_]+\.txt", member) for member in texts)
    for name, entry in lowered.items():
        text = texts[entry["member"]]
        assert text.startswith(f"# {name}: ") and f"def {name}(" in text
        if entry["backend"] == "dnnl":
            assert entry["packed_functions"] == ["collage_dnnl.run"] and entry["tir_functions"] == []
            assert "# packed functions it calls: collage_dnnl.run" in text
        elif entry["backend"] == "tvm":
            assert entry["tir_functions"] and entry["packed_functions"] == []
            assert all("@T.prim_func" in text and f"def {tir}(" in text for tir in entry["tir_functions"])
    assert {entry["backend"] for entry in lowered.values()} == {"", "dnnl", "tvm"}


def test_a_model_named_with_spaces_and_accents_exports_and_loads(tmp_path):
    """Its name is kept in the metadata, and names its weights' member and the library it is linked to."""
    import shutil

    renamed = tmp_path / "tiny résnet v2.onnx"
    shutil.copy(MODEL, renamed)
    placed = replayed(placement_file(tmp_path / "placement.json", op_level("tvm", "tvm"), model=renamed), model=renamed)
    tar = export_mlf(placed, tmp_path / "model.tar")
    assert "parameters/tiny résnet v2.params" in set(members(tar))
    loaded = load_mlf(tar, workdir=tmp_path / "unpacked")
    assert loaded.metadata["model_name"] == "tiny résnet v2" and loaded.library == tmp_path / "unpacked" / "tiny résnet v2.so"
    assert loaded.parameters
    inputs = placed.model.random_inputs(seed=5)
    np.testing.assert_allclose(loaded.run(*inputs)[0], placed.model.reference(inputs)[0], rtol=RTOL, atol=ATOL)


def test_names_from_the_model_never_choose_a_member_path():
    assert mlf._parameters_member("../../etc/passwd") == "parameters/_.._etc_passwd.params"
    assert mlf_export._member_name(7, "../../etc/passwd x") == "src/lowered/007-_etc_passwd_x.txt"
    assert mlf_export._member_name(8, "a/" * 100).count("/") == 2


def with_files(source: Path, target: Path, change) -> Path:
    """A copy of the tar ``source`` with ``change(files)`` applied to its {name: bytes}, its metadata's digests and
    sizes updated."""

    def changed_and_listed(files):
        change(files)
        metadata = json.loads(files["metadata.json"])
        metadata["files"] = {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name != "metadata.json"}
        metadata["sizes"] = {name: len(data) for name, data in files.items() if name != "metadata.json"}
        files["metadata.json"] = json.dumps(metadata).encode()

    return rewritten(source, target, changed_and_listed)


def with_config(change):
    def apply(files):
        config = json.loads(files["executor-config/relax-vm.json"])
        change(config)
        files["executor-config/relax-vm.json"] = json.dumps(config).encode()

    return apply


@pytest.mark.parametrize("other", ["shorter", "longer"])
def test_a_tar_built_with_other_backend_versions_warns_naming_both_or_with_strict_is_refused(exported, tmp_path, caplog, other):
    installed = discover_backends(get_plugin_manager())["dnnl"].backend.version
    recorded = {"shorter": installed.rsplit("+", 1)[0], "longer": f"{installed}+threads-1"}[other]
    tar = with_files(
        exported, tmp_path / "older.tar", with_config(lambda config: config["runtime_backends"]["dnnl"].update(version=recorded))
    )
    expected = f"{tar} was built with dnnl {recorded}, and dnnl {installed} is installed here"
    with pytest.raises(MLFError, match=re.escape(expected)):
        load_mlf(tar, strict=True)
    with caplog.at_level(logging.WARNING, logger="collage"):
        loaded = load_mlf(tar)
    assert [r.getMessage() for r in caplog.records if "was built with" in r.getMessage()] == [
        f"{expected}: its partitions run on the installed version"
    ]
    assert loaded.run(*loaded.random_inputs())[0].shape == (1, 10)


def test_load_errors_name_the_tar_and_its_members_never_the_files_it_was_unpacked_to(exported, tmp_path):
    with pytest.raises(MLFError) as refused:
        load_mlf(exported, pm=get_plugin_manager(disabled=["dnnl"]))
    assert str(refused.value).startswith(f"{exported}: partitions run on backend dnnl, which is not installed here")
    assert "collage-mlf-" not in str(refused.value)
    broken = with_files(exported, tmp_path / "broken.tar", lambda files: files.update({"codegen/host/lib/devc.o": b"\0" * 64}))
    with pytest.raises(MLFError) as refused:
        load_mlf(broken)
    assert str(refused.value).startswith(f"{broken}: ") and "collage-mlf-" not in str(refused.value)


def test_a_tar_that_does_not_load_in_a_new_process_is_named_with_the_problem_in_one_line(exported, tmp_path):
    unknown = with_files(
        exported,
        tmp_path / "model.tar",
        with_config(
            lambda config: config["runtime_backends"].update(
                nosuch={"kind": "op-level", "version": "1", "needs": "pip install collage-nosuch"}
            )
        ),
    )
    with pytest.raises(MLFError) as refused:
        check_in_new_process(unknown, [np.zeros((1, 3, 32, 32), "float32")])
    message = str(refused.value)
    assert message == (f"{unknown}: partitions run on backend nosuch, which is not installed here: it needs pip install collage-nosuch")


def test_the_loaded_tar_describes_its_inputs_and_makes_the_models_random_inputs(exported, optimized):
    loaded = load_mlf(exported)
    assert loaded.input_specs == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    # the outputs under the ONNX graph's own names, not the Relax function's variables (gv)
    assert loaded.executor_config["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]
    for made, expected in zip(loaded.random_inputs(seed=4), optimized.model.random_inputs(seed=4)):
        np.testing.assert_array_equal(made, expected)


def test_cli_export_of_a_tar_that_does_not_load_fails_in_one_line_and_leaves_it_partial(optimized, tmp_path, monkeypatch, capsys):
    placement = optimized.placement.save(tmp_path / "placement.json")
    (tmp_path / "out.tar").write_bytes(b"an earlier export")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(mlf, "RUN_ONCE", "import os; os.abort()")  # the process loading the tar crashes
    status = main(["export", str(MODEL), "--placement", str(placement), "-o", str(tmp_path / "out.tar")])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("collage: error:")]
    assert status == 1 and errors == [
        f"collage: error: {tmp_path / 'out.tar'}: the exported tar does not load and run in a new process: the process "
        "loading it died of SIGABRT (left as out.tar.partial)"
    ]
    assert not (tmp_path / "out.tar").exists() and tarfile.is_tarfile(tmp_path / "out.tar.partial")
    assert [entry.name for entry in (tmp_path / "tmp").iterdir() if entry.is_dir()] == []


def test_an_export_interrupted_while_its_tar_is_checked_leaves_the_earlier_export_and_no_partial(optimized, tmp_path, monkeypatch):
    """Ctrl-C while the new process loads the tar: the earlier export stays as it was and nothing half-done is left."""
    (tmp_path / "out.tar").write_bytes(b"an earlier export")

    def interrupted(path, inputs, timeout_s=0):
        raise KeyboardInterrupt

    monkeypatch.setattr(mlf_export, "check_in_new_process", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_mlf(optimized, tmp_path / "out.tar", check_inputs=optimized.model.random_inputs())
    assert (tmp_path / "out.tar").read_bytes() == b"an earlier export"
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["out.tar"]


@pytest.mark.slow
def test_cli_export_of_a_placement_measured_with_other_versions_warns_and_with_strict_exits_4(optimized, tmp_path):
    data = optimized.placement.to_json()
    installed = data["backends"]["dnnl"]["version"]
    data["backends"]["dnnl"]["version"] = "onednn-2.6.3+kernels-1"
    placement = tmp_path / "placement.json"
    placement.write_text(json.dumps(data))
    result = subprocess.run(
        ["collage", "export", str(MODEL), "--placement", str(placement), "-o", str(tmp_path / "out.tar"), "--strict"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    warned = f"warning: {placement} was measured with dnnl onednn-2.6.3+kernels-1, and dnnl {installed} is installed here"
    assert result.returncode == EXIT_WARNINGS, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("warning:")] == [
        f"{warned}: its costs and choices may not hold here"
    ]
    assert load_mlf(tmp_path / "out.tar").metadata["model_name"] == "tiny_resnet"


@pytest.mark.gpu
def test_a_cuda_placement_exports_and_loads_in_a_new_process(tmp_path):
    """tiny_resnet on cuDNN where its patterns cover the operators, TVM for the rest, replaying CUDA graphs;
    compared with ONNX Runtime on the CPU within rtol 1e-4 and atol 1e-4, as tests/test_gpu_placements.py does."""
    placed = replayed(placement_file(tmp_path / "placement.json", op_level("cudnn", "tvm"), target="cuda"), target="cuda")
    assert {p.backend for p in placed.placement.partitions} == {"cudnn", "tvm"}
    tar = export_mlf(placed, tmp_path / "model.tar")
    inputs = placed.model.random_inputs(seed=3)
    outputs = check_in_new_process(tar, inputs)
    for actual, expected in zip(outputs, placed.model.reference(inputs)):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
    with tarfile.open(tar) as archive:
        lowered = json.loads(archive.extractfile("metadata.json").read())["lowered"]
    assert {"collage_cudnn.run"} == {name for entry in lowered if entry["backend"] == "cudnn" for name in entry["packed_functions"]}


def test_an_export_named_after_a_folder_is_refused_before_anything_is_built(tiny_bert_on_tvm, tmp_path, monkeypatch):
    from collage_core.outputs import mlf_export

    monkeypatch.setattr(mlf_export, "build", lambda *args, **kwargs: pytest.fail("built before the name was checked"))
    with pytest.raises(MLFError, match=f"^{tmp_path}: is a folder; name the tar to write \\(model.tar\\); nothing was built$"):
        export_mlf(tiny_bert_on_tvm, tmp_path)
    assert list(tmp_path.iterdir()) == []
