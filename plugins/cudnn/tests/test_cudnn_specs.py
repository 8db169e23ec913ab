"""Each cuDNN candidate's spec, read back as cuDNN's graph would compute it, against TVM's own build (no GPU needed).

``emulate`` builds the operation graph a spec describes (tensors read through the spec's dims
and strides, a cross-correlation or a batched product, then bias, residual and activation as
cuDNN's pointwise modes define them) with PyTorch on the CPU in float64; the spec a candidate's
group lowers to must compute what TVM computes for the same Relax, within float32 rounding of
sums of at most a few hundred products (RTOL, ATOL). The GPU tests (test_cudnn_kernels.py)
then check the real kernels against PyTorch on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.candidates import enumerate_candidates
from collage_core.fused_groups import Group, Refused
from collage_core.model_import import load_model
from collage_core.relax_graph import RelaxGraph
from collage_cudnn import patterns, specs

R = relax.op
F = "float32"
RTOL, ATOL = 1e-4, 1e-4
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)


class _Words:
    def __init__(self, words):
        self.words, self.at = [int(w) for w in words], 0

    def take(self, count=1):
        values = self.words[self.at : self.at + count]
        self.at += count
        return values if count > 1 else values[0]


def _view(flat: np.ndarray, dims, strides) -> torch.Tensor:
    return torch.as_strided(torch.from_numpy(flat.astype(np.float64)), dims, strides)


def emulate(words, operands: list[np.ndarray]) -> np.ndarray:
    """What the cuDNN graph of a spec (without plan words) computes on flat operands."""
    w = _Words(words)
    assert w.take() == specs.SPEC_VERSION
    kind, rank = w.take(), w.take()
    x_dims, x_strides, w_dims, w_strides, y_dims = (w.take(rank) for _ in range(5))
    x = _view(operands[0].ravel(), x_dims, x_strides)
    weights = _view(operands[1].ravel(), w_dims, w_strides)
    if kind == specs.CONV2D:
        top, left, bottom, right = w.take(4)
        stride, dilation = w.take(2), w.take(2)
        padded = torch.nn.functional.pad(x, (left, right, top, bottom))
        y = torch.nn.functional.conv2d(padded, weights, stride=stride, dilation=dilation, groups=x_dims[1] // w_dims[1])
        channel_shape = [1, y_dims[1], 1, 1]
    else:
        y = torch.matmul(x, weights)
        channel_shape = [1] * (rank - 1) + [y_dims[-1]]
    assert list(y.shape) == list(y_dims)
    has_bias, has_residual, activation = w.take(), w.take(), w.take()
    assert w.at == len(w.words)
    at = 2
    if has_bias:
        y = y + torch.from_numpy(operands[at].astype(np.float64)).reshape(channel_shape)
        at += 1
    if has_residual:
        y = y + torch.from_numpy(operands[at].astype(np.float64)).reshape(y_dims)
    functions = {
        0: lambda t: t,
        1: torch.relu,
        2: lambda t: torch.nn.functional.gelu(t),
        3: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        4: torch.nn.functional.silu,
    }
    return functions[activation](y).numpy()


def _run_tvm(mod: tvm.IRModule, inputs):
    executable = relax.build(mod, tvm_compat.host_cpu_target())
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    return tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu(0)) for x in inputs]))


def check_candidate(graph: RelaxGraph, nodes) -> specs.KernelSpec:
    """The candidate's spec, emulated, equals TVM's CPU build of the same operators."""
    standalone = graph.standalone_module(nodes)
    func = standalone["main"]
    spec = specs.recognize(Group.from_function(func))
    inputs = [RNG.uniform(-1, 1, size=tvm_compat.tensor_shape_dtype(p)[0]).astype(F) for p in func.params]
    by_param = dict(zip(func.params, inputs))
    operands = [by_param[o] if o in by_param else tvm_compat.constant_array(o) for o in spec.operands]
    expected = _run_tvm(standalone, inputs)
    got = emulate(spec.words, operands).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    return spec


def module(make, *shapes) -> tvm.IRModule:
    params = [relax.Var(f"x{i}", relax.TensorType(shape, F)) for i, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    return bb.get()


def const(*shape):
    return relax.const(RNG.uniform(-1, 1, size=shape).astype(F))


def _permuted(bb, x, axes):
    return bb.emit(R.permute_dims(x, axes))


def _gelu_erf_spelt_out(bb, x):
    erf = bb.emit(R.erf(bb.emit(R.divide(x, relax.const(np.float32(np.sqrt(2.0)))))))
    return R.multiply(bb.emit(R.multiply(x, bb.emit(R.add(erf, relax.const(1.0, F))))), relax.const(0.5, F))


CASES = {
    "conv2d": (lambda bb, x: R.nn.conv2d(x, const(8, 4, 3, 3), padding=(1, 1)), [(1, 4, 9, 9)]),
    "conv2d_act": (lambda bb, x: R.nn.silu(R.nn.conv2d(x, const(8, 4, 3, 3), strides=(2, 2), padding=(1, 0, 2, 1))), [(2, 4, 9, 8)]),
    "conv2d_bias_act": (lambda bb, x: R.nn.relu(R.add(R.nn.conv2d(x, const(6, 2, 1, 1), groups=2), const(1, 6, 1, 1))), [(1, 4, 5, 5)]),
    "conv2d_bias_add_act": (
        lambda bb, x, r: R.nn.gelu(R.add(R.add(R.nn.conv2d(x, const(4, 4, 3, 3), padding=(2, 2), dilation=(2, 2)), const(1, 4, 1, 1)), r)),
        [(1, 4, 7, 7), (1, 4, 7, 7)],
    ),
    "dense_bias_act": (lambda bb, x: _gelu_erf_spelt_out(bb, bb.emit(R.add(const(48), R.matmul(x, const(64, 48))))), [(2, 8, 64)]),
    "dense_t_bias_add": (
        lambda bb, x, r: R.add(R.add(R.matmul(_permuted(bb, x, [1, 0]), const(40, 24)), const(24)), r), [(40, 12), (12, 24)],
    ),
    "dense_act": (lambda bb, x: R.nn.gelu_tanh(R.matmul(x, const(32, 16))), [(8, 32)]),
    "batch_matmul_tt": (
        lambda bb, q, k: R.matmul(_permuted(bb, q, [0, 2, 1, 3]), _permuted(bb, k, [0, 2, 3, 1])), [(1, 16, 2, 32), (1, 16, 2, 32)],
    ),
    "batch_matmul_nt": (lambda bb, p, v: R.matmul(p, _permuted(bb, v, [0, 2, 1, 3])), [(1, 4, 16, 16), (1, 16, 4, 16)]),
    "batch_matmul": (lambda bb, a, b: R.matmul(a, b), [(3, 5, 7), (3, 7, 9)]),
}


def whole(mod, pattern_name):
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    found = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == f"cudnn.{pattern_name}" and frozenset(c.nodes) == everything]
    return graph, (found[0] if found else None)


@pytest.mark.parametrize("pattern_name", sorted(CASES))
def test_spec_computes_what_tvm_computes(pattern_name):
    make, shapes = CASES[pattern_name]
    graph, candidate = whole(module(make, *shapes), pattern_name)
    assert candidate is not None, f"no cudnn.{pattern_name} candidate covers the whole function"
    check_candidate(graph, candidate.nodes)


@pytest.mark.parametrize(
    "make, shapes, reason",
    [
        (lambda bb, x: R.nn.conv2d(x, const(8, 3, 3, 4), data_layout="NHWC", kernel_layout="OHWI"), [(1, 9, 9, 4)], "NHWC data"),
        (lambda bb, x, w: R.nn.conv2d(x, w), [(1, 4, 9, 9), (8, 4, 3, 3)], "weights computed at run time"),
        (lambda bb, x: R.add(R.nn.conv2d(x, const(8, 4, 3, 3)), const(8, 7, 7)), [(1, 4, 9, 9)], "a bias that is not per channel"),
        (lambda bb, a, b: R.matmul(a, b), [(2, 3, 5, 7), (3, 7, 9)], "batch dimensions that broadcast"),
        (lambda bb, x: R.nn.relu(R.nn.gelu(R.matmul(x, const(8, 8)))), [(4, 8)], "two activations"),
    ],
)
def test_checks_refuse_what_cudnn_would_compute_differently(make, shapes, reason):
    mod = module(make, *shapes)
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    covering = [c for c in enumerate_candidates(graph, patterns.patterns()) if frozenset(c.nodes) == everything]
    assert covering == [], f"{reason}: {[c.pattern for c in covering]}"


def test_a_group_with_an_unfused_operator_is_refused_with_its_name():
    mod = module(lambda bb, x: R.nn.softmax(R.matmul(x, const(8, 8))), (4, 8))
    with pytest.raises(Refused, match="softmax"):
        specs.recognize(Group.from_function(mod["main"]))


@pytest.mark.parametrize("model", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_every_convolution_and_matmul_of_a_shipped_model_has_a_candidate_that_computes_what_tvm_does(model):
    graph = RelaxGraph.from_function(load_model(str(MODELS / f"{model}.onnx")).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    anchors = {node for node in range(len(graph.graph)) if tvm_compat.op_name(graph.call(node)) in specs.ANCHORS}
    assert anchors and anchors <= {node for candidate in candidates for node in candidate.nodes}
    largest = {}
    for candidate in candidates:
        largest.setdefault(candidate.key, candidate)
    for candidate in largest.values():
        check_candidate(graph, candidate.nodes)
