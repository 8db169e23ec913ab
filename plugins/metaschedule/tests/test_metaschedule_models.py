"""tiny_bert optimized with a tuning budget: TVM's costliest partitions tuned by MetaSchedule, the search run again,
tuned kernels placed where they won, and the outputs verified against ONNX Runtime. Minutes: marked slow. It runs
the installed plugin (``pip install -e plugins/metaschedule``), as ``collage optimize`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

import collage_core

MODELS = Path(__file__).resolve().parents[3] / "models"


def tuned_tiny_bert(tmp_path, monkeypatch, installed, **options):
    """tiny_bert placed by the op-level search with a tuning budget, the tuning database in ``tmp_path`` (skipped
    unless ``installed``, the backends found, has tvm-tuned)."""
    if "tvm-tuned" not in installed:
        pytest.skip("collage-metaschedule is not installed: pip install -e plugins/metaschedule")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    return collage_core.optimize(
        str(MODELS / "tiny_bert.onnx"),
        search="op-level",
        cost_db=tmp_path / "costs.sqlite",
        calibration_rounds=0,
        compare_backends=False,
        show_progress=False,
        **options,
    )


@pytest.mark.slow
def test_tiny_bert_with_a_tuning_budget_places_tuned_kernels_and_verifies(tmp_path, monkeypatch, backends):
    result = tuned_tiny_bert(tmp_path, monkeypatch, backends, backends=["tvm", "tvm-tuned"], tune_budget_s=60)
    assert "tuning" in result.phases_s and result.phases_s["tuning"] <= 60 + 5
    assert result.end_to_end[0].operators_by_backend.get("tvm-tuned", 0) > 0
    assert result.verification is not None and result.verification.passed


@pytest.mark.gpu
def test_on_cuda_tiny_bert_with_a_tuning_budget_measures_tuned_kernels_and_verifies(tmp_path, monkeypatch, backends):
    """The same on the GPU, beside cuBLAS: TVM's partitions tuned for CUDA (MetaSchedule's CUDA schedules; records using
    tensor-core intrinsics would fail to build and be costed invalid), each tuned kernel measured as a candidate."""
    result = tuned_tiny_bert(tmp_path, monkeypatch, backends, target="cuda", backends=["tvm", "cublas", "tvm-tuned"], tune_budget_s=90)
    tuned = [c for c in result.placement.considered if c.backend == "tvm-tuned"]
    print(
        f"tvm-tuned: {len(tuned)} candidates, {sum(c.cost.is_measured for c in tuned)} measured; placed {result.end_to_end[0].operators_by_backend}"
    )
    assert "tuning" in result.phases_s and any(c.cost.is_measured for c in tuned)
    assert result.verification is not None and result.verification.passed
