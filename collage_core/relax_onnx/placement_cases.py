"""Small placements that mix a graph-level backend with TVM, and their numpy references.

A backend's tests place part of :func:`conv_bias_relu_scale` or :func:`attention` on it
(:func:`place`), build the module the way Collage does and compare with :func:`numpy_conv_bias_relu_scale`
or :func:`numpy_attention`: float32 within RTOL/ATOL (sums of up to 32 products of values near 1,
and normalizations over 32 values).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build.executable import build, partitions_by_backend
from collage_core.build.partition import partition_module
from collage_core.model import original_model
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.relax_onnx.lowering import unpack_blob

R = relax.op
F = "float32"
RTOL, ATOL = 1e-5, 1e-5
DEVICE = tvm.cpu(0)
RNG = np.random.default_rng(0)

CONV_WEIGHT = RNG.uniform(-1, 1, size=(8, 3, 3, 3)).astype(F)
CONV_BIAS = RNG.uniform(-1, 1, size=(1, 8, 1, 1)).astype(F)
HIDDEN, HEADS, TOKENS = 32, 4, 8
PROJECTION = RNG.uniform(-0.3, 0.3, size=(HIDDEN, HIDDEN)).astype(F)
PROJECTION_BIAS = RNG.uniform(-1, 1, size=(HIDDEN,)).astype(F)
GAMMA = RNG.uniform(0.5, 1.5, size=(HIDDEN,)).astype(F)
BETA = RNG.uniform(-0.5, 0.5, size=(HIDDEN,)).astype(F)


def module(make, *specs) -> tvm.IRModule:
    """A module whose ``main`` over parameters of ``specs`` returns ``make(bb, *params)``."""
    params = [relax.Var(f"x{i}", relax.TensorType(shape, dtype)) for i, (shape, dtype) in enumerate(specs)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    return bb.get()


def conv_bias_relu_scale(bb, x):
    """relu(conv2d(x, W) + b) * 0.5: the tests place the first three on a graph-level backend, the last on TVM."""
    conv = bb.emit(R.nn.conv2d(x, relax.const(CONV_WEIGHT), padding=1))
    biased = bb.emit(R.add(conv, relax.const(CONV_BIAS)))
    rectified = bb.emit(R.nn.relu(biased))
    return R.multiply(rectified, relax.const(0.5, F))


def attention(bb, x):
    """Self-attention without value projection: the operators of a transformer layer."""
    projected = bb.emit(R.add(R.matmul(x, relax.const(PROJECTION)), relax.const(PROJECTION_BIAS)))
    normalized = bb.emit(R.nn.layer_norm(projected, relax.const(GAMMA), relax.const(BETA), axes=[-1]))
    heads = bb.emit(R.reshape(normalized, (1, TOKENS, HEADS, HIDDEN // HEADS)))
    queries = bb.emit(R.permute_dims(heads, [0, 2, 1, 3]))
    keys = bb.emit(R.permute_dims(heads, [0, 2, 3, 1]))
    scores = bb.emit(R.multiply(R.matmul(queries, keys), relax.const(0.25, F)))
    weights = bb.emit(R.nn.softmax(scores, axis=-1))
    context = bb.emit(R.matmul(weights, queries))
    merged = bb.emit(R.permute_dims(context, [0, 2, 1, 3]))
    return R.add(R.reshape(merged, (1, TOKENS, HIDDEN)), normalized)


def numpy_conv_bias_relu_scale(x):
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    conv = np.einsum("nchwij,ocij->nohw", windows, CONV_WEIGHT)
    return np.maximum(conv + CONV_BIAS, 0) * 0.5


def numpy_attention(x):
    projected = x @ PROJECTION + PROJECTION_BIAS
    mean, var = projected.mean(-1, keepdims=True), projected.var(-1, keepdims=True)
    normalized = (projected - mean) / np.sqrt(var + 1e-5) * GAMMA + BETA
    heads = normalized.reshape(1, TOKENS, HEADS, HIDDEN // HEADS)
    queries, keys = heads.transpose(0, 2, 1, 3), heads.transpose(0, 2, 3, 1)
    scores = queries @ keys * 0.25
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = (weights @ queries).transpose(0, 2, 1, 3)
    return context.reshape(1, TOKENS, HIDDEN) + normalized


def place(mod, backend: str, region_nodes):
    """``region_nodes`` as one partition on the graph-level ``backend``, every other operator on TVM alone."""
    graph = RelaxGraph.from_function(mod["main"])
    parts = [SimpleNamespace(backend=backend, pattern=f"{backend}.region", nodes=frozenset(region_nodes))]
    parts += [
        SimpleNamespace(backend="tvm", pattern="tvm.op", nodes=frozenset({node}))
        for node in range(len(graph.graph))
        if node not in region_nodes
    ]
    return graph, partition_module(graph, parts)


def run_vm(executable, *arrays):
    """``main``'s result on this CPU, as numpy."""
    vm = relax.VirtualMachine(executable, DEVICE)
    return tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(a, DEVICE) for a in arrays]))


CONV_INPUT = ((1, 3, 8, 8), F)


def check_mixed_placements(pm, backends, backend: str, target) -> None:
    """conv-bias-ReLU on ``backend`` beside TVM's scale, and attention up to its softmax on ``backend``
    returning two results (the layer norm's output is read after it), each against numpy."""
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), backend, {0, 1, 2})
    assert {b: len(names) for b, names in partitions_by_backend(placed).items()} == {backend: 1, "tvm": 1}
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    np.testing.assert_allclose(run_vm(build(pm, placed, backends, target), x), numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)

    mod = module(attention, ((1, TOKENS, HIDDEN), F))
    ops = RelaxGraph.from_function(mod["main"]).graph.ops
    _, placed = place(mod, backend, set(range(ops.index("relax.nn.softmax") + 1)))
    (name,) = partitions_by_backend(placed)[backend]
    assert isinstance(tvm_compat.return_type(placed[name]), relax.TupleType)
    x = RNG.uniform(-1, 1, size=(1, TOKENS, HIDDEN)).astype(F)
    np.testing.assert_allclose(run_vm(build(pm, placed, backends, target), x), numpy_attention(x), rtol=RTOL, atol=ATOL)


def check_exported_library_runs_in_a_fresh_process(pm, backends, backend: str, target, tmp_path) -> None:
    """conv-bias-ReLU on ``backend`` exported as a library, loaded and run in a new Python process
    that imports only TVM and ``collage_<backend>``, against numpy."""
    _, placed = place(module(conv_bias_relu_scale, CONV_INPUT), backend, {0, 1, 2})
    library = tmp_path / "placed.so"
    build(pm, placed, backends, target).export_library(str(library))
    x = RNG.uniform(-1, 1, size=CONV_INPUT[0]).astype(F)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, numpy as np, tvm\n"
        "from tvm import relax\n"
        f"import collage_{backend}\n"
        "vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())\n"
        "np.save(sys.argv[3], vm['main'](tvm.runtime.tensor(np.load(sys.argv[2]))).numpy())\n"
    )
    out = tmp_path / "out.npy"
    done = subprocess.run(
        [sys.executable, "-c", script, str(library), str(tmp_path / "x.npy"), str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(np.load(out), numpy_conv_bias_relu_scale(x), rtol=RTOL, atol=ATOL)


def check_original_file_runs_whole(pm, backends, backend: str, path, target, rtol: float, atol: float) -> None:
    """``collage_lower_whole_model``: the library whose one partition is ``backend``'s own session over the ONNX
    file at ``path`` carries the file's bytes, not Collage's conversion of it, and computes what the model's
    reference (ONNX Runtime) does within ``rtol``/``atol``."""
    model = load_model(Path(path))
    mod = original_model.lowered_module(pm, model, backends[backend], target)
    (session,) = [func for func in mod.functions.values() if original_model.is_lowered_already(func)]
    blob = next(arg for binding in session.body.blocks[0].bindings for arg in binding.value.args[1].fields if tvm_compat.is_constant(arg))
    assert unpack_blob(tvm_compat.constant_array(blob))[0] == Path(path).read_bytes()
    inputs = model.random_inputs(seed=4)
    device = tvm_compat.device_for(target)
    vm = relax.VirtualMachine(build(pm, mod, backends, target), device)
    result = vm["main"](*[tvm_compat.to_tensor(a, device) for a in inputs])
    np.testing.assert_allclose(tvm_compat.to_numpy(result), model.reference(inputs)[0], rtol=rtol, atol=atol)


def check_runs_in_place(run, relu_blob, bindings_kept: int) -> None:
    """``run(blob, *tensors)`` of a lowered ReLU reads its input and writes its output where the VM's
    tensors are, sees new contents at the same addresses, keeps each of more address sets than it
    keeps bindings apart, and refuses the wrong number of tensors."""
    # Deferred: pytest is only there under a test run.
    import pytest

    x = tvm_compat.to_tensor(np.full((2, 3), -1.0, F), DEVICE)
    out = tvm_compat.to_tensor(np.full((2, 3), 7.0, F), DEVICE)
    run(relu_blob, x, out)
    np.testing.assert_array_equal(tvm_compat.to_numpy(out), np.zeros((2, 3), F))
    # Same addresses, new contents: what is bound must see them, not a copy taken when bound.
    x.copyfrom(np.arange(6, dtype=F).reshape(2, 3))
    run(relu_blob, x, out)
    np.testing.assert_array_equal(tvm_compat.to_numpy(out), np.arange(6, dtype=F).reshape(2, 3))
    pairs = [
        (tvm_compat.to_tensor(np.full((2, 3), float(v), F), DEVICE), tvm_compat.to_tensor(np.zeros((2, 3), F), DEVICE))
        for v in range(bindings_kept + 2)
    ]
    for _ in range(2):
        for value, (source, target) in enumerate(pairs):
            run(relu_blob, source, target)
            np.testing.assert_array_equal(tvm_compat.to_numpy(target), np.full((2, 3), float(value), F))
    with pytest.raises(ValueError, match="takes 1 inputs and gives 1 outputs, but 1 tensors"):
        run(relu_blob, x)
