"""Each cuBLAS candidate's spec, read back as cuBLASLt would compute it, against TVM's own build (no GPU needed).

``cublas_cases.reference`` follows cuBLASLt's contract in PyTorch (float64 on the CPU here); the
spec a candidate's group lowers to must compute what TVM computes for the same Relax on the
CPU, within float32 rounding of sums of at most a few hundred products (RTOL, ATOL). The GPU
tests (test_cublas_kernels.py) then check the real kernels against PyTorch on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from collage_cublas import library, patterns, specs
from cublas_cases import reference
from tvm import relax

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, bf16_split, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import (
    DTYPES,
    assert_matches,
    function_module,
    inputs_and_answer,
    operand_arrays,
    rounded_to,
    whole_candidate,
    widened_residual_case,
)
from collage_core.kit.testing import product_case as case

R = relax.op
F = "float32"
RTOL, ATOL = 1e-4, 1e-4
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)


def check_candidate(graph: RelaxGraph, nodes, tf32: bool = False, aligned: bool = False) -> specs.KernelSpec:
    """The candidate's spec, read back as cuBLASLt computes it, equals TVM's CPU build of the same operators
    (within a few units in the last place when it writes 16 bits: TVM's build rounds after each step)."""
    standalone = graph.standalone_module(nodes)
    func = standalone["main"]
    spec = specs.recognize(Group.from_function(func), tf32=tf32, aligned=aligned)
    inputs, expected = inputs_and_answer(standalone, RNG)
    got = reference(spec.words, operand_arrays(spec.operands, func.params, inputs), expected.size).reshape(expected.shape)
    # a 16-bit result widened again to float32 is not rounded by the kernel: within that rounding of TVM's build
    casts = [str(call.attrs.dtype) for call in Group.from_function(func).calls if tvm_compat.op_name(call) == "relax.astype"]
    rounded_to_16 = next((dtype for dtype in casts if dtype != F), F)
    assert_matches(
        got, expected, rounded_to_16 if spec.words[-1] == specs.OPERAND_TYPES[F] else specs.DTYPE_OF_TYPE[spec.words[-1]], RTOL, ATOL
    )
    return spec


def module(make, *shapes) -> tvm.IRModule:
    return function_module(make, *shapes)


def whole(mod, pattern_name):
    return whole_candidate(mod, patterns.patterns(), f"cublas.{pattern_name}")


def const(*shape):
    return relax.const(RNG.uniform(-1, 1, size=shape).astype(F))


# the `_f32_add` forms exist only at 16 bits: test_a_sixteen_bit_projection_joining_a_float32_residual_...
PATTERN_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns() if "_f32_" not in p.name)


@pytest.mark.parametrize("pattern_name", PATTERN_NAMES)
def test_every_pattern_covers_its_case_and_its_spec_computes_what_tvm_computes(pattern_name):
    make, shapes = case(pattern_name)
    graph, candidate = whole(module(make, *shapes), pattern_name)
    assert candidate is not None, f"no cublas.{pattern_name} candidate covers the whole function"
    check_candidate(graph, candidate.nodes)


def test_a_right_operand_shared_by_a_batch_is_folded_into_the_rows():
    graph, candidate = whole(module(lambda bb, a: R.matmul(a, const(7, 9)), (3, 5, 7)), "dense")
    spec = check_candidate(graph, candidate.nodes)
    n, m = spec.words[1], spec.words[2]
    assert (n, m) == (9, 15) and spec.words[17:19] == (1, 1)  # one problem of 15 rows, no batch


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


# GPT-2 (6 s on 2 cores) has the same kinds of product as BERT; its 16-bit products are checked by default below.
@pytest.mark.parametrize("model", ["tiny_bert", pytest.param("tiny_gpt2", marks=pytest.mark.slow)])
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


# 16-bit operands, as `collage optimize --precision bf16|fp16` writes them ---------------------------------


def _mixed(dtype):
    """Batched Q.K^T through permute_dims of ``dtype`` tensors, accumulating into float32."""
    return lambda bb, q, k: R.matmul(bb.emit(R.permute_dims(q, [0, 2, 1, 3])), bb.emit(R.permute_dims(k, [0, 2, 3, 1])), out_dtype=F)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_operands_accumulating_in_float32_name_their_type_in_the_next_to_last_word(dtype):
    mod = function_module(_mixed(dtype), (2, 16, 4, 8), (2, 16, 4, 8), dtype=dtype)
    graph, candidate = whole(mod, "batch_matmul_tt")
    assert candidate is not None
    spec = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]))
    words = spec.words
    assert words[-2:] == (specs.OPERAND_TYPES[dtype], specs.OPERAND_TYPES[F])  # the product is written in float32
    float32_graph, float32_candidate = whole(function_module(_mixed(F), (2, 16, 4, 8), (2, 16, 4, 8)), "batch_matmul_tt")
    float32_words = specs.recognize(Group.from_function(float32_graph.standalone_module(float32_candidate.nodes)["main"])).words
    assert words[:-2] == float32_words[:-2] and float32_words[-2:] == (specs.OPERAND_TYPES[F],) * 2


@pytest.mark.parametrize(
    "make, dtypes, reason",
    [
        (lambda bb, a, b: R.matmul(a, b), ("bfloat16", "bfloat16"), "only with out_dtype float32"),
        (lambda bb, a, b: R.matmul(a, bb.emit(R.astype(b, "float16")), out_dtype=F), ("bfloat16", "float32"), "mixed dtypes"),
    ],
)
def test_sixteen_bit_products_cublaslt_would_compute_differently_are_refused(make, dtypes, reason):
    params = [relax.Var(f"x{i}", relax.TensorType(shape, d)) for i, (shape, d) in enumerate(zip([(4, 8), (8, 4)], dtypes))]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    mod = bb.get()
    matmul = [b.value for b in mod["main"].body.blocks[0].bindings if tvm_compat.op_name(b.value) == "relax.matmul"]
    graph = RelaxGraph.from_function(mod["main"])
    node = [i for i, op in enumerate(graph.graph.ops) if op == "relax.matmul"]
    assert matmul and node
    with pytest.raises(Refused, match=reason):
        specs.recognize(Group.from_function(graph.standalone_module(node)["main"]))


@pytest.mark.parametrize("model, precision", [("tiny_gpt2", "bf16"), ("tiny_bert", "fp16")])
def test_at_sixteen_bits_each_dense_layer_takes_its_cast_and_epilogue_and_computes_what_tvm_does(model, precision):
    """TVM's mixed-precision pass casts each product's float32 result before the bias and activation; the
    cuBLAS candidates take the cast with them and write 16 bits, instead of leaving TVM the cast and the epilogue."""
    graph = RelaxGraph.from_function(at_precision(load_model(str(MODELS / f"{model}.onnx")), precision).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    succs = graph.graph.succs
    dense = [
        node
        for node in range(len(graph.graph))  # each product whose result the pass casts (all but the logits)
        if tvm_compat.op_name(graph.call(node)) == "relax.matmul"
        and tvm_compat.is_constant(graph.call(node).args[1])
        and any(graph.graph.ops[user] == "relax.astype" for user in succs[node])
    ]
    assert len(dense) >= 4
    for node in dense:
        largest = max((c for c in candidates if node in c.nodes), key=lambda c: len(c.nodes))
        names = sorted(tvm_compat.op_name(graph.call(n)) for n in largest.nodes)
        assert "relax.astype" in names and "relax.add" in names, f"{largest.pattern}: {names}"
        spec = check_candidate(graph, largest.nodes)
        widened = "_f32_add" in largest.pattern  # joins a float32 residual stream (GPT-2): the kernel writes float32
        assert spec.words[-1] == specs.OPERAND_TYPES[F if widened else DTYPES[precision]], largest.pattern


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "pattern_name", ["dense_bias_add_relu", "dense_t_bias", "dense_bias_reshape_relu", "dense_bias_reshape_gelu", "batch_matmul_tt_scale"]
)
def test_a_product_cast_to_sixteen_bits_is_one_candidate_writing_sixteen_bits(pattern_name, dtype):
    make, shapes = case(pattern_name, cast_to=dtype)
    graph, candidate = whole(function_module(make, *shapes, dtype=dtype), pattern_name)
    assert candidate is not None, f"cublas.{pattern_name} does not take the cast to {dtype}"
    spec = check_candidate(graph, candidate.nodes)
    assert spec.words[-2:] == (specs.OPERAND_TYPES[dtype],) * 2
    if "bias" in pattern_name:  # cuBLASLt takes the bias in D's type
        assert str(tvm_compat.constant_array(spec.operands[2]).dtype) == dtype


@pytest.mark.parametrize("pattern_name", ["dense_bias_add_relu", "dense_t_bias", "batch_matmul_tt_scale", "batch_matmul"])
def test_at_tf32_a_float32_product_is_also_a_tf32_candidate_naming_tf32_operands(pattern_name):
    """The exact kernel and the TF32 one are candidates of their own (named apart, costed apart); the TF32 spec
    differs only in its operand word, which the runtime reads as CUBLAS_COMPUTE_32F_FAST_TF32."""
    make, shapes = case(pattern_name)
    mod = module(make, *shapes)
    both = patterns.patterns(tf32=True)
    assert {p.name for p in both} == {p.name for p in patterns.patterns()} | {p.name + "_tf32" for p in patterns.patterns()}
    graph, exact = whole_candidate(mod, both, f"cublas.{pattern_name}")
    _, tf32 = whole_candidate(mod, both, f"cublas.{pattern_name}_tf32")
    assert exact is not None and tf32 is not None and exact.key != tf32.key
    exact_words = check_candidate(graph, exact.nodes).words
    tf32_words = check_candidate(graph, tf32.nodes, tf32=True).words
    assert tf32_words[-2:] == (specs.TF32_OPERANDS, specs.OPERAND_TYPES[F]) and tf32_words[:-2] == exact_words[:-2]


BF16X6_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns(bf16x6=True) if p.name.endswith("_bf16x6"))


def test_every_dense_pattern_reading_its_input_as_it_lies_comes_again_as_bf16x6():
    plain = {p.name.split(".", 1)[1] for p in patterns.patterns()}
    assert BF16X6_NAMES == sorted(f"{name}_bf16x6" for name in plain if name.startswith("dense") and not name.startswith("dense_t"))


@pytest.mark.parametrize("pattern_name", [name.removesuffix("_bf16x6") for name in BF16X6_NAMES if "_f32_" not in name])
def test_a_bf16x6_spec_computes_the_float32_product_to_float32s_accuracy(pattern_name):
    """The bf16x6 spec, read back with its left operand's terms laid along K as the lowering lays them, is the
    bfloat16 product six times as deep that equals the float32 one: within a few float32 roundings of the exact
    float64 product (what the plain spec computes here), far inside TF32's error."""
    make, shapes = case(pattern_name)
    mod = module(make, *shapes)
    graph, candidate = whole_candidate(mod, patterns.patterns(bf16x6=True), f"cublas.{pattern_name}_bf16x6")
    assert candidate is not None
    func = graph.standalone_module(candidate.nodes)["main"]
    exact_spec = specs.recognize(Group.from_function(func))
    split_spec = specs.recognize(Group.from_function(func), bf16x6=True, aligned=True)  # aligned: the weight split
    k = exact_spec.words[3]
    assert split_spec.words[3] == 6 * k and split_spec.words[-2:] == (specs.OPERAND_TYPES["bfloat16"], specs.OPERAND_TYPES[F])
    inputs, _ = inputs_and_answer(graph.standalone_module(candidate.nodes), RNG)
    operands = operand_arrays(split_spec.operands, func.params, inputs)
    operands[1] = bf16_split.stacked_constant(operands[1], axis=-1, left=True)  # what stacked_terms computes (tests/test_bf16_split.py)
    size = int(np.prod(tvm_compat.tensor_shape_dtype(func.body.body)[0]))
    got = reference(split_spec.words, operands, size)
    exact = reference(exact_spec.words, operand_arrays(exact_spec.operands, func.params, inputs), size)
    assert np.max(np.abs(got - exact)) <= 2.0**-22 * max(1.0, np.max(np.abs(exact)))
    assert set(split_spec.before) == {1}


def test_bf16x6_reads_a_constant_weight_and_an_input_as_it_lies():
    make, shapes = case("dense_t_bias")
    graph = RelaxGraph.from_function(module(make, *shapes)["main"])
    with pytest.raises(Refused, match="not through a transpose"):
        specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), bf16x6=True)
    make, shapes = case("batch_matmul")
    graph = RelaxGraph.from_function(module(make, *shapes)["main"])
    with pytest.raises(Refused, match="constant weight"):
        specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), bf16x6=True)
    folded = function_module(lambda bb: R.matmul(const(8, 30), const(30, 50)))
    graph = RelaxGraph.from_function(folded["main"])
    with pytest.raises(Refused, match="not a constant's"):
        specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), bf16x6=True, aligned=True)


def test_a_tf32_kernel_takes_only_float32_operands():
    make, shapes = case("dense_bias", cast_to="float16")
    mod = function_module(make, *shapes, dtype="float16")
    graph = RelaxGraph.from_function(mod["main"])
    with pytest.raises(Refused, match="a TF32 kernel takes float32 operands"):
        specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), tf32=True)


@pytest.mark.parametrize(
    "dtype, shape, padded_cols",
    [
        ("float32", (25, 13), 16),  # 52-byte rows, and 100-byte ones transposed: padded to 64 bytes
        ("bfloat16", (25, 13), 16),  # 26-byte rows, and 50-byte ones transposed: padded to 32 bytes
        ("bfloat16", (24, 40), 40),  # 80-byte rows: already aligned, read in place
    ],
)
def test_a_constant_operand_whose_rows_are_not_16_bytes_apart_is_read_from_a_padded_copy(dtype, shape, padded_cols):
    """A weight whose rows are misaligned either way: cuBLASLt's fast kernels read it padded."""
    weight = rounded_to(RNG.uniform(-1, 1, size=shape).astype(F), dtype)
    mod = function_module(lambda bb, x: R.matmul(x, relax.const(weight), out_dtype=F), (3, 5, shape[0]), dtype=dtype)
    graph, candidate = whole(mod, "dense")
    spec = check_candidate(graph, candidate.nodes, aligned=True)  # computes what TVM computes: the padding is never read
    stored = tvm_compat.constant_array(spec.operands[0])
    assert stored.shape == (shape[0], padded_cols) and str(stored.dtype) == dtype
    np.testing.assert_array_equal(stored[:, : shape[1]], weight)
    assert not np.any(stored[:, shape[1] :].astype(np.float32))
    assert spec.words[4:8] == (0, shape[1], shape[0], padded_cols)  # op(a) is N x K, read through the padded rows


@pytest.mark.parametrize(
    "dtype, out_dtype, vocab, padded_rows",
    [
        ("float32", F, 13, 16),
        ("bfloat16", F, 17, 32),  # 17 float32 columns: 16 bytes would be 20 rows; sm_90's kernels wanted 32
        ("bfloat16", "bfloat16", 12, 16),  # 24-byte bfloat16 rows: padded although 12 float32 would be aligned
    ],
)
def test_a_constant_operand_whose_rows_are_misaligned_and_columns_aligned_is_read_from_its_transpose(dtype, out_dtype, vocab, padded_rows):
    """GPT-2's language-model head (a 768 x 50257 weight: the vocabulary is odd) ran as cuBLASLt's sm75 kernel at
    alignment 1. Stored transposed (50257 x 768, K-major, as PyTorch's ``nn.Linear`` keeps it), every row is 1536
    bytes, and cuBLASLt reads it transposed. The output's rows are misaligned too, so the weight gets zero rows up to a
    multiple of 16 (specs.PADDED_MULTIPLE), which the runtime's padded routes compute as well, into rows that many
    elements apart (word 21): the product they run is aligned throughout."""
    weight = rounded_to(RNG.uniform(-1, 1, size=(24, vocab)).astype(F), dtype)

    def make(bb, x):
        product = R.matmul(x, relax.const(weight), out_dtype=F)
        return product if out_dtype == F else R.astype(bb.emit(product), out_dtype)

    graph, candidate = whole(function_module(make, (3, 5, 24), dtype=dtype), "dense")
    spec = check_candidate(graph, candidate.nodes, aligned=True)  # computes what TVM computes; the zero rows are zero
    stored = tvm_compat.constant_array(spec.operands[0])
    assert stored.shape == (padded_rows, 24) and str(stored.dtype) == dtype
    np.testing.assert_array_equal(stored[:vocab], weight.T)
    assert not np.any(stored[vocab:].astype(np.float32))
    assert spec.words[4:8] == (1, 24, vocab, 24)  # op(a) transposed: stored K x N column-major, ld K
    assert spec.words[21] == padded_rows


@pytest.mark.parametrize(
    "make, shapes, pattern, why",
    [
        (lambda bb, x: R.add(bb.emit(R.matmul(x, const(24, 13))), const(13)), [(5, 24)], "dense_bias", "a bias"),
        (lambda bb, x: R.matmul(x, const(24, 16)), [(5, 24)], "dense", "aligned output rows"),
        (lambda bb, x, y: R.matmul(x, y), [(5, 24), (24, 13)], "batch_matmul", "no weight"),
        (lambda bb, x, r: R.add(bb.emit(R.matmul(x, const(24, 13))), r), [(5, 24), (5, 13)], "dense_add", "a residual"),
    ],
)
def test_a_weight_is_padded_along_the_output_rows_only_where_the_padded_product_needs_nothing_else(make, shapes, pattern, why):
    """A bias would be read past its end by the padded rows, an aligned output needs no padding, an operand that is not
    a constant cannot be stored padded, and a residual is read through D's layout: the spec then pads nothing (word
    21 is 0)."""
    graph, candidate = whole(function_module(make, *shapes), pattern)
    assert candidate is not None, why
    spec = check_candidate(graph, candidate.nodes, aligned=True)
    assert spec.words[21] == 0, why


WIDENED = ["dense_bias_f32_add", "dense_reshape_f32_add", "dense_bias_reshape_f32_add"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern_name", WIDENED)
def test_a_sixteen_bit_projection_joining_a_float32_residual_is_one_candidate_writing_float32(pattern_name, dtype):
    """GPT-2's projections at 16 bits: the product is cast to 16 bits, biased, cast back to float32 and added to
    the float32 residual stream. cuBLASLt takes all of it, 16-bit operands and a float32 bias, residual and D;
    it skips the rounding to 16 bits in between, so it is within that rounding of TVM's build, not closer."""
    graph, candidate = whole(widened_residual_case(pattern_name, dtype), pattern_name)
    assert candidate is not None, f"cublas.{pattern_name} does not take the widened residual at {dtype}"
    spec = check_candidate(graph, candidate.nodes)  # within the rounding to `dtype` of TVM's build, which rounds there
    assert spec.words[-2:] == (specs.OPERAND_TYPES[dtype], specs.OPERAND_TYPES[F])
    assert spec.words[-4] == 1  # a residual (C, read with beta 1)
    if "bias" in pattern_name:
        assert str(tvm_compat.constant_array(spec.operands[2]).dtype) == F


def test_a_cast_back_to_float32_without_a_cast_to_sixteen_bits_before_it_is_refused():
    """Only a 16-bit result is widened: a float32 product and bias cast to float32 again is not a post-operation cuBLAS fuses."""
    make = lambda bb, x, r: R.add(bb.emit(R.astype(bb.emit(R.add(bb.emit(R.matmul(x, const(24, 40))), const(40))), F)), r)  # noqa: E731
    with pytest.raises(Refused, match="relax.astype after the anchor is not a post-operation"):
        specs.recognize(Group.from_function(function_module(make, (16, 24), (16, 40))["main"]))


def test_a_float32_product_rounded_to_sixteen_bits_on_purpose_is_not_widened_back():
    """float32 operands whose result the program rounds to bfloat16 and widens again: the kernel would skip a
    rounding the program asked for, so the widening is refused."""

    def make(bb, x, r):
        rounded = bb.emit(
            R.add(
                bb.emit(R.astype(bb.emit(R.matmul(x, const(24, 40), out_dtype=F)), "bfloat16")),
                relax.const(rounded_to(RNG.uniform(-1, 1, size=40).astype(F), "bfloat16")),
            )
        )
        return R.add(bb.emit(R.astype(rounded, F)), r)

    with pytest.raises(Refused, match="relax.astype after the anchor is not a post-operation"):
        specs.recognize(Group.from_function(function_module(make, (16, 24), (16, 40))["main"]))


def _dense_tanh_gelu(dtype: str, cube_dtype: str):
    """x @ W cast to ``dtype``, then tanh GELU spelt out, its cube computed in ``cube_dtype`` (``dtype``: as
    exporters write it; float32 between two casts: as TVM's mixed-precision pass leaves it)."""

    def scalar(value, of=dtype):
        return relax.const(rounded_to(np.array(value, dtype=F), of), of)

    weight = relax.const(rounded_to(RNG.uniform(-1, 1, size=(24, 40)).astype(F), dtype))

    def make(bb, x):
        v = bb.emit(R.astype(bb.emit(R.matmul(x, weight, out_dtype=F)), dtype))
        if cube_dtype == dtype:
            power = bb.emit(R.power(v, scalar(3.0)))
        else:
            power = bb.emit(R.astype(bb.emit(R.power(bb.emit(R.astype(v, cube_dtype)), scalar(3.0, cube_dtype))), dtype))
        inner = bb.emit(R.multiply(bb.emit(R.add(v, bb.emit(R.multiply(power, scalar(0.044715))))), scalar((2 / np.pi) ** 0.5)))
        one = bb.emit(R.add(bb.emit(R.tanh(inner)), scalar(1.0)))
        return R.multiply(bb.emit(R.multiply(v, scalar(0.5))), one)

    return function_module(make, (16, 24), dtype=dtype)


@pytest.mark.parametrize("dtype, cube_dtype", [("float16", "float16"), ("float16", F), ("bfloat16", F)])  # TVM has no bfloat16 power
def test_tanh_gelu_at_sixteen_bits_is_cublas_gelu_whether_its_cube_is_computed_in_sixteen_bits_or_float32(dtype, cube_dtype):
    graph, candidate = whole(_dense_tanh_gelu(dtype, cube_dtype), "dense_gelu")
    assert candidate is not None, f"a cube in {cube_dtype} is not read as tanh GELU"
    spec = check_candidate(graph, candidate.nodes)
    assert spec.words[-6] == specs.GELU_TANH


def test_a_cube_cast_through_another_sixteen_bit_type_is_not_tanh_gelu():
    graph, candidate = whole(_dense_tanh_gelu("bfloat16", "float16"), "dense_gelu")
    assert candidate is None


def test_the_runtime_reads_the_spec_version_that_the_specs_write():
    """A spec of another version is refused by the runtime; the two sides must change together."""
    source = library.SOURCE.read_text()
    assert f"constexpr int64_t kSpecVersion = {specs.SPEC_VERSION};" in source
