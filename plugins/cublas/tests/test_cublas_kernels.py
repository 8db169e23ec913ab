"""Each cuBLAS pattern, lowered to cuBLASLt, built into a TVM executable for CUDA and run on the GPU, against PyTorch on CUDA.

Marked ``gpu`` (run with ``--run-gpu`` on a machine with an NVIDIA GPU; scripts/gpu-tests.sh).
Every pattern's case (``cublas_cases.case``) is placed whole on cuBLAS, built the way Collage
builds placements and run on Relax's VM; PyTorch computes the same problem on CUDA in float32
with TF32 off (``cublas_cases.reference``). Tolerances: float32 sums of at most a few hundred
products, summed in different orders (RTOL, ATOL).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from collage_cublas import library, lowering, patterns, specs
from cublas_cases import reference
from tvm import relax

from collage_core.kit import Group, tvm_compat
from collage_core.kit.testing import (
    EXACT_FLOAT32_ATOL,
    build,
    function_module,
    lower_partitions,
    operand_arrays,
    partition_module,
    rounded_to,
    sixteen_bit_atol,
    tf32_atol,
    whole_candidate,
    widened_residual_case,
)
from collage_core.kit.testing import product_case as case

pytestmark = pytest.mark.gpu
R = relax.op
RTOL, ATOL = 1e-4, 1e-4
F = "float32"
# the `_f32_add` forms exist only at 16 bits: test_a_sixteen_bit_projection_joining_a_float32_residual_matches_pytorch
PATTERN_NAMES = sorted(p.name.split(".", 1)[1] for p in patterns.patterns() if "_f32_" not in p.name)


@pytest.fixture(scope="module")
def cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return tvm_compat.make_target({"kind": "cuda"}), tvm.cuda(0)


@pytest.mark.parametrize("pattern_name", PATTERN_NAMES)
def test_kernel_matches_pytorch_on_cuda(pm, backends, cuda, pattern_name):
    target, device = cuda
    make, shapes = case(pattern_name)
    mod = function_module(make, *shapes)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cublas.{pattern_name}")
    placed = partition_module(graph, [candidate])
    lowered_text = str(lower_partitions(pm, placed, backends, target))
    assert lowering.RUN_FUNCTION in lowered_text  # the partition really runs on cuBLASLt
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, size=shape).astype(F) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    standalone = graph.standalone_module(candidate.nodes)["main"]
    spec = specs.recognize(Group.from_function(standalone))
    operands = operand_arrays(spec.operands, mod["main"].params, inputs)  # the cut-out function orders its own
    expected = reference(spec.words, operands, got.size, device="cuda", dtype=torch.float32).reshape(got.shape)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def _run_tf32(pm, backends, cuda, mod, pattern_name, inputs):
    """The output of ``mod`` with its one ``_tf32`` candidate placed on cuBLAS, and what float64 makes of its spec."""
    target, device = cuda
    graph, candidate = whole_candidate(mod, patterns.patterns(tf32=True), f"cublas.{pattern_name}_tf32")
    vm = relax.VirtualMachine(build(pm, partition_module(graph, [candidate]), backends, target), device)
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    spec = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]), tf32=True)
    assert spec.words[-2] == specs.TF32_OPERANDS
    expected = reference(spec.words, operand_arrays(spec.operands, mod["main"].params, inputs), got.size).reshape(got.shape)
    return got, expected, spec


@pytest.mark.parametrize(
    "pattern_name", ["dense_bias_add_relu", "dense_t_bias", "dense_bias_gelu", "batch_matmul_tt_scale", "batch_matmul"]
)
def test_a_tf32_kernel_matches_float64_within_tf32_rounding(pm, backends, cuda, pattern_name):
    """At --precision tf32 the ``_tf32`` pattern runs cuBLASLt with CUBLAS_COMPUTE_32F_FAST_TF32 (which may still
    pick an exact kernel for a problem this small): within TF32's rounding of exact float64."""
    make, shapes = case(pattern_name)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, size=shape).astype(F) for shape in shapes]
    got, expected, spec = _run_tf32(pm, backends, cuda, function_module(make, *shapes), pattern_name, inputs)
    assert np.max(np.abs(got - expected)) <= tf32_atol(spec.words[3])


def test_a_large_tf32_product_runs_on_tensor_cores_that_round_its_operands(pm, backends, cuda):
    """A BERT-sized dense layer: cuBLASLt takes a TF32 tensor-core kernel, whose error is TF32's, far above float32's."""
    rng = np.random.default_rng(2)
    weight = rng.uniform(-1, 1, size=(768, 1024)).astype(F)
    mod = function_module(lambda bb, x: R.matmul(x, relax.const(weight)), (256, 768))
    x = rng.uniform(-1, 1, size=(256, 768)).astype(F)
    got, expected, _ = _run_tf32(pm, backends, cuda, mod, "dense", [x])
    error = np.max(np.abs(got - expected))
    assert 100 * EXACT_FLOAT32_ATOL < error <= tf32_atol(768), f"max error {error:.3g}"


def _run_bf16x6(pm, backends, cuda, mod, pattern_name, inputs):
    """The output of ``mod`` with its one ``_bf16x6`` candidate placed on cuBLAS, and the exact float64 product."""
    target, device = cuda
    graph, candidate = whole_candidate(mod, patterns.patterns(bf16x6=True), f"cublas.{pattern_name}_bf16x6")
    placed = partition_module(graph, [candidate])
    lowered = str(lower_partitions(pm, placed, backends, target))
    assert lowering.RUN_FUNCTION in lowered and '"bfloat16"' in lowered  # the split runs before the cuBLASLt call
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    exact = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]))
    expected = reference(exact.words, operand_arrays(exact.operands, mod["main"].params, inputs), got.size).reshape(got.shape)
    return got, expected


@pytest.mark.parametrize("pattern_name", ["dense", "dense_bias", "dense_bias_gelu", "dense_bias_add_relu", "dense_bias_reshape_relu"])
def test_a_bf16x6_kernel_matches_float64_to_float32s_accuracy(pm, backends, cuda, pattern_name):
    """A float32 product run as six bfloat16 ones on the tensor cores (its left operand split by TVM's kernel, its
    weight at build time): as close to exact float64 as a float32 kernel."""
    make, shapes = case(pattern_name)
    rng = np.random.default_rng(3)
    inputs = [rng.uniform(-1, 1, size=shape).astype(F) for shape in shapes]
    got, expected = _run_bf16x6(pm, backends, cuda, function_module(make, *shapes), pattern_name, inputs)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=EXACT_FLOAT32_ATOL)


def test_a_large_bf16x6_product_is_close_to_float32_where_tf32_is_not(pm, backends, cuda):
    """GPT-2's MLP at batch 8: the bf16x6 kernel's error against float64 is within 4x cuBLAS's float32 kernel's (the
    tensor cores accumulate by truncation) and under a tenth of TF32's."""
    rng = np.random.default_rng(4)
    weight = rng.uniform(-1, 1, size=(768, 3072)).astype(F)
    mod = function_module(lambda bb, x: R.matmul(x, relax.const(weight)), (1024, 768))
    x = rng.uniform(-1, 1, size=(1024, 768)).astype(F)
    got, expected = _run_bf16x6(pm, backends, cuda, mod, "dense", [x])
    errors = {"bf16x6": np.max(np.abs(got - expected))}
    for name, tf32 in (("float32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        errors[name] = np.max(np.abs((torch.from_numpy(x).cuda() @ torch.from_numpy(weight).cuda()).cpu().numpy() - expected))
    torch.backends.cuda.matmul.allow_tf32 = False
    shown = ", ".join(f"{name} {error:.3g}" for name, error in errors.items())
    assert errors["bf16x6"] <= 4 * errors["float32"] and errors["bf16x6"] <= errors["tf32"] / 10, shown


# 16-bit operands accumulating in float32, as `collage optimize --precision bf16|fp16` writes them. Products of
# two 16-bit values are exact in float32, so only the summation order differs from PyTorch's float64 product of
# the same rounded values.
SIXTEEN_BIT_RTOL, SIXTEEN_BIT_ATOL = 1e-3, 1e-3


def _sixteen_bit_case(pattern_name: str, dtype: str, rng):
    if pattern_name == "dense":
        weight = rng.uniform(-1, 1, size=(24, 40)).astype(F)
        make = lambda bb, x: R.matmul(x, relax.const(rounded_to(weight, dtype)), out_dtype=F)  # noqa: E731
        return make, [(2, 8, 24)], lambda x: x @ torch.from_numpy(weight).to(_torch(dtype)).double()
    make = lambda bb, q, k: R.matmul(
        bb.emit(R.permute_dims(q, [0, 2, 1, 3])),  # noqa: E731
        bb.emit(R.permute_dims(k, [0, 2, 3, 1])),
        out_dtype=F,
    )
    return make, [(2, 16, 4, 8), (2, 16, 4, 8)], lambda q, k: q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1)


def _torch(dtype):
    return torch.bfloat16 if dtype == "bfloat16" else torch.float16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern_name", ["dense", "batch_matmul_tt"])
def test_sixteen_bit_operands_accumulate_in_float32_like_pytorch(pm, backends, cuda, pattern_name, dtype):
    target, device = cuda
    rng = np.random.default_rng(2)
    make, shapes, expected_of = _sixteen_bit_case(pattern_name, dtype, rng)
    mod = function_module(make, *shapes, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cublas.{pattern_name}")
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    inputs = [rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    assert got.dtype == np.float32
    rounded = [torch.from_numpy(x.astype(np.float32)).double() for x in inputs]
    expected = expected_of(*rounded).numpy()
    np.testing.assert_allclose(got, expected, rtol=SIXTEEN_BIT_RTOL, atol=SIXTEEN_BIT_ATOL)


# With 16-bit operands the product's float32 result is cast to 16 bits before the epilogue (as TVM's mixed-precision
# pass writes it): cuBLASLt then writes 16 bits, computing the epilogue in float32 and rounding once, where PyTorch's
# float32 result is rounded once too; the two may round apart by a unit in the last place (``sixteen_bit_atol``).
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern_name", ["dense_bias_add_relu", "dense_t_bias", "dense_bias_reshape_gelu", "batch_matmul_tt_scale"])
def test_a_product_cast_to_sixteen_bits_writes_sixteen_bits_like_pytorch(pm, backends, cuda, pattern_name, dtype):
    target, device = cuda
    make, shapes = case(pattern_name, cast_to=dtype)
    mod = function_module(make, *shapes, dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), f"cublas.{pattern_name}")
    assert candidate is not None, f"cublas.{pattern_name} does not take the cast to {dtype}"
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(4)
    inputs = [rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype) for shape in shapes]
    got = tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(x, device) for x in inputs]))
    assert str(got.dtype) == dtype
    standalone = graph.standalone_module(candidate.nodes)["main"]
    spec = specs.recognize(Group.from_function(standalone))
    operands = operand_arrays(spec.operands, mod["main"].params, inputs)
    expected = reference(spec.words, operands, got.size, device="cuda", dtype=torch.float32).reshape(got.shape)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=0, atol=sixteen_bit_atol(expected, dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_weight_of_odd_width_read_from_an_aligned_copy_matches_pytorch(pm, backends, cuda, dtype):
    """A language-model head's shape (a vocabulary of odd size): cuBLASLt reads the weight stored transposed, its
    rows 16 bytes apart."""
    target, device = cuda
    rng = np.random.default_rng(5)
    weight = rounded_to(rng.uniform(-1, 1, size=(768, 1001)).astype(F), dtype)
    mod = function_module(lambda bb, x: R.matmul(x, relax.const(weight), out_dtype=F), (64, 768), dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), "cublas.dense")
    spec = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]), aligned=True)
    assert spec.words[4] == 1 and spec.words[7] * weight.itemsize % specs.ALIGNMENT_BYTES == 0  # transposed, aligned
    vm = relax.VirtualMachine(build(pm, partition_module(graph, [candidate]), backends, target), device)
    x = rounded_to(rng.uniform(-1, 1, size=(64, 768)).astype(F), dtype)
    got = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device)))
    expected = torch.from_numpy(x.astype(np.float32)).double() @ torch.from_numpy(weight.astype(np.float32)).double()
    np.testing.assert_allclose(got, expected.numpy(), rtol=SIXTEEN_BIT_RTOL, atol=SIXTEEN_BIT_ATOL * 768**0.5)


@pytest.mark.parametrize("dtype, out_dtype", [("bfloat16", F), (F, F), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("route", [0, 1, 2], ids=["in-place", "padded-memcpy", "padded-transform"])
def test_an_output_of_odd_width_written_in_place_or_through_a_padded_buffer_matches_pytorch(cuda, dtype, out_dtype, route):
    """GPT-2's logits: rows of 1001 columns are not 16 bytes apart (in float32 or 16 bits). Written in place
    (cuBLASLt's alignment-1 kernels) or, with the weight's zero rows, to a buffer of rows 1008 elements apart then
    copied into place (by cudaMemcpy2DAsync or by cublasLtMatrixTransform), the product is the same; so is the
    one tuning picks (its route and algorithm, split K among the candidates)."""
    _, device = cuda
    library.load()
    rng = np.random.default_rng(6)
    weight = rounded_to(rng.uniform(-1, 1, size=(768, 1001)).astype(F), dtype)

    def make(bb, x):
        product = R.matmul(x, relax.const(weight), out_dtype=F)
        return product if out_dtype == F else R.astype(bb.emit(product), out_dtype)

    mod = function_module(make, (64, 768), dtype=dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), "cublas.dense")
    spec = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]), aligned=True)
    assert spec.words[21] == 1008  # the padded routes compute the weight's zero rows too
    algorithm_words = int(tvm.get_global_func("collage_cublas.algo_words")())
    unfit_algorithm = (0,) * (algorithm_words - 1)  # not one cuBLASLt accepts: the runtime takes its heuristic choice
    tuned = np.frombuffer(bytes(tvm.get_global_func(lowering.TUNE_FUNCTION)(specs.as_text(spec.array()))), dtype="<i8")
    assert len(tuned) == algorithm_words and tuned[0] in (0, 1, 2)  # the route tuning chose, then its algorithm
    x = rounded_to(rng.uniform(-1, 1, size=(64, 768)).astype(F), dtype)
    stored_weight = tvm_compat.constant_array(spec.operands[0])
    expected = (torch.from_numpy(x.astype(np.float32)).double() @ torch.from_numpy(weight.astype(np.float32)).double()).numpy()
    for words in ((route, *unfit_algorithm), tuple(int(word) for word in tuned)):
        out = tvm_compat.to_tensor(rounded_to(np.full((64, 1001), np.nan, dtype=F), out_dtype), device)
        run = tvm.get_global_func(lowering.RUN_FUNCTION)
        run(specs.as_text(spec.array(words)), tvm_compat.to_tensor(stored_weight, device), tvm_compat.to_tensor(x, device), out)
        got = tvm_compat.to_numpy(out).astype(np.float64)
        if out_dtype == F:
            np.testing.assert_allclose(got, expected, rtol=SIXTEEN_BIT_RTOL, atol=SIXTEEN_BIT_ATOL * 768**0.5)
        else:
            np.testing.assert_allclose(got, expected, rtol=0, atol=sixteen_bit_atol(expected, out_dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_sixteen_bit_projection_joining_a_float32_residual_matches_pytorch(pm, backends, cuda, dtype):
    """GPT-2's projection at 16 bits (product cast to 16 bits, bias, reshape, cast back, float32 residual) as one
    cuBLASLt call writing float32: within the 16-bit rounding the kernel skips of PyTorch's float64 answer."""
    target, device = cuda
    mod = widened_residual_case("dense_bias_reshape_f32_add", dtype)
    graph, candidate = whole_candidate(mod, patterns.patterns(), "cublas.dense_bias_reshape_f32_add")
    placed = partition_module(graph, [candidate])
    assert lowering.RUN_FUNCTION in str(lower_partitions(pm, placed, backends, target))
    vm = relax.VirtualMachine(build(pm, placed, backends, target), device)
    rng = np.random.default_rng(7)
    x = rounded_to(rng.uniform(-1, 1, size=(16, 24)).astype(F), dtype)
    residual = rng.uniform(-1, 1, size=(1, 16, 40)).astype(F)
    got = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device), tvm_compat.to_tensor(residual, device)))
    assert str(got.dtype) == F
    spec = specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"]))
    weight, bias = (tvm_compat.constant_array(o).astype(np.float64) for o in spec.operands[::2][:2])
    product = torch.from_numpy(x.astype(np.float64)) @ torch.from_numpy(weight)
    expected = (product.numpy() + bias).reshape(1, 16, 40) + residual
    np.testing.assert_allclose(got, expected, rtol=0, atol=sixteen_bit_atol(expected, dtype))
