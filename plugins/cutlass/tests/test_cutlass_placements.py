"""CUTLASS in whole placements on a Hopper GPU: the shipped transformers at fp16 over TVM, cuBLAS and CUTLASS.

Marked ``gpu`` (``--run-gpu`` on an H100/H200; scripts/gpu-tests.sh). Each model's CUTLASS candidates
are compiled (or found in ``$COLLAGE_CACHE_DIR``, e.g. from ``python -m collage_cutlass.prebuild``),
tuned and measured against cuBLAS and TVM; the placement must pass fp16's tolerance in Collage's own
verification and again here on fresh inputs against ONNX Runtime at fp32. A second optimization with
a fresh cost database (every candidate measured again) must compile and tune nothing: the kernels and
the tuning are remembered on this machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from collage_cutlass import library

import collage_core
from collage_core.kit.testing import tolerance

pytestmark = pytest.mark.gpu
MODELS = Path(__file__).resolve().parents[3] / "models"
BACKENDS = ["tvm", "cublas", "cutlass"]


@pytest.fixture(autouse=True)
def two_configurations(monkeypatch):
    """Tuning and its memory are the question here, not the fastest kernel: two configurations unless told otherwise."""
    if "COLLAGE_CUTLASS_TILES" not in os.environ:
        monkeypatch.setenv("COLLAGE_CUTLASS_TILES", "2")


def _cache_state() -> tuple[str, str]:
    read = lambda name: (library.cache_dir() / name).read_text() if (library.cache_dir() / name).is_file() else ""  # noqa: E731
    return read("compile_seconds.json"), read("tuning.json")


def _optimize(name, tmp_path, run):
    return collage_core.optimize(
        str(MODELS / f"{name}.onnx"),
        target="cuda",
        backends=BACKENDS,
        cost_db=tmp_path / f"costs-{run}.sqlite",
        output_dir=tmp_path / f"{name}-{run}",
        show_progress=False,
        compare_backends=False,
        precision="fp16",
    )


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_gpt2"])
def test_cutlass_candidates_are_tuned_and_measured_and_a_rerun_compiles_nothing(name, tmp_path):
    result = _optimize(name, tmp_path, "first")
    assert result.verification.passed, result.verification.describe()
    considered = [c for c in result.placement.considered if c.backend == "cutlass"]
    assert considered and any(c.cost.is_measured for c in considered), [str(c.cost) for c in considered]
    held_to = tolerance("fp16")
    inputs = result.model.random_inputs(seed=11)
    got, expected = result.run(*inputs)[0], result.model.reference(inputs)[0]
    assert np.abs(got - expected).max() <= held_to.atol + held_to.rtol * np.abs(expected).max()
    chosen = sorted({p.backend for p in result.placement.partitions})
    print(
        f"{name} fp16: backends placed {chosen}; CUTLASS candidates measured "
        f"{sum(c.cost.is_measured for c in considered)} of {len(considered)}"
    )

    compiled, tuned = _cache_state()
    assert json.loads(tuned or "{}"), "tuning recorded nothing"
    again = _optimize(name, tmp_path, "second")
    assert again.verification.passed
    assert _cache_state() == (compiled, tuned)  # nothing compiled, nothing timed again
