"""Each DNNL pattern, matched, lowered to oneDNN, built into a TVM executable and compared with numpy.

Every case is a whole Relax function that one DNNL pattern must cover: the test finds the
candidate of that pattern over all operators, places it, builds it the way Collage builds
placements, runs it on Relax's VM and compares with a numpy reference within float32 rounding
(RTOL, ATOL: sums of at most a few hundred products of values of order 1).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from collage_dnnl import patterns, specs
from tvm import relax

from collage_core.kit import RelaxGraph, enumerate_candidates, tvm_compat
from collage_core.kit.testing import build, partition_module, rounded_to

R = relax.op
F = "float32"
RTOL, ATOL = 1e-4, 1e-4
TARGET = tvm_compat.host_cpu_target()
DEVICE = tvm.cpu(0)
RNG = np.random.default_rng(0)


def uniform(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, size=shape).astype(F)


def module(make, *shapes, dtype=F) -> tvm.IRModule:
    params = [relax.Var(f"x{i}", relax.TensorType(shape, dtype)) for i, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    return bb.get()


def dnnl_candidates(mod):
    graph = RelaxGraph.from_function(mod["main"])
    return graph, enumerate_candidates(graph, patterns.patterns())


def whole_candidate(mod, pattern_name):
    """The DNNL candidate of ``pattern_name`` covering every operator of ``main``, or None."""
    graph, candidates = dnnl_candidates(mod)
    everything = frozenset(range(len(graph.graph)))
    matching = [c for c in candidates if c.pattern == f"dnnl.{pattern_name}" and frozenset(c.nodes) == everything]
    return graph, (matching[0] if matching else None)


def run_on_dnnl(pm, backends, mod, pattern_name, *arrays):
    graph, candidate = whole_candidate(mod, pattern_name)
    assert candidate is not None, f"dnnl.{pattern_name} does not cover the function"
    placed = partition_module(graph, [SimpleNamespace(backend="dnnl", pattern=candidate.pattern, nodes=candidate.nodes)])
    executable = build(pm, placed, backends, TARGET)
    assert "collage_dnnl.run" in placed_calls(executable, placed, backends, pm)
    vm = relax.VirtualMachine(executable, DEVICE)
    return tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(a, DEVICE) for a in arrays]))


def placed_calls(executable, placed, backends, pm) -> str:
    from collage_core.kit.testing import lower_partitions

    return lower_partitions(pm, placed, backends, TARGET).script()


# numpy references ---------------------------------------------------------------------------


def np_conv2d(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    top, left, bottom, right = padding
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[
                    :,
                    :,
                    i * dilation[0] : i * dilation[0] + stride[0] * (oh - 1) + 1 : stride[0],
                    j * dilation[1] : j * dilation[1] + stride[1] * (ow - 1) + 1 : stride[1],
                ]
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, i, j])
    return out


def np_gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def np_pool(x, kind, kernel, stride, padding, count_include_pad=False):
    top, left, bottom, right = padding
    fill = -np.inf if kind == "max" else 0.0
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=(2, 3))[:, :, :: stride[0], :: stride[1]]
    counts = np.lib.stride_tricks.sliding_window_view(ones, kernel, axis=(2, 3))[:, :, :: stride[0], :: stride[1]]
    if kind == "max":
        return windows.max(axis=(-2, -1))
    total = windows.sum(axis=(-2, -1))
    return total / (kernel[0] * kernel[1] if count_include_pad else counts.sum(axis=(-2, -1)))


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_layer_norm(x, gamma, beta, eps=1e-5):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


# cases --------------------------------------------------------------------------------------

W8 = uniform(8, 4, 3, 3)
W_DEPTHWISE = uniform(8, 1, 3, 3)
W_GROUPED = uniform(8, 2, 3, 3)
BIAS8 = uniform(1, 8, 1, 1)
W_DENSE = uniform(32, 16, low=-0.3, high=0.3)
BIAS16 = uniform(16)
GAMMA, BETA = uniform(32, low=0.5, high=1.5), uniform(32)


def conv_case(name, w, conv_kwargs, np_kwargs, bias=False, residual=False, relu=False, in_channels=4):
    def make(bb, x, *rest):
        y = bb.emit(R.nn.conv2d(x, relax.const(w), **conv_kwargs))
        if bias:
            y = bb.emit(R.add(y, relax.const(BIAS8)))
        if residual:
            y = bb.emit(R.add(rest[0], y))
        return R.nn.relu(y) if relu else y

    def reference(x, *rest):
        y = np_conv2d(x, w, **np_kwargs)
        y = y + BIAS8 if bias else y
        y = y + rest[0] if residual else y
        return np.maximum(y, 0) if relu else y

    out_shape = np_conv2d(np.zeros((1, in_channels, 9, 9), F), w, **np_kwargs).shape
    shapes = [(1, in_channels, 9, 9)] + ([out_shape] if residual else [])
    return pytest.param(name, make, reference, shapes, id=name)


def dense_case(name, bias=False, activation=None, residual=False, transposed_input=False):
    def make(bb, x, *rest):
        lhs = bb.emit(R.permute_dims(x, [0, 2, 1])) if transposed_input else x
        y = bb.emit(R.matmul(lhs, relax.const(W_DENSE)))
        if bias:
            y = bb.emit(R.add(relax.const(BIAS16), y))
        if residual:
            y = bb.emit(R.add(y, rest[0]))
        if activation == "relu":
            return R.nn.relu(y)
        if activation == "gelu":
            return R.nn.gelu(y)
        if activation == "gelu_erf":
            d = bb.emit(R.divide(y, relax.const(math.sqrt(2), F)))
            e = bb.emit(R.add(bb.emit(R.erf(d)), relax.const(1.0, F)))
            return R.multiply(bb.emit(R.multiply(y, e)), relax.const(0.5, F))
        return y

    def reference(x, *rest):
        y = (x.transpose(0, 2, 1) if transposed_input else x) @ W_DENSE
        y = y + BIAS16 if bias else y
        y = y + rest[0] if residual else y
        if activation == "relu":
            return np.maximum(y, 0)
        return np_gelu(y) if activation in ("gelu", "gelu_erf") else y

    shapes = [(2, 32, 6) if transposed_input else (2, 6, 32)] + ([(2, 6, 16)] if residual else [])
    return pytest.param(name, make, reference, shapes, id=f"{name}-{activation}-{'residual' if residual else ''}")


def batch_case(name, lhs_axes=None, rhs_axes=None, scale=None):
    def make(bb, a, b):
        lhs = bb.emit(R.permute_dims(a, lhs_axes)) if lhs_axes else a
        rhs = bb.emit(R.permute_dims(b, rhs_axes)) if rhs_axes else b
        y = bb.emit(R.matmul(lhs, rhs))
        return R.multiply(y, relax.const(scale, F)) if scale else y

    def reference(a, b):
        y = (a.transpose(lhs_axes) if lhs_axes else a) @ (b.transpose(rhs_axes) if rhs_axes else b)
        return y * scale if scale else y

    shapes = [(1, 3, 8, 5) if lhs_axes else (1, 3, 5, 8), (1, 7, 3, 8) if rhs_axes else (1, 3, 8, 7)]
    return pytest.param(name, make, reference, shapes, id=f"{name}-{scale}")


def single(name, op, reference, shapes):
    return pytest.param(name, lambda bb, *xs: op(*xs), reference, shapes, id=name)


CASES = [
    conv_case("conv2d", W8, dict(padding=1), dict(padding=(1, 1, 1, 1))),
    conv_case("conv2d_relu", W8, dict(strides=2), dict(stride=(2, 2)), relu=True),
    conv_case("conv2d_bias", W8, dict(padding=(0, 1, 2, 1), dilation=2), dict(padding=(0, 1, 2, 1), dilation=(2, 2)), bias=True),
    conv_case(
        "conv2d_bias_relu",
        W_DEPTHWISE,
        dict(padding=1, groups=8),
        dict(padding=(1, 1, 1, 1), groups=8),
        bias=True,
        relu=True,
        in_channels=8,
    ),
    conv_case(
        "conv2d_bias_add",
        W_GROUPED,
        dict(padding=1, groups=4),
        dict(padding=(1, 1, 1, 1), groups=4),
        bias=True,
        residual=True,
        in_channels=8,
    ),
    conv_case(
        "conv2d_bias_add_relu",
        W8,
        dict(padding=1, strides=2),
        dict(padding=(1, 1, 1, 1), stride=(2, 2)),
        bias=True,
        residual=True,
        relu=True,
    ),
    dense_case("dense"),
    dense_case("dense_relu", activation="relu"),
    dense_case("dense_gelu", activation="gelu"),
    dense_case("dense_bias", bias=True),
    dense_case("dense_bias_relu", bias=True, activation="relu"),
    dense_case("dense_bias_gelu", bias=True, activation="gelu_erf"),
    dense_case("dense_bias_gelu", bias=True, activation="gelu"),
    dense_case("dense_bias_add", bias=True, residual=True),
    dense_case("dense_t_bias", bias=True, transposed_input=True),
    batch_case("batch_matmul"),
    batch_case("batch_matmul_scale", scale=0.125),
    batch_case("batch_matmul_nt_scale", rhs_axes=[0, 2, 3, 1], scale=0.5),
    batch_case("batch_matmul_tt", lhs_axes=[0, 1, 3, 2], rhs_axes=[0, 2, 3, 1]),
    single(
        "max_pool2d",
        lambda x: R.nn.max_pool2d(x, (3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
        lambda x: np_pool(x, "max", (3, 3), (2, 2), (1, 1, 1, 1)),
        [(1, 4, 9, 9)],
    ),
    single(
        "avg_pool2d",
        lambda x: R.nn.avg_pool2d(x, (3, 3), strides=(1, 1), padding=(1, 1, 1, 1), count_include_pad=False),
        lambda x: np_pool(x, "avg", (3, 3), (1, 1), (1, 1, 1, 1)),
        [(1, 4, 9, 9)],
    ),
    single(
        "avg_pool2d",
        lambda x: R.nn.avg_pool2d(x, (2, 2), strides=(2, 2), padding=(1, 0, 1, 0), count_include_pad=True),
        lambda x: np_pool(x, "avg", (2, 2), (2, 2), (1, 0, 1, 0), count_include_pad=True),
        [(1, 4, 8, 8)],
    ),
    single("softmax", lambda x: R.nn.softmax(x, axis=-1), lambda x: np_softmax(x, -1), [(2, 3, 16)]),
    single("softmax", lambda x: R.nn.softmax(x, axis=1), lambda x: np_softmax(x, 1), [(2, 3, 16)]),
    single(
        "layer_norm",
        lambda x: R.nn.layer_norm(x, relax.const(GAMMA), relax.const(BETA), axes=[-1]),
        lambda x: np_layer_norm(x, GAMMA, BETA),
        [(2, 5, 32)],
    ),
]


@pytest.mark.parametrize("pattern_name, make, reference, shapes", CASES)
def test_pattern_matches_numpy(pm, backends, pattern_name, make, reference, shapes):
    mod = module(make, *shapes)
    arrays = [uniform(*shape) for shape in shapes]
    actual = run_on_dnnl(pm, backends, mod, pattern_name, *arrays)
    expected = reference(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_every_pattern_has_a_numerics_case():
    tested = {param.values[0] for param in CASES}
    offered = {pattern.name.split(".", 1)[1] for pattern in patterns.patterns()}
    # Transposed forms of the dense and batch patterns share the plain forms' kernels and checks.
    untested = {name for name in offered - tested if not name.startswith(("dense_t", "batch_matmul_t", "batch_matmul_nt"))}
    assert not untested


# bfloat16 operands, as TVM's mixed-precision pass writes them (collage optimize --precision bf16) ---------------

BF16 = "bfloat16"
FAST_BF16 = specs.BFLOAT16 in specs.operand_dtypes()
# Both sides see the same bfloat16-rounded operands and accumulate in float32 or better: what remains is
# the accumulation order and oneDNN's conversion of the result.
BF16_RTOL, BF16_ATOL = 1e-3, 1e-3


def bf16(array):
    return rounded_to(array, "bfloat16")


def mixed(make_f32):
    """``make_f32`` with its float32 tensor operands cast to bfloat16 first and out_dtype float32, as the pass writes it."""

    def make(bb, *params):
        cast = [bb.emit(R.astype(p, BF16)) for p in params]
        return make_f32(*cast)

    return make


BF16_CASES = [
    ("dense", lambda x: R.matmul(x, relax.const(bf16(W_DENSE)), out_dtype=F), lambda x: x @ bf16(W_DENSE).astype(np.float64), [(3, 32)]),
    ("batch_matmul", lambda a, b: R.matmul(a, b, out_dtype=F), lambda a, b: a @ b, [(2, 5, 16), (2, 16, 7)]),
    (
        "conv2d",
        lambda x: R.nn.conv2d(x, relax.const(bf16(W8)), padding=(1, 1), out_dtype=F),
        lambda x: np_conv2d(x, bf16(W8).astype(np.float64), padding=(1, 1, 1, 1)),
        [(1, 4, 8, 8)],
    ),
]


@pytest.mark.skipif(not FAST_BF16, reason="this CPU has no fast bfloat16 (AMX or AVX512-BF16): DNNL refuses bfloat16 here")
@pytest.mark.parametrize("pattern_name, make, reference, shapes", BF16_CASES, ids=[case[0] for case in BF16_CASES])
def test_bfloat16_operands_accumulate_in_float32_like_numpy(pm, backends, pattern_name, make, reference, shapes):
    params = [relax.Var(f"x{i}", relax.TensorType(shape, BF16)) for i, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(*params))
        bb.emit_func_output(output)
    arrays = [bf16(uniform(*shape)) for shape in shapes]
    actual = run_on_dnnl(pm, backends, bb.get(), pattern_name, *arrays)
    assert actual.dtype == np.float32
    expected = reference(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(actual, expected, rtol=BF16_RTOL, atol=BF16_ATOL)


@pytest.mark.skipif(not FAST_BF16, reason="this CPU has no fast bfloat16 (AMX or AVX512-BF16)")
def test_bfloat16_matmuls_run_on_onednn_bfloat16_kernels():
    import tvm as tvm_
    from collage_dnnl import library

    library.load()
    words = (
        specs.MATMUL,
        specs.OPERAND_TYPES[BF16],
        2,
        64,
        256,
        256,
        1,
        256,
        128,
        128,
        1,
        64,
        128,
        0,
        specs.float_word(1.0),
        specs.NO_ELTWISE,
        0,
    )
    spec = tvm_compat.to_tensor(np.array((specs.SPEC_VERSION, *words), dtype=np.int64), DEVICE)
    implementation = str(tvm_.get_global_func("collage_dnnl.implementation")(spec))
    assert "bf16" in implementation or "amx" in implementation, implementation


def test_bfloat16_operands_with_a_bfloat16_result_are_refused(monkeypatch):
    from collage_core.kit import Group, Refused

    monkeypatch.setattr(specs, "operand_dtypes", lambda: (specs.FLOAT32, BF16))
    x = relax.Var("x", relax.TensorType((3, 32), BF16))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(R.matmul(x, relax.const(bf16(W_DENSE))))
        bb.emit_func_output(output)
    with pytest.raises(Refused, match="only with out_dtype float32"):
        specs.recognize(Group.from_function(bb.get()["main"]))


def test_bfloat16_is_refused_where_the_cpu_has_no_fast_bfloat16(monkeypatch):
    from collage_core.kit.testing import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})
    assert specs.operand_dtypes() == (specs.FLOAT32,)
    mod = module(mixed(lambda x: R.matmul(x, relax.const(bf16(W_DENSE)), out_dtype=F)), (3, 32))
    _, candidates = dnnl_candidates(mod)
    assert not any(c.pattern == "dnnl.dense" for c in candidates)
