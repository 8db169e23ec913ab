"""Small placements that mix a graph-level backend with TVM, and their numpy references.

A backend's tests place part of :func:`conv_bias_relu_scale` or :func:`attention` on it
(:func:`place`), build the module the way Collage does and compare with :func:`numpy_conv_bias_relu_scale`
or :func:`numpy_attention`: float32 within RTOL/ATOL (sums of up to 32 products of values near 1,
and normalizations over 32 values).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.partition import partition_module
from collage_core.relax_graph import RelaxGraph

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
