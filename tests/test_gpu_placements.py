"""The main job on an NVIDIA GPU: the shipped models placed over TVM, cuBLAS and cuDNN, verified, replayed and loaded.

Marked ``gpu`` (run with ``--run-gpu``; scripts/gpu-tests.sh runs every GPU test from a clean
checkout). Numerics are checked by Collage's own verification against ONNX Runtime (tolerance
printed in its report) and here again on fresh inputs within 1e-4; loaded copies are compared with
the library in this process within 1e-5, where NaN on both sides fails (``equal_nan=False``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_only import RUNTIME_ONLY_CHECK

import collage_core
from collage_core import tvm_compat
from collage_core.build.deploy import load_library, load_vm, runtime_file
from collage_core.model.precision import tolerance
from collage_core.outputs.end_to_end import PLACEMENT, WITHOUT_CUDA_GRAPHS
from collage_core.outputs.mlf_export import export_mlf
from collage_core.outputs.report import render_report

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
        str(MODELS / f"{name}.onnx"),
        target="cuda",
        backends=BACKENDS,
        cost_db=workspace / "costs.sqlite",
        output_dir=workspace / name,
        show_progress=False,
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
    np.testing.assert_allclose(tvm_compat.to_numpy(first), result.run(*inputs)[0], rtol=1e-5, atol=1e-5, equal_nan=False)


def test_the_library_replays_cuda_graphs_and_the_report_gives_the_gain(optimized):
    name, result = optimized
    from tvm import relax

    assert "vm.builtin.cuda_graph.run_or_capture" in relax.VMExecutable(load_library(result.library_path)).as_text()
    costs = {entry.name: entry.cost for entry in result.end_to_end}
    assert costs[PLACEMENT].is_measured and costs[WITHOUT_CUDA_GRAPHS].is_measured
    assert "CUDA graphs: " in render_report(result)


# How TVM serializes a CUDA module's format: a length-prefixed string before the kernels.
COMPILED_FORMATS = (b"\x05\x00\x00\x00\x00\x00\x00\x00cubin", b"\x06\x00\x00\x00\x00\x00\x00\x00fatbin")
RUN_ALONE = (
    "import sys, numpy as np, tvm\n"
    "from collage_core.build.deploy import load_vm\n"
    "from collage_core.outputs.mlf import load_mlf\n"
    "saved = np.load(sys.argv[3])\n"
    "inputs = [saved[f'arr_{i}'] for i in range(len(saved.files))]\n"
    "if sys.argv[1] == 'library':\n"
    "    device = tvm.cuda(0)\n"
    "    out = load_vm(sys.argv[2], device)['main'](*[tvm.runtime.tensor(x, device) for x in inputs])\n"
    "    outputs = [(out if hasattr(out, 'numpy') else out[0]).numpy()]\n"
    "else:\n"
    "    outputs = load_mlf(sys.argv[2]).run(*inputs)\n"
    "np.save(sys.argv[4], outputs[0])\n"
)


def run_alone(kind, path, inputs, tmp_path, env):
    np.savez(tmp_path / "inputs.npz", *inputs)
    result = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY_CHECK + RUN_ALONE, kind, str(path), str(tmp_path / "inputs.npz"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(tmp_path / "out.npy")


def test_the_library_holds_compiled_device_code_and_runs_with_tvm_runtime_alone(optimized, tmp_path, runtime_only_env):
    """No TVM compiler, no C++ compiler, no plugins: cubins inside, the vendor kernels carried beside it."""
    name, result = optimized
    data = Path(result.library_path).read_bytes()
    assert b"__global__" not in data and any(fmt in data for fmt in COMPILED_FORMATS)
    carried = json.loads(runtime_file(result.library_path).read_text())["backends"]
    assert all("carried" in needs for needs in carried.values()), carried
    inputs = result.model.random_inputs(seed=7)
    alone = run_alone("library", result.library_path, inputs, tmp_path, runtime_only_env)
    np.testing.assert_allclose(alone, result.run(*inputs)[0], rtol=1e-5, atol=1e-5, equal_nan=False)


def test_a_model_library_format_tar_runs_with_tvm_runtime_alone(optimized, tmp_path, runtime_only_env):
    """As above, with the host objects linked on loading (a linker, not TVM's compiler)."""
    name, result = optimized
    tar = export_mlf(result, tmp_path / f"{name}.tar")
    inputs = result.model.random_inputs(seed=8)
    alone = run_alone("mlf", tar, inputs, tmp_path, {**runtime_only_env, "CXX": "g++"})
    np.testing.assert_allclose(alone, result.run(*inputs)[0], rtol=1e-5, atol=1e-5, equal_nan=False)


def optimized_at(workspace, name: str, precision: str, layout: str = "model"):
    """``name`` placed over BACKENDS at ``precision`` (convolutions in ``layout``) on the GPU (no baselines), its costs
    kept in ``workspace``."""
    return collage_core.optimize(
        str(MODELS / f"{name}.onnx"),
        target="cuda",
        backends=BACKENDS,
        cost_db=workspace / "costs.sqlite",
        output_dir=workspace / f"{name}-{precision}-{layout}",
        show_progress=False,
        compare_backends=False,
        precision=precision,
        layout=layout,
    )


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name, vendor", [("tiny_bert", "cublas"), ("tiny_resnet", "cudnn")])
def test_a_sixteen_bit_placement_puts_products_on_the_vendor_library_and_passes_its_tolerance(workspace, name, vendor, precision):
    result = optimized_at(workspace, name, precision)
    assert result.placement.precision == precision and result.verification.passed, result.verification.describe()
    held_to = tolerance(precision)
    assert (result.verification.rtol, result.verification.atol) == (held_to.rtol, held_to.atol)
    considered = [c for c in result.placement.considered if c.backend == vendor]
    assert any(c.cost.is_measured for c in considered)  # the vendor's 16-bit kernels were built and timed
    inputs = result.model.random_inputs(seed=7)
    got, expected = result.run(*inputs)[0], result.model.reference(inputs)[0]
    assert np.abs(got - expected).max() <= held_to.atol + held_to.rtol * np.abs(expected).max()


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_gpt2"])
def test_at_bf16_attention_is_measured_as_one_cudnn_kernel_and_the_placement_passes_its_tolerance(workspace, name):
    """Each attention of the model is a cudnn.attention candidate that was built and timed on the GPU; whichever the
    search keeps, the placement's outputs are within bf16's tolerance of ONNX Runtime's."""
    result = optimized_at(workspace, name, "bf16")
    assert result.verification.passed, result.verification.describe()
    fused = [c for c in result.placement.considered if c.pattern == "cudnn.attention"]
    assert fused and all(c.cost.is_measured for c in fused), [(c.pattern, c.cost) for c in fused]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_in_nhwc_cudnn_runs_16_bit_convolutions_with_their_bias_and_relu_and_the_placement_passes_its_tolerance(workspace, precision):
    """With --layout nhwc every convolution of tiny ResNet is channel-last; cuDNN's fused candidates (the convolution
    with its cast, bias and ReLU, and with a residual add) were built and timed on the GPU, and the placement's
    outputs are within the precision's tolerance of ONNX Runtime's on the NCHW file."""
    result = optimized_at(workspace, "tiny_resnet", precision, layout="nhwc")
    assert result.placement.layout == "nhwc" and result.verification.passed, result.verification.describe()
    fused = [c for c in result.placement.considered if c.pattern.startswith("cudnn.conv2d_nhwc_cast_bias")]
    assert fused and all(c.cost.is_measured for c in fused), [(c.pattern, c.cost) for c in fused]
    held_to = tolerance(precision)
    inputs = result.model.random_inputs(seed=7)
    got, expected = result.run(*inputs)[0], result.model.reference(inputs)[0]
    assert np.abs(got - expected).max() <= held_to.atol + held_to.rtol * np.abs(expected).max()
