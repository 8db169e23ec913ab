"""Each cuBLAS candidate's spec, read back as cuBLASLt would compute it, against TVM's own build (no GPU needed).

``emulate`` follows cuBLASLt's contract (column-major matrices read through leading dimensions
and batch strides, ``D = act(alpha * op(a) op(b) + beta * C + bias)``) in numpy; the spec a
candidate's group lowers to must compute what TVM computes for the same Relax on the CPU,
within float32 rounding of sums of at most a few hundred products (RTOL, ATOL). The GPU tests
(test_cublas_kernels.py) then check the real kernels against PyTorch.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.candidates import enumerate_candidates
from collage_core.fused_groups import Group, Refused
from collage_core.model_import import load_model
from collage_core.relax_graph import RelaxGraph
from collage_cublas import patterns, specs

R = relax.op
F = "float32"
RTOL, ATOL = 1e-4, 1e-4
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)


def _float(word: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(word)))[0]


def _matrix(flat: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """A column-major rows x cols matrix at ``offset`` with leading dimension ``ld``."""
    index = offset + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return flat[index]


def emulate(words, operands: list[np.ndarray], out_size: int) -> np.ndarray:
    """What cuBLASLt computes for a spec (without algorithm words) on flat float32 operands."""
    w = [int(x) for x in words]
    assert w[0] == specs.SPEC_VERSION
    m, n, k = w[1:4]
    a, b = w[4:10], w[10:16]
    ld_d, batch, outer, d_stride, d_outer = w[16:21]
    activation, has_bias, has_residual, alpha = w[21], w[22], w[23], _float(w[24])
    first, second = operands[0].ravel(), operands[1].ravel()
    bias = operands[2].ravel() if has_bias else None
    residual = operands[2 + has_bias].ravel() if has_residual else None
    out = np.full(out_size, np.nan, dtype=np.float64)
    for o in range(outer):
        for t in range(batch):
            op_a = _matrix(first, o * a[5] + t * a[4], a[1], a[2], a[3])
            op_b = _matrix(second, o * b[5] + t * b[4], b[1], b[2], b[3])
            op_a, op_b = (op_a.T if a[0] else op_a), (op_b.T if b[0] else op_b)
            assert op_a.shape == (m, k) and op_b.shape == (k, n)
            d = alpha * (op_a.astype(np.float64) @ op_b)
            index = o * d_outer + t * d_stride + np.arange(m)[:, None] + ld_d * np.arange(n)[None, :]
            if residual is not None:
                d = d + residual[index]
            if bias is not None:
                d = d + bias[:, None]
            if activation == specs.RELU:
                d = np.maximum(d, 0)
            elif activation == specs.GELU_TANH:
                d = 0.5 * d * (1 + np.tanh(math.sqrt(2 / math.pi) * (d + 0.044715 * d**3)))
            out[index] = d
    return out


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
    got = emulate(spec.words, operands, expected.size).reshape(expected.shape)
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


def whole(mod, pattern_name):
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    found = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == f"cublas.{pattern_name}" and frozenset(c.nodes) == everything]
    return graph, (found[0] if found else None)


def const(*shape):
    return relax.const(RNG.uniform(-1, 1, size=shape).astype(F))


def _permuted(bb, x, axes):
    return bb.emit(R.permute_dims(x, axes))


CASES = {
    "dense_bias": (lambda bb, x: R.add(R.matmul(x, const(64, 96)), const(96)), [(16, 64)]),
    "dense_bias_add_relu": (lambda bb, x, r: R.nn.relu(R.add(R.add(R.matmul(x, const(64, 48)), const(48)), r)), [(2, 8, 64), (2, 8, 48)]),
    "dense_t_bias": (lambda bb, x: R.add(const(24), R.matmul(_permuted(bb, x, [1, 0]), const(40, 24))), [(40, 12)]),
    "dense_gelu": (lambda bb, x: R.nn.gelu_tanh(R.matmul(x, const(32, 64))), [(8, 32)]),
    # Q.K^T with the heads of Q and K split in place (BERT at batch 1: one strided batch over the heads)
    "batch_matmul_tt_scale": (
        lambda bb, q, k: R.multiply(R.matmul(_permuted(bb, q, [0, 2, 1, 3]), _permuted(bb, k, [0, 2, 3, 1])), relax.const(0.125, F)),
        [(1, 16, 2, 32), (1, 16, 2, 32)],
    ),
    # the same at batch 8: the batch is looped, the heads are the strided batch
    "batch_matmul_tt": (
        lambda bb, q, k: R.matmul(_permuted(bb, q, [0, 2, 1, 3]), _permuted(bb, k, [0, 2, 3, 1])),
        [(8, 16, 2, 32), (8, 16, 2, 32)],
    ),
    # P.V with V's heads split in place
    "batch_matmul_nt": (lambda bb, p, v: R.matmul(p, _permuted(bb, v, [0, 2, 1, 3])), [(2, 4, 16, 16), (2, 16, 4, 16)]),
    "batch_matmul": (lambda bb, a, b: R.matmul(a, b), [(3, 5, 7), (3, 7, 9)]),
}


@pytest.mark.parametrize("pattern_name", sorted(CASES))
def test_spec_computes_what_tvm_computes(pattern_name):
    make, shapes = CASES[pattern_name]
    graph, candidate = whole(module(make, *shapes), pattern_name)
    assert candidate is not None, f"no cublas.{pattern_name} candidate covers the whole function"
    check_candidate(graph, candidate.nodes)


@pytest.mark.parametrize(
    "make, shapes, reason",
    [
        (lambda bb, x: R.nn.gelu(R.matmul(x, const(32, 64))), [(8, 32)], "erf GELU"),
        (lambda bb, x: R.add(R.multiply(R.matmul(x, const(32, 64)), relax.const(2.0, F)), const(64)), [(8, 32)], "bias after a scale"),
        (lambda bb, x: R.add(R.matmul(x, const(32, 64)), const(8, 64)), [(8, 32)], "a bias that is not per column"),
        (lambda bb, x: R.matmul(x, const(32, 64), out_dtype="float16"), [(8, 32)], "another output type"),
    ],
)
def test_checks_refuse_what_cublaslt_would_compute_differently(make, shapes, reason):
    mod = module(make, *shapes)
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    covering = [c for c in enumerate_candidates(graph, patterns.patterns()) if frozenset(c.nodes) == everything]
    assert covering == [], f"{reason}: {[c.pattern for c in covering]}"


def test_a_group_with_an_unfused_operator_is_refused_with_its_name():
    mod = module(lambda bb, x: R.nn.softmax(R.matmul(x, const(8, 8))), (4, 8))
    with pytest.raises(Refused, match="softmax"):
        specs.recognize(Group.from_function(mod["main"]))


@pytest.mark.parametrize("model", ["tiny_bert", "tiny_gpt2"])
def test_every_matmul_of_a_shipped_transformer_has_a_candidate_and_each_computes_what_tvm_does(model):
    graph = RelaxGraph.from_function(load_model(str(MODELS / f"{model}.onnx")).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    matmuls = {node for node in range(len(graph.graph)) if tvm_compat.op_name(graph.call(node)) == "relax.matmul"}
    covered = {node for candidate in candidates for node in candidate.nodes}
    assert matmuls <= covered
    names = {candidate.pattern for candidate in candidates}
    assert any(name.startswith("cublas.batch_matmul") for name in names)
    if model == "tiny_gpt2":
        assert "cublas.dense_bias_reshape_gelu" in names  # GPT-2's tanh GELU as exporters spell it, fused
    if model == "tiny_bert":
        assert "cublas.batch_matmul_tt_scale" in names  # Q.K^T with both head splits and the scale absorbed
    largest = {}
    for candidate in candidates:
        largest.setdefault(candidate.key, candidate)
    for candidate in largest.values():
        check_candidate(graph, candidate.nodes)
