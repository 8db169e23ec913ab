"""Each cuDNN candidate's spec, read back as cuDNN's graph would compute it, against TVM's own build (no GPU needed).

``cudnn_cases.reference`` builds the operation graph a spec describes with PyTorch (float64 on
the CPU here); the spec a candidate's group lowers to must compute what TVM computes for the
same Relax, within float32 rounding of sums of at most a few hundred products (RTOL, ATOL). The GPU tests (test_cudnn_kernels.py)
then check the real kernels against PyTorch on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from collage_cudnn import patterns, specs
from cudnn_cases import attention, case, case_ids, cast_dtype, causal_mask, reference
from tvm import relax

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import DTYPES, assert_matches, function_module, inputs_and_answer, operand_arrays, whole_candidate

R = relax.op
F = "float32"
RTOL, ATOL = 1e-4, 1e-4
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)


def check_candidate(graph: RelaxGraph, nodes, tf32: bool = False) -> specs.KernelSpec:
    """The candidate's spec, read back as cuDNN computes it, equals TVM's CPU build of the same operators
    (within a few units in the last place when it writes 16 bits: TVM's build rounds after each step)."""
    standalone = graph.standalone_module(nodes)
    func = standalone["main"]
    spec = specs.recognize(Group.from_function(func), tf32=tf32)
    inputs, expected = inputs_and_answer(standalone, RNG)
    got = reference(spec.words, operand_arrays(spec.operands, func.params, inputs)).reshape(expected.shape)
    assert_matches(got, expected, specs.DTYPE_OF_TYPE[spec.words[-1]], RTOL, ATOL)
    return spec


def module(make, *shapes) -> tvm.IRModule:
    return function_module(make, *shapes)


def whole(mod, pattern_name):
    return whole_candidate(mod, patterns.patterns(), f"cudnn.{pattern_name}")


def const(*shape):
    return relax.const(RNG.uniform(-1, 1, size=shape).astype(F))


PATTERN_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns())


@pytest.mark.parametrize("pattern_name, activation", case_ids(PATTERN_NAMES))
def test_every_pattern_covers_its_case_and_its_spec_computes_what_tvm_computes(pattern_name, activation):
    make, shapes = case(pattern_name, activation)
    graph, candidate = whole(function_module(make, *shapes, dtype=cast_dtype(pattern_name)), pattern_name)
    assert candidate is not None, f"no cudnn.{pattern_name} candidate covers the whole function"
    check_candidate(graph, candidate.nodes)


@pytest.mark.parametrize(
    "make, shapes, reason",
    [
        (lambda bb, x: R.nn.conv2d(x, const(8, 4, 3, 3), data_layout="NHWC"), [(1, 9, 9, 4)], "NHWC data with OIHW weights"),
        (lambda bb, x, w: R.nn.conv2d(x, w), [(1, 4, 9, 9), (8, 4, 3, 3)], "weights computed at run time"),
        (lambda bb, x: R.add(R.nn.conv2d(x, const(8, 4, 3, 3)), const(8, 7, 7)), [(1, 4, 9, 9)], "a bias that is not per channel"),
        (lambda bb, a, b: R.matmul(a, b), [(2, 3, 5, 7), (3, 7, 9)], "batch dimensions that broadcast"),
        (
            lambda bb, x: R.nn.relu(R.add(R.add(R.nn.conv2d(x, const(4, 4, 3, 3), padding=(1, 1)), const(1, 4, 1, 1)), x)),
            [(1, 4, 9, 9)],
            "a residual add (no float32 engine)",
        ),
        (lambda bb, x: R.nn.silu(R.add(R.nn.conv2d(x, const(8, 4, 3, 3)), const(1, 8, 1, 1))), [(1, 4, 9, 9)], "SiLU (no float32 engine)"),
        (lambda bb, x: R.matmul(x, const(8, 8)), [(4, 8)], "a dense layer (cuBLAS's)"),
    ],
)
def test_checks_refuse_what_cudnn_would_compute_differently(make, shapes, reason):
    mod = module(make, *shapes)
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    covering = [c for c in enumerate_candidates(graph, patterns.patterns()) if frozenset(c.nodes) == everything]
    assert covering == [], f"{reason}: {[c.pattern for c in covering]}"


def test_a_16_bit_convolution_with_a_bias_is_taken_whole_in_nhwc_only():
    """cuDNN's fused engines take a 16-bit convolution's bias (and ReLU) in NHWC; in NCHW only the cast is."""

    def convolution(last: bool):
        def make(bb, x):
            layouts = dict(data_layout="NHWC", kernel_layout="OHWI") if last else {}
            weights = relax.const(RNG.uniform(-1, 1, size=(8, 3, 3, 4) if last else (8, 4, 3, 3)).astype("bfloat16"))
            conv = bb.emit(R.astype(bb.emit(R.nn.conv2d(x, weights, out_dtype=F, **layouts)), "bfloat16"))
            bias = relax.const(RNG.uniform(-1, 1, size=(1, 1, 1, 8) if last else (1, 8, 1, 1)).astype("bfloat16"))
            return R.nn.relu(bb.emit(R.add(conv, bias)))

        return function_module(make, (1, 9, 9, 4) if last else (1, 4, 9, 9), dtype="bfloat16")

    for last in (True, False):
        graph = RelaxGraph.from_function(convolution(last)["main"])
        whole = {c.pattern for c in enumerate_candidates(graph, patterns.patterns()) if len(c.nodes) == len(graph.graph)}
        assert whole == ({"cudnn.conv2d_nhwc_cast_bias_relu"} if last else set()), (last, whole)
    graph = RelaxGraph.from_function(convolution(True)["main"])
    candidate = next(c for c in enumerate_candidates(graph, patterns.patterns()) if len(c.nodes) == len(graph.graph))
    check_candidate(graph, candidate.nodes)


def test_a_float32_batched_product_is_refused_in_one_line_and_a_sixteen_bit_one_taken():
    refusals = []
    graph = RelaxGraph.from_function(module(lambda bb, a, b: R.matmul(a, b), (2, 3, 16, 8), (2, 3, 8, 16))["main"])
    assert not enumerate_candidates(graph, patterns.patterns(), refusals)
    assert {(r.pattern, r.reason) for r in refusals} == {("cudnn.batch_matmul", patterns.FLOAT32_PRODUCTS)}
    assert "\n" not in patterns.FLOAT32_PRODUCTS
    sixteen = function_module(
        lambda bb, a, b: R.astype(bb.emit(R.matmul(a, b, out_dtype="float32")), "bfloat16"), (2, 3, 16, 8), (2, 3, 8, 16), dtype="bfloat16"
    )
    graph = RelaxGraph.from_function(sixteen["main"])
    found = {c.pattern for c in enumerate_candidates(graph, patterns.patterns())}
    assert "cudnn.batch_matmul" in found


def test_a_group_with_an_unfused_operator_is_refused_with_its_name():
    mod = module(lambda bb, x: R.nn.softmax(R.matmul(x, const(8, 8))), (4, 8))
    with pytest.raises(Refused, match="softmax"):
        specs.recognize(Group.from_function(mod["main"]))


@pytest.mark.parametrize("model", ["tiny_resnet", "tiny_bert", "tiny_gpt2"])
def test_every_convolution_and_batched_product_of_a_shipped_model_has_a_candidate_that_computes_what_tvm_does(model):
    """At float32 the batched products are candidates at --precision tf32 only (patterns.FLOAT32_PRODUCTS)."""
    graph = RelaxGraph.from_function(load_model(str(MODELS / f"{model}.onnx")).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns(tf32=True))

    def is_anchor(call):
        name = tvm_compat.op_name(call)
        return name == "relax.nn.conv2d" or (name == "relax.matmul" and not tvm_compat.is_constant(call.args[1]))

    anchors = {node for node in range(len(graph.graph)) if is_anchor(graph.call(node))}
    assert anchors and anchors <= {node for candidate in candidates for node in candidate.nodes}
    products = {node for node in anchors if tvm_compat.op_name(graph.call(node)) == "relax.matmul"}
    exact = {node for candidate in enumerate_candidates(graph, patterns.patterns()) for node in candidate.nodes}
    assert (products or model == "tiny_resnet") and not products & exact
    largest = {}
    for candidate in candidates:
        largest.setdefault(candidate.key, candidate)
    for candidate in largest.values():
        check_candidate(graph, candidate.nodes)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_at_sixteen_bits_each_convolution_takes_the_cast_after_it_and_computes_what_tvm_does(precision):
    """TVM's mixed-precision pass casts each convolution's float32 result to 16 bits; the cuDNN candidates take
    the cast with them (the convolution writes 16 bits) instead of leaving TVM a cast kernel per convolution."""
    imported = at_precision(load_model(str(MODELS / "tiny_resnet.onnx")), precision)
    graph = RelaxGraph.from_function(imported.mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    convolutions = [node for node in range(len(graph.graph)) if tvm_compat.op_name(graph.call(node)) == "relax.nn.conv2d"]
    assert convolutions
    for node in convolutions:
        largest = max((c for c in candidates if node in c.nodes), key=lambda c: len(c.nodes))
        names = sorted(tvm_compat.op_name(graph.call(n)) for n in largest.nodes)
        assert names == ["relax.astype", "relax.nn.conv2d"], f"{largest.pattern}: {names}"
        spec = check_candidate(graph, largest.nodes)
        assert spec.words[-1] == specs.OPERAND_TYPES[DTYPES[precision]]  # y is written in 16 bits


def test_at_tf32_each_float32_pattern_is_also_a_tf32_candidate_naming_tf32_operands():
    """The tensor-core engines are a candidate of their own (named apart, costed apart); the spec differs from the
    exact one only in its operand word, which the runtime reads as "do not deselect tensor cores"."""
    exact = {p.name for p in patterns.patterns()}
    tf32 = {p.name for p in patterns.patterns(tf32=True)} - exact
    assert tf32 == {name + "_tf32" for name in exact if "_cast" not in name and ".attention" not in name}  # 16-bit only
    graph = RelaxGraph.from_function(load_model(str(MODELS / "tiny_resnet.onnx")).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns(tf32=True))
    by_nodes = {}
    for candidate in candidates:
        by_nodes.setdefault(candidate.nodes, {})[candidate.pattern.endswith("_tf32")] = candidate
    pairs = [pair for pair in by_nodes.values() if len(pair) == 2]
    assert len(pairs) == len(by_nodes)  # every exact candidate has its TF32 twin
    exact_spec = check_candidate(graph, pairs[0][False].nodes)
    tf32_spec = check_candidate(graph, pairs[0][True].nodes, tf32=True)
    assert tf32_spec.words[-2] == specs.TF32_OPERANDS and tf32_spec.words[:-2] == exact_spec.words[:-2]


def test_a_tf32_kernel_takes_only_float32_operands():
    graph = RelaxGraph.from_function(at_precision(load_model(str(MODELS / "tiny_resnet.onnx")), "fp16").mod["main"])
    conv = next(node for node in range(len(graph.graph)) if graph.graph.ops[node] == "relax.nn.conv2d")
    with pytest.raises(Refused, match="a TF32 kernel takes float32 operands"):
        specs.recognize(Group.from_function(graph.standalone_module([conv])["main"]), tf32=True)


@pytest.mark.parametrize("model, mask", [("tiny_bert", None), ("tiny_gpt2", "causal")])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_at_sixteen_bits_each_attention_of_a_shipped_model_is_one_fused_attention_that_computes_what_tvm_does(model, mask, precision):
    """Both products, the casts, the scale, GPT-2's causal mask and NaN guard, and the softmax in one candidate, whose
    spec (cuDNN's SDPA: scores in float32, probabilities rounded to 16 bits) computes what TVM's build of them does."""
    imported = at_precision(load_model(str(MODELS / f"{model}.onnx")), precision)
    graph = RelaxGraph.from_function(imported.mod["main"])
    softmaxes = [node for node in range(len(graph.graph)) if graph.graph.ops[node] == "relax.nn.softmax"]
    fused = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == "cudnn.attention"]
    assert softmaxes and sorted(node for c in fused for node in c.nodes if node in softmaxes) == softmaxes
    for candidate in fused:
        names = {tvm_compat.op_name(graph.call(n)) for n in candidate.nodes}
        assert {"relax.matmul", "relax.nn.softmax", "relax.astype"} <= names
        spec = check_candidate(graph, candidate.nodes)
        assert spec.words[1] == specs.ATTENTION and spec.words[-3] == specs.MASK_CODES[mask]
        assert spec.words[-1] == spec.words[-2] == specs.OPERAND_TYPES[DTYPES[precision]]


@pytest.mark.parametrize("model, form", [("tiny_bert", "attention_bshd"), ("tiny_gpt2", "attention_qkv_bshd")])
def test_at_sixteen_bits_attention_reads_a_stacked_qkv_and_writes_the_layout_the_next_product_reads_in_place(model, form):
    """GPT-2's q, k and v are the parts of one split of its stacked projection, and both models transpose the
    result back to (batch, sequence, heads, size) before the output projection: the fused attention takes those
    views as offsets and strides, so that no kernel copies them, and computes what TVM's build of them does."""
    graph = RelaxGraph.from_function(at_precision(load_model(str(MODELS / f"{model}.onnx")), "bf16").mod["main"])
    fused = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == f"cudnn.{form}"]
    assert fused
    for candidate in fused:
        names = [tvm_compat.op_name(graph.call(n)) for n in candidate.nodes]
        assert names.count("relax.permute_dims") == 4 and ("relax.split" in names) == ("qkv" in form)
        spec = check_candidate(graph, candidate.nodes)
        o_strides = spec.words[3 + 4 * 7 : 3 + 4 * 8]
        assert o_strides[1] < o_strides[2]  # heads inside sequence positions: (batch, sequence, heads, size) in memory
        if "qkv" in form:
            q_offset, k_offset, v_offset = spec.words[3 + 4 * 8 : 3 + 4 * 8 + 3]
            assert 0 == q_offset < k_offset < v_offset and all(operand.same_as(spec.operands[0]) for operand in spec.operands)


def _attention(dtype="bfloat16", mask=None, size=8):
    """A self-attention as the mixed-precision pass writes it (unscaled), with ``mask`` added to the scores."""
    return function_module(attention(dtype, mask=mask), *[(1, 16, 2, size)] * 3, dtype=dtype)


@pytest.mark.parametrize(
    "mod, reason",
    [
        (lambda: _attention(mask=RNG.uniform(-1, 0, size=(1, 1, 16, 16)).astype(F)), "not one causal mask"),
        (lambda: _attention(mask=np.triu(np.full((16, 16), -np.inf, F), k=1).T.copy()), "not one causal mask"),
        (lambda: _attention(size=12), "a head size of 12"),
        (lambda: _attention(mask=np.repeat(causal_mask(16), 2, axis=0)), "broadcasts the scores"),  # batch 1, mask of 2
    ],
)
def test_attention_that_cudnn_would_compute_differently_is_refused_in_one_line(mod, reason):
    graph = RelaxGraph.from_function(mod()["main"])
    everything = tuple(range(len(graph.graph)))
    with pytest.raises(Refused, match=reason) as refused:
        specs.recognize(Group.from_function(graph.standalone_module(everything)["main"]))
    assert "\n" not in str(refused.value)


def test_a_causal_mask_folded_to_one_plane_per_batch_is_the_causal_mask_and_planes_that_differ_are_refused():
    """GPT-2's export at batch 8 folds its causal mask to (8, 1, 128, 128): eight equal planes. A padding mask that
    hides other tokens in one sequence makes the planes differ: cuDNN's causal mask would not compute it."""
    planes = np.repeat(causal_mask(16), 2, axis=0)
    mod = function_module(attention("bfloat16", mask=planes), *[(2, 16, 2, 8)] * 3, dtype="bfloat16")
    graph = RelaxGraph.from_function(mod["main"])
    (candidate,) = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == "cudnn.attention"]
    spec = check_candidate(graph, candidate.nodes)  # computes what TVM computes, batch by batch
    assert spec.words[-3] == specs.MASK_CODES["causal"]
    planes[1, 0, :, 15] = -np.inf  # the second sequence's last token is padding
    padded = function_module(attention("bfloat16", mask=planes), *[(2, 16, 2, 8)] * 3, dtype="bfloat16")
    with pytest.raises(Refused, match="not one causal mask"):
        specs.recognize(Group.from_function(padded["main"]))


def test_attention_in_float32_is_left_to_the_products_one_by_one():
    graph = RelaxGraph.from_function(load_model(str(MODELS / "tiny_bert.onnx")).mod["main"])
    assert not [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == "cudnn.attention"]
    with pytest.raises(Refused, match="float32"):
        specs.recognize(Group.from_function(_attention(dtype=F)["main"]))


def test_a_padding_mask_that_hides_nothing_is_no_mask():
    """DistilBERT's export adds its padding mask, folded to zeros when every token is kept: attention without a mask."""
    mod = _attention(mask=np.zeros((1, 1, 1, 16), F))
    graph = RelaxGraph.from_function(mod["main"])
    (candidate,) = [c for c in enumerate_candidates(graph, patterns.patterns()) if c.pattern == "cudnn.attention"]
    assert len(candidate.nodes) == len(graph.graph)
    spec = check_candidate(graph, candidate.nodes)
    assert spec.words[-3] == specs.MASK_CODES[None]


def test_a_stacked_qkv_whose_rows_are_not_16_bytes_apart_is_refused():
    """Four parts split from rows of 76 numbers (q, k, v of 3 heads of 8, and 4 more): cuDNN reads 16-bit tensors
    whose outer strides are multiples of 8 elements, which these rows are not."""

    def make(bb, x):
        parts = bb.emit(R.split(x, indices_or_sections=[24, 48, 72], axis=2))
        q, k, v = (bb.emit(R.reshape(bb.emit(relax.TupleGetItem(parts, i)), (1, 16, 3, 8))) for i in range(3))
        return attention("bfloat16")(bb, q, k, v)

    mod = function_module(make, (1, 16, 76), dtype="bfloat16")
    graph = RelaxGraph.from_function(mod["main"])
    refusals = []
    assert not [c for c in enumerate_candidates(graph, patterns.patterns(), refusals) if c.pattern == "cudnn.attention_qkv"]
    assert any(r.pattern == "cudnn.attention_qkv" and "multiple of 8 elements" in r.reason for r in refusals)
