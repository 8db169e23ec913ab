"""The main job on an NVIDIA GPU: the shipped models placed over TVM, cuBLAS and cuDNN, verified, replayed and loaded.

Marked ``gpu`` (run with ``--run-gpu``; scripts/gpu-tests.sh runs every GPU test from a clean
checkout). Numerics are checked by Collage's own verification against ONNX Runtime (tolerance
printed in its report) and here again on fresh inputs within 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import collage_core
from collage_core.deploy import load_library, load_vm
from collage_core import tvm_compat
from collage_core.report import render_report
from collage_core.result import PLACEMENT, WITHOUT_CUDA_GRAPHS

pytestmark = pytest.mark.gpu
MODELS = Path(__file__).resolve().parents[1] / "models"
BACKENDS = ["tvm", "cublas", "cudnn"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu")


@pytest.fixture(scope="module", params=["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def optimized(request, workspace):
    name = request.param
    return name, collage_core.optimize(
        str(MODELS / f"{name}.onnx"), target="cuda", backends=BACKENDS, cost_db=workspace / "costs.sqlite",
        output_dir=workspace / name, show_progress=False,
    )


def test_a_gpu_placement_uses_the_vendor_libraries_and_passes_numerics(optimized):
    name, result = optimized
    assert result.verification.passed, result.verification.describe()
    baselines = {entry.name: entry.cost for entry in result.end_to_end}
    vendors = ["cudnn"] if name == "tiny_resnet" else ["cublas", "cudnn"]
    for vendor in vendors:  # each library ran its share of the model end to end, beside TVM for the rest
        entry = next(cost for entry_name, cost in baselines.items() if entry_name.startswith(f"{vendor} "))
        assert entry.is_measured, entry
    inputs = result.model.random_inputs(seed=5)
    np.testing.assert_allclose(result.run(*inputs)[0], result.model.reference(inputs)[0], rtol=1e-4, atol=1e-4)


def test_the_library_loads_in_a_fresh_vm_and_gives_the_same_outputs(optimized):
    name, result = optimized
    vm = load_vm(result.library_path, tvm_compat.device_for(result.target))
    inputs = result.model.random_inputs(seed=6)
    device = tvm_compat.device_for(result.target)
    outputs = vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs])
    first = outputs if hasattr(outputs, "numpy") else outputs[0]
    np.testing.assert_allclose(tvm_compat.to_numpy(first), result.run(*inputs)[0], rtol=1e-5, atol=1e-5)


def test_the_library_replays_cuda_graphs_and_the_report_gives_the_gain(optimized):
    name, result = optimized
    from tvm import relax

    assert "vm.builtin.cuda_graph.run_or_capture" in relax.VMExecutable(load_library(result.library_path)).as_text()
    costs = {entry.name: entry.cost for entry in result.end_to_end}
    assert costs[PLACEMENT].is_measured and costs[WITHOUT_CUDA_GRAPHS].is_measured
    assert "CUDA graphs: " in render_report(result)
