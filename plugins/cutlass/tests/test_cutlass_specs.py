"""Each CUTLASS candidate's spec, read back as the kernel would compute it, against TVM's own build (no GPU needed).

``cutlass_cases.reference`` follows the kernels' contract in PyTorch (float64 on the CPU here); the
spec a candidate's group lowers to must compute what TVM computes for the same Relax on the CPU, within
four units in the last place of the 16-bit output (TVM's build rounds after each step, the kernel once).
The GPU tests (test_cutlass_kernels.py) then check the real kernels against PyTorch on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from collage_cutlass import kernels, patterns, specs
from cutlass_cases import OUT_DTYPES, reference
from tvm import relax

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import (
    assert_matches,
    function_module,
    inputs_and_answer,
    operand_arrays,
    product_case,
    rounded_to,
    whole_candidate,
)

R = relax.op
F = "float32"
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)
PATTERN_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns() if ".conv2d" not in p.name)  # products
# Every pattern in the slow grid; these in the default suite: each operand form, each epilogue part, each activation.
QUICK = [
    ("dense_bias", "bfloat16"),
    ("dense_t_bias_add_gelu_erf", "bfloat16"),
    ("dense_bias_reshape_gelu", "float16"),
    ("dense_add_silu", "bfloat16"),
    ("dense_relu", "float16"),
    ("batch_matmul_tt_scale", "bfloat16"),
    ("batch_matmul", "float16"),
    ("batch_matmul_tn", "bfloat16"),
]


def _tvm_builds_on_the_cpu(pattern_name, dtype) -> bool:
    """TVM's CPU build has no bfloat16 power, which tanh GELU spelt out uses (the real pass keeps it in float32)."""
    return not (dtype == "bfloat16" and pattern_name.endswith("_gelu"))


def check_candidate(graph: RelaxGraph, nodes, tf32: bool = False) -> specs.KernelSpec:
    """The candidate's spec, read back as the kernel computes it (on exact operands: the TF32 rounding is the
    GPU tests'), equals TVM's CPU build of the same operators."""
    standalone = graph.standalone_module(nodes)
    func = standalone["main"]
    spec = specs.recognize(Group.from_function(func), tf32=tf32)
    inputs, expected = inputs_and_answer(standalone, RNG)
    got = reference(spec.words, operand_arrays(spec.operands, func.params, inputs), expected.size).reshape(expected.shape)
    assert_matches(got, expected, OUT_DTYPES[spec.words[2]])
    return spec


def whole(mod, pattern_name):
    return whole_candidate(mod, patterns.patterns(), f"cutlass.{pattern_name}")


def _covers_and_computes(pattern_name, dtype):
    make, shapes = product_case(pattern_name, cast_to=dtype)
    graph, candidate = whole(function_module(make, *shapes, dtype=dtype), pattern_name)
    assert candidate is not None, f"no cutlass.{pattern_name} candidate covers the whole function at {dtype}"
    spec = check_candidate(graph, candidate.nodes)
    assert spec.words[1:3] == (kernels.TYPE_CODES[dtype],) * 2  # 16-bit operands, and the cast taken: 16 bits out
    return spec


@pytest.mark.parametrize("pattern_name, dtype", QUICK)
def test_each_kind_of_pattern_covers_its_case_and_its_spec_computes_what_tvm_computes(pattern_name, dtype):
    _covers_and_computes(pattern_name, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern_name", PATTERN_NAMES)
def test_every_pattern_covers_its_case_and_its_spec_computes_what_tvm_computes(pattern_name, dtype):
    if not _tvm_builds_on_the_cpu(pattern_name, dtype):
        pytest.skip("TVM's CPU build has no bfloat16 power (tanh GELU spelt out)")
    _covers_and_computes(pattern_name, dtype)


def test_the_spec_names_the_operand_layouts_and_the_epilogue_the_kernel_is_compiled_for():
    spec = _covers_and_computes("dense_t_bias_add_gelu_erf", "float16")
    assert spec.kind == kernels.KernelKind(
        "float16", "float16", a_k_major=False, b_k_major=False, bias=True, residual=True, activation="gelu_erf"
    )
    assert len(spec.operands) == 4 and str(tvm_compat.constant_array(spec.operands[2]).dtype) == "float16"
    attention = _covers_and_computes("batch_matmul_tt_scale", "bfloat16")
    assert attention.kind.a_k_major and attention.kind.b_k_major and attention.kind.activation is None
    assert specs.float_word(0.125) == attention.words[22]


def _sixteen_bit(make, *shapes, dtype="bfloat16"):
    return function_module(make, *shapes, dtype=dtype)


def _cast(bb, product, dtype="bfloat16"):
    return bb.emit(R.astype(bb.emit(product), dtype))


def _recognize_all(mod):
    graph = RelaxGraph.from_function(mod["main"])
    return specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]))


@pytest.mark.parametrize(
    "make, shapes, dtype, reason",
    [
        (lambda bb, x: R.matmul(x, relax.const(np.ones((32, 64), F))), [(8, 32)], F, "float32 as TF32 \\(--precision tf32\\)"),
        (
            lambda bb, x: _cast(bb, R.matmul(x, relax.const(rounded_to(np.ones((32, 12), F), "bfloat16")), out_dtype=F)),
            [(8, 32)],
            "bfloat16",
            "multiple of 8",
        ),
        (
            lambda bb, x: _cast(bb, R.matmul(x, relax.const(rounded_to(np.ones((12, 64), F), "bfloat16")), out_dtype=F)),
            [(8, 12)],
            "bfloat16",
            "multiple of 8",
        ),
    ],
)
def test_products_the_kernels_cannot_run_are_refused_with_the_reason(make, shapes, dtype, reason):
    with pytest.raises(Refused, match=reason):
        _recognize_all(function_module(make, *shapes, dtype=dtype))


@pytest.mark.parametrize("model, precision", [("tiny_bert", "bf16"), ("tiny_gpt2", "fp16")])
def test_at_sixteen_bits_each_dense_layer_takes_its_cast_and_epilogue_and_erf_gelu_is_fused(model, precision):
    """TVM's mixed-precision pass casts each product's float32 result before the bias and activation; the
    CUTLASS candidates take the cast, the bias and the activation (BERT's erf GELU too, which cuBLASLt has not)."""
    graph = RelaxGraph.from_function(at_precision(load_model(str(MODELS / f"{model}.onnx")), precision).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    succs = graph.graph.succs
    dense = [
        node
        for node in range(len(graph.graph))
        if tvm_compat.op_name(graph.call(node)) == "relax.matmul"
        and tvm_compat.is_constant(graph.call(node).args[1])
        and any(graph.graph.ops[user] == "relax.astype" for user in succs[node])
    ]
    assert len(dense) >= 4
    for node in dense:
        largest = max((c for c in candidates if node in c.nodes), key=lambda c: len(c.nodes))
        names = sorted(tvm_compat.op_name(graph.call(n)) for n in largest.nodes)
        assert "relax.astype" in names and "relax.add" in names, f"{largest.pattern}: {names}"
        check_candidate(graph, largest.nodes)
    if model == "tiny_bert":
        assert any(c.pattern.endswith("_gelu_erf") for c in candidates)
    assert any(c.pattern.startswith("cutlass.batch_matmul") for c in candidates)


def test_float32_models_get_no_candidates():
    graph = RelaxGraph.from_function(load_model(str(MODELS / "tiny_bert.onnx")).mod["main"])
    assert enumerate_candidates(graph, patterns.patterns()) == []


TF32_CASES = ["dense_bias", "dense_t_bias_add_gelu_erf", "dense_relu", "batch_matmul_nt_scale", "batch_matmul_tt_scale"]


@pytest.mark.parametrize("pattern_name", TF32_CASES)
def test_at_tf32_float32_products_become_tf32_kernels_computing_what_tvm_computes(pattern_name):
    make, shapes = product_case(pattern_name)
    graph, candidate = whole_candidate(function_module(make, *shapes), patterns.patterns(tf32=True), f"cutlass.{pattern_name}_tf32")
    assert candidate is not None, f"no cutlass.{pattern_name}_tf32 candidate covers the float32 function"
    spec = check_candidate(graph, candidate.nodes, tf32=True)
    assert (spec.kind.operand_dtype, spec.kind.out_dtype) == (F, F) and spec.words[1:3] == (kernels.TYPE_CODES[F],) * 2
    if spec.kind.a_k_major:  # never the layout CUTLASS's TF32 builder swaps (K-major left, N-major right)
        assert spec.kind.b_k_major


def test_at_tf32_a_weight_beside_a_k_major_left_operand_is_transposed_once_and_activations_are_refused():
    """CUTLASS's TF32 kernels for a K-major left and an N-major right operand swap them, and computed wrong on an
    H200: a constant weight is taken transposed (the spec then reads it K-major), a product of activations is refused."""
    make, shapes = product_case("dense_bias")
    graph, candidate = whole_candidate(function_module(make, *shapes), patterns.patterns(tf32=True), "cutlass.dense_bias_tf32")
    spec = check_candidate(graph, candidate.nodes, tf32=True)
    weight = tvm_compat.constant_array(spec.operands[1])
    assert spec.kind.a_k_major and spec.kind.b_k_major and weight.shape == (40, 24) and weight.flags.c_contiguous
    make, shapes = product_case("batch_matmul")
    with pytest.raises(Refused, match="not a constant matrix"):
        _recognize_all_tf32(function_module(make, *shapes))


def _recognize_all_tf32(mod):
    graph = RelaxGraph.from_function(mod["main"])
    return specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), tf32=True)


def test_tf32_patterns_are_named_apart_and_take_only_float32_operands():
    exact, tf32 = patterns.patterns(), patterns.patterns(tf32=True)
    assert [p.name + "_tf32" for p in exact] == [p.name for p in tf32]
    make, shapes = product_case("dense_bias", cast_to="float16")
    with pytest.raises(Refused, match="a TF32 kernel takes float32 operands"):
        _recognize_all_tf32(function_module(make, *shapes, dtype="float16"))


def test_every_dense_layer_of_tiny_bert_has_a_tf32_candidate():
    graph = RelaxGraph.from_function(load_model(str(MODELS / "tiny_bert.onnx")).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns(tf32=True))
    dense = [
        node
        for node in range(len(graph.graph))
        if graph.graph.ops[node] == "relax.matmul" and tvm_compat.is_constant(graph.call(node).args[1])
    ]
    assert dense and all(any(node in c.nodes for c in candidates) for node in dense)
    assert all(c.pattern.endswith("_tf32") for c in candidates)
