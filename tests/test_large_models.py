"""ResNet-50 and a 4-layer BERT encoder from published architectures: the whole job, from the CLI (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "resnet50": ["--model", "resnet50"],
    "bert_l4_b1_s128": ["--model", "bert", "--layers", "4"],
}
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
        ["collage", "optimize", str(model), "--cost-db", str(costs), "--output", str(tmp_path / "out")],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "numerics passed" in run.stdout
    placement = json.loads((tmp_path / "out" / "placement.json").read_text())
    assert sum(len(p["operators"]) for p in placement["partitions"]) == len(placement["model"]["operators"])
    replay = subprocess.run(
        ["collage", "optimize", str(model), "--placement", str(tmp_path / "out" / "placement.json"), "--no-compare",
         "--output", str(tmp_path / "replay")],
        capture_output=True, text=True,
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert "numerics passed" in replay.stdout
    assert "replaying" in replay.stderr
