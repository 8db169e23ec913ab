"""Each cuDNN pattern, lowered to a cuDNN graph, built into a TVM executable for CUDA and run on the GPU, against PyTorch on CUDA.

Marked ``gpu`` (run with ``--run-gpu`` on a machine with an NVIDIA GPU; scripts/gpu-tests.sh).
Every pattern's case (``cudnn_cases.case``, each activation for the patterns that fuse one) is placed whole on cuDNN, built the way Collage
builds placements and run on Relax's VM; PyTorch computes the same problem on CUDA in float32
with TF32 off (``cudnn_cases.reference``). Tolerances: float32 sums of at most a few hundred
products, summed in different orders (RTOL, ATOL); a pattern that absorbs a cast writes bfloat16, which
may round the other way from PyTorch's float32 result rounded once (``sixteen_bit_atol``: four units in the last place).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from collage_cudnn import lowering, patterns, specs
from cudnn_cases import attention, case, case_ids, cast_dtype, causal_mask, reference
from tvm import relax

from collage_core.kit import Group, tvm_compat
from collage_core.kit.testing import (
    build,
    function_module,
    lower_partitions,
    operand_arrays,
    partition_module,
    rounded_to,
    sixteen_bit_atol,
    tf32_atol,
    whole_candidate,
)

pytestmark = pytest.mark.gpu
RTOL, ATOL = 1e-4, 1e-4
F = "float32"
PATTERN_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns())


@pytest.fixture(scope="module")
def cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return tvm_compat.make_target({"kind": "cuda"}), tvm.cuda(0)


@pytest.mark.parametrize("pattern_name, activation", case_ids(PATTERN_NAMES))
def test_kernel_matches_pytorch_on_cuda(pm, backends, cuda, pattern_name, activation):
    target, device = cuda
    make, shapes = case(pattern_name, activation)
    dtype = cast_dtype(pattern_name)
    mod = function_module(make, *shapes, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cudnn.{pattern_name}")
    placed = partition_module(graph, [candidate])
    lowered_text = str(lower_partitions(pm, placed, backends, target))
    assert lowering.RUN_FUNCTION in lowered_text  # the partition really runs on cuDNN
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(1)
    inputs = [rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    standalone = graph.standalone_module(candidate.nodes)["main"]
    spec = specs.recognize(Group.from_function(standalone))
    operands = operand_arrays(spec.operands, mod["main"].params, inputs)  # the cut-out function orders its own
    expected = reference(spec.words, operands, device="cuda", dtype=torch.float32).reshape(got.shape)
    assert str(got.dtype) == dtype
    if dtype == F:
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    else:
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=0, atol=sixteen_bit_atol(expected, dtype))


# 16-bit operands accumulating in float32, as `collage optimize --precision bf16|fp16` writes them: cuDNN may use
# tensor cores here. Products of two 16-bit values are exact in float32, so only the summation order differs
# from PyTorch's float64 computation on the same rounded values.
SIXTEEN_BIT_RTOL, SIXTEEN_BIT_ATOL = 1e-3, 1e-3
R = relax.op


def _rounded(array, dtype):
    return torch.from_numpy(rounded_to(array, dtype).astype(np.float32)).double()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern_name", ["conv2d", "batch_matmul"])
def test_sixteen_bit_operands_accumulate_in_float32_like_pytorch(pm, backends, cuda, pattern_name, dtype):
    target, device = cuda
    rng = np.random.default_rng(3)
    if pattern_name == "conv2d":
        weight = rng.uniform(-1, 1, size=(16, 8, 3, 3)).astype(F)
        shapes = [(2, 8, 10, 10)]

        def make(bb, x):
            return R.nn.conv2d(x, relax.const(rounded_to(weight, dtype)), strides=(2, 2), padding=(1, 1), out_dtype=F)

        def expected_of(x):
            return torch.nn.functional.conv2d(x, _rounded(weight, dtype), stride=2, padding=1)
    else:
        shapes = [(4, 16, 32), (4, 32, 24)]

        def make(bb, a, b):
            return R.matmul(a, b, out_dtype=F)

        def expected_of(a, b):
            return a @ b

    mod = function_module(make, *shapes, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cudnn.{pattern_name}")
    assert candidate is not None, f"cudnn.{pattern_name} does not take {dtype} operands"
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    inputs = [rng.uniform(-1, 1, size=shape).astype(F) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(rounded_to(x, dtype), device) for x in inputs]))
    assert got.dtype == np.float32
    expected = expected_of(*[_rounded(x, dtype) for x in inputs]).numpy()
    np.testing.assert_allclose(got, expected, rtol=SIXTEEN_BIT_RTOL, atol=SIXTEEN_BIT_ATOL)


@pytest.mark.parametrize("pattern_name", ["conv2d_tf32", "conv2d_bias_relu_tf32"])
def test_a_tf32_convolution_matches_float64_within_tf32_rounding(pm, backends, cuda, pattern_name):
    """At --precision tf32 a ResNet-sized 3x3 convolution may run on tensor-core engines that round x and w to
    TF32: within TF32's rounding of exact float64 (576 products per output), whichever engine won the timing."""
    target, device = cuda
    rng = np.random.default_rng(4)
    weight = rng.uniform(-1, 1, size=(64, 64, 3, 3)).astype(F)
    bias = rng.uniform(-1, 1, size=(1, 64, 1, 1)).astype(F)

    def make(bb, x):
        y = bb.emit(R.nn.conv2d(x, relax.const(weight), padding=(1, 1)))
        return R.nn.relu(bb.emit(R.add(y, relax.const(bias)))) if "bias" in pattern_name else y

    mod = function_module(make, (8, 64, 28, 28))
    graph, candidate = whole_candidate(mod, patterns.patterns(tf32=True), f"cudnn.{pattern_name}")
    assert candidate is not None
    vm = relax.VirtualMachine(build(pm, partition_module(graph, [candidate]), backends, target), device)
    x = rng.uniform(-1, 1, size=(8, 64, 28, 28)).astype(F)
    got = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device)))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(), padding=1)
    if "bias" in pattern_name:
        expected = torch.relu(expected + torch.from_numpy(bias).double())
    assert np.max(np.abs(got - expected.numpy())) <= tf32_atol(64 * 9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attention_of_bert_base_size_matches_pytorch_attention(pm, backends, cuda, dtype, causal):
    """BERT-base's attention at batch 2 (12 heads, sequence 128, head size 64), the heads split in place, on cuDNN's
    fused attention against PyTorch's in float32 on the same 16-bit q, k, v. Tolerance: cuDNN rounds the
    probabilities to 16 bits before the product with v (at most one unit in the last place of the largest |v|)
    and rounds its result once (four units of the largest output)."""
    target, device = cuda
    batch, sequence, heads, size = 2, 128, 12, 64
    scale = 1 / np.sqrt(size)
    shape = (batch, sequence, heads, size)
    mod = function_module(attention(dtype, scale, causal_mask(sequence) if causal else None), shape, shape, shape, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), "cudnn.attention")
    assert candidate is not None
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(5)
    q, k, v = (rounded_to(rng.uniform(-2, 2, size=shape).astype(F), dtype) for _ in range(3))
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in (q, k, v)])).astype(np.float64)
    heads_first = [torch.from_numpy(x.astype(F)).cuda().transpose(1, 2) for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *heads_first, is_causal=causal, scale=float(rounded_to(np.float32(scale), dtype))
    )
    expected = expected.double().cpu().numpy()  # (batch, heads, sequence, size): the product with v, as the model's
    last_place = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    atol = last_place * float(np.max(np.abs(v))) + sixteen_bit_atol(expected, dtype)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("form", ["attention_qkv_bshd", "attention_bshd", "attention_qkv"])
def test_attention_reading_a_stacked_qkv_and_writing_in_place_matches_pytorch_attention(pm, backends, cuda, dtype, form):
    """GPT-2's causal attention at batch 2 (12 heads, sequence 128, head size 64): q, k and v read as the three parts
    of one stacked (batch, sequence, 3 * 768) projection (offsets into one tensor) and/or the result written
    transposed back to (batch * sequence, 768) as the output projection reads it. Against PyTorch's attention in
    float32 on the same 16-bit values, with the tolerance of the test above."""
    target, device = cuda
    batch, sequence, heads, size = 2, 128, 12, 64
    scale = 1 / np.sqrt(size)
    stacked = "qkv" in form
    shapes = [(batch, sequence, 3 * heads * size)] if stacked else [(batch, sequence, heads, size)] * 3
    make = attention(dtype, scale, causal_mask(sequence), stacked=stacked, bshd="bshd" in form, heads=heads)
    mod = function_module(make, *shapes, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cudnn.{form}")
    assert candidate is not None
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(8)
    inputs = [rounded_to(rng.uniform(-2, 2, size=shape).astype(F), dtype) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs])).astype(np.float64)
    q, k, v = np.split(inputs[0].reshape(batch, sequence, 3, heads, size), 3, axis=2) if stacked else inputs
    heads_first = [torch.from_numpy(x.reshape(batch, sequence, heads, size).astype(F)).cuda().transpose(1, 2) for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *heads_first, is_causal=True, scale=float(rounded_to(np.float32(scale), dtype))
    )
    if "bshd" in form:
        expected = expected.transpose(1, 2).reshape(batch * sequence, heads * size)
    expected = expected.double().cpu().numpy()
    last_place = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    atol = last_place * float(np.max(np.abs(v))) + sixteen_bit_atol(expected, dtype)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=0, atol=atol)


def test_a_float32_convolution_of_a_models_size_is_exact_float32(pm, backends, cuda):
    """cuDNN's engines for a shape depend on its size, so the small cases above cannot tell an exact float32 engine
    from one that rounds the operands to TF32 at a model's sizes (as its batched products did at GPT-2's:
    patterns.FLOAT32_PRODUCTS). A ResNet-50 3x3 convolution at batch 8: against float64, float32 errs by about 1e-5
    here and TF32 by about 1e-2 (sums of 576 products of values in [-1, 1])."""
    target, device = cuda
    rng = np.random.default_rng(5)
    weight = rng.uniform(-1, 1, size=(64, 64, 3, 3)).astype(F)
    mod = function_module(lambda bb, x: R.nn.conv2d(x, relax.const(weight), padding=(1, 1)), (8, 64, 56, 56))
    graph, candidate = whole_candidate(mod, patterns.patterns(), "cudnn.conv2d")
    vm = relax.VirtualMachine(build(pm, partition_module(graph, [candidate]), backends, target), device)
    x = rng.uniform(-1, 1, size=(8, 64, 56, 56)).astype(F)
    got = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device)))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(), padding=1).numpy()
    error = float(np.max(np.abs(got - expected)))
    assert error <= 5e-4, f"max error {error:.3g} against float64: an engine that rounds float32 (TF32, Winograd?)"
