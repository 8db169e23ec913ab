"""tiny_bert optimized with a tuning budget: TVM's costliest partitions tuned by MetaSchedule, the search run again,
tuned kernels placed where they won, and the outputs verified against ONNX Runtime. Minutes: marked slow. It runs
the installed plugin (``pip install -e plugins/metaschedule``), as ``collage optimize`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

import collage_core

MODELS = Path(__file__).resolve().parents[3] / "models"


@pytest.mark.slow
def test_tiny_bert_with_a_tuning_budget_places_tuned_kernels_and_verifies(tmp_path, monkeypatch, backends):
    if "tvm-tuned" not in backends:
        pytest.skip("collage-metaschedule is not installed: pip install -e plugins/metaschedule")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    result = collage_core.optimize(
        str(MODELS / "tiny_bert.onnx"),
        backends=["tvm", "tvm-tuned"],
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        calibration_rounds=0,
        compare_backends=False,
        tune_budget_s=60,
        show_progress=False,
    )
    assert "tuning" in result.phases_s and result.phases_s["tuning"] <= 60 + 5
    assert result.end_to_end[0].operators_by_backend.get("tvm-tuned", 0) > 0
    assert result.verification is not None and result.verification.passed
