"""Model Library Format: the tar's layout and determinism, loading it back in a new process, and refusing broken tars."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from runtime_only import RUNTIME_ONLY_CHECK

import collage_core
from collage_core.backends import discover_backends
from collage_core.mlf import MLFError, export_mlf, load_mlf
from collage_core.plugins import get_plugin_manager

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny_resnet.onnx"


def _backends() -> list[str]:
    infos = discover_backends(get_plugin_manager())
    return [name for name in ("dnnl", "tvm") if name in infos and infos[name].availability.available]


@pytest.fixture(scope="module")
def optimized(shared_cost_db):
    return collage_core.optimize(
        str(MODEL), backends=_backends(), search="op-level", cost_db=shared_cost_db, compare_backends=False,
        calibration_rounds=0, show_progress=False,
    )


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
        "from collage_core.mlf import load_mlf\n"
        "saved = np.load(sys.argv[2])\n"
        "outputs = load_mlf(sys.argv[1]).run(*[saved[f'arr_{i}'] for i in range(len(saved.files))])\n"
        "np.savez(sys.argv[3], *outputs)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(exported), str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")],
        capture_output=True, text=True, timeout=300, env={**runtime_only_env, "CXX": "g++"},  # a linker, not TVM's compiler
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with np.load(tmp_path / "outputs.npz") as after:
        for index, expected in enumerate(before):
            np.testing.assert_array_equal(after[f"arr_{index}"], expected)


def test_parameters_round_trip_in_tvm_serialization(exported):
    loaded = load_mlf(exported)
    assert loaded.parameters and all(isinstance(v, np.ndarray) for v in loaded.parameters.values())
    assert sum(v.nbytes for v in loaded.parameters.values()) == loaded.metadata["memory"]["constant_bytes"]


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
        (lambda files: files.update({"codegen/host/lib/lib0.o": b"\0" * 64}), r"codegen/host/lib/lib0\.o does not match its SHA-256"),
        (lambda files: files.pop("metadata.json"), r"no metadata\.json"),
    ],
    ids=["other-version", "missing-part", "corrupt-object", "no-metadata"],
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


def test_cli_export_writes_a_tar_that_loads(optimized, tmp_path):
    placement = optimized.placement.save(tmp_path / "placement.json")
    result = subprocess.run(
        ["collage", "export", str(MODEL), "--placement", str(placement), "--format", "mlf", "-o", str(tmp_path / "out.tar")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = load_mlf(tmp_path / "out.tar")
    inputs = optimized.model.random_inputs()
    for actual, expected in zip(loaded.run(*inputs), optimized.run(*inputs)):
        np.testing.assert_array_equal(actual, expected)


def test_cli_export_of_a_placement_for_another_model_fails_in_one_line(optimized, tmp_path):
    placement = optimized.placement.save(tmp_path / "placement.json")
    result = subprocess.run(
        ["collage", "export", str(ROOT / "models" / "tiny_bert.onnx"), "--placement", str(placement), "-o", str(tmp_path / "x.tar")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 1 and not (tmp_path / "x.tar").exists()
    errors = [line for line in result.stderr.splitlines() if line.startswith("collage: error:")]
    assert len(errors) == 1 and "placement.json: operator 0 is relax.nn.conv2d in the placement" in errors[0]
