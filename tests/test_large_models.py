"""ResNet-50 and a 4-layer BERT encoder from published architectures: the whole job, from the CLI (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"resnet50": ["--model", "resnet50"], "bert_l4_b1_s128": ["--model", "bert", "--layers", "4"]}
FILES = {"resnet50": "resnet50_b1.onnx", "bert_l4_b1_s128": "bert_l4_b1_s128.onnx"}


def _model_file(name: str) -> Path:
    path = ROOT / "models" / "hf" / FILES[name]
    if not path.exists():
        pytest.importorskip("transformers")
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_hf_models.py"), *MODELS[name]], check=True, cwd=ROOT)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_optimize_and_replay_large_model(name, tmp_path):
    model = _model_file(name)
    costs = tmp_path / "costs.sqlite"
    run = subprocess.run(
        ["collage", "optimize", str(model), "--cost-db", str(costs), "--output", str(tmp_path / "out")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "numerics passed" in run.stdout
    placement = json.loads((tmp_path / "out" / "placement.json").read_text())
    assert sum(len(p["operators"]) for p in placement["partitions"]) == len(placement["model"]["operators"])
    replay = subprocess.run(
        [
            "collage",
            "optimize",
            str(model),
            "--placement",
            str(tmp_path / "out" / "placement.json"),
            "--no-compare",
            "--output",
            str(tmp_path / "replay"),
        ],
        capture_output=True,
        text=True,
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert "numerics passed" in replay.stdout
    assert "replaying" in replay.stderr


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.slow
def test_resnet50_exported_to_mlf_runs_in_a_new_process_as_before_export(tmp_path):
    model = _model_file("resnet50")
    out = tmp_path / "out"
    run = subprocess.run(
        [
            "collage",
            "optimize",
            str(model),
            "--search",
            "op-level",
            "--no-compare",
            "--calibration-rounds",
            "0",
            "--cost-db",
            str(tmp_path / "costs.sqlite"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    export = subprocess.run(
        ["collage", "export", str(model), "--placement", str(out / "placement.json"), "-o", str(tmp_path / "resnet50.tar")],
        capture_output=True,
        text=True,
    )
    assert export.returncode == 0, export.stderr[-2000:]
    code = (
        "import sys, numpy as np\n"
        "from collage_core.build.deploy import load_vm\n"
        "from collage_core.outputs.mlf import load_mlf\n"
        "from collage_core import tvm_compat\n"
        "x = np.random.default_rng(0).uniform(-1, 1, size=(1, 3, 224, 224)).astype('float32')\n"
        "before = load_vm(sys.argv[1])['main'](tvm_compat.to_tensor(x, __import__('tvm').cpu(0))).numpy()\n"
        "after = load_mlf(sys.argv[2]).run(x)[0]\n"
        "assert np.array_equal(before, after), np.abs(before - after).max()\n"
        "print('same outputs', before.shape)\n"
    )
    check = subprocess.run(
        [sys.executable, "-c", code, str(out / "resnet50_b1.so"), str(tmp_path / "resnet50.tar")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr[-2000:]
    assert "same outputs (1, 1000)" in check.stdout
    picture = subprocess.run(
        ["collage", "show", str(out / "placement.json"), "-o", str(tmp_path / "resnet50.png")], capture_output=True, text=True
    )
    assert picture.returncode == 0, picture.stderr[-2000:]
    width, height = _png_size(tmp_path / "resnet50.png")
    assert width >= 300 and height >= 2000


@pytest.mark.slow
def test_bert_base_placement_renders_to_png(tmp_path):
    model = ROOT / "models" / "hf" / "bert_l12_b1_s128.onnx"
    if not model.exists():
        pytest.importorskip("transformers")
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_hf_models.py"), "--model", "bert-base"], check=True, cwd=ROOT)
    out = tmp_path / "out"
    run = subprocess.run(
        [
            "collage",
            "optimize",
            str(model),
            "--search",
            "op-level",
            "--no-compare",
            "--calibration-rounds",
            "0",
            "--cost-db",
            str(tmp_path / "costs.sqlite"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    picture = subprocess.run(
        ["collage", "show", str(out / "placement.json"), "-o", str(tmp_path / "bert.png"), "--explain"], capture_output=True, text=True
    )
    assert picture.returncode == 0, picture.stderr[-2000:]
    width, height = _png_size(tmp_path / "bert.png")
    assert width >= 300 and height >= 4000
    assert picture.stdout.count("chosen") >= len(__import__("json").loads((out / "placement.json").read_text())["partitions"])
