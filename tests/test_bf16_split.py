"""Float32 products as six bfloat16 ones (``collage_core.build.bf16_split``): the terms TVM computes for a left
operand are numpy's bit for bit, and the six-deep bfloat16 product is at least as close to the exact product as
float32's own. The cuBLAS GPU tests run it on tensor cores (plugins/cublas/tests/test_cublas_kernels.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build import bf16_split


def _stacked_by_tvm(x: np.ndarray, target, device) -> np.ndarray:
    bb = relax.BlockBuilder()
    param = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [param]):
        with bb.dataflow():
            out = bb.emit_output(bf16_split.stacked_terms(param))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(relax.build(bb.get(), target=target), device)
    return tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device)))


def _values(rng, shape) -> np.ndarray:
    """Values over many binades, both signs, with exact zeros and tiny and huge ones."""
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, size=shape))).astype(np.float32)
    x.flat[::17] = 0.0
    x.flat[1::23] = np.float32(3.0e38)
    x.flat[2::29] = np.float32(1.5e-38)
    return x


def test_tvm_lays_a_left_operands_terms_as_numpy_splits_them():
    x = _values(np.random.default_rng(0), (6, 40))
    got = _stacked_by_tvm(x, tvm_compat.host_cpu_target(), tvm.cpu())
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (6, 40 * bf16_split.DEPTH)
    expected = bf16_split.stacked_constant(x, axis=-1, left=True)
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


def test_three_terms_hold_every_bit_of_a_float32():
    """Down to 2^-100 (below, the last term's bits fall under float32's smallest normal: absolute error 2^-130 at most)."""
    x = _values(np.random.default_rng(1), (1000,))
    terms = bf16_split.split_terms(x)
    assert all(t.dtype == ml_dtypes.bfloat16 for t in terms)
    held = sum(t.astype(np.float64) for t in terms)
    normal = np.abs(x) >= 2.0**-100
    np.testing.assert_array_equal(held[normal], x.astype(np.float64)[normal])
    assert np.max(np.abs(held - x)[~normal]) <= 2.0**-130
    assert np.all(np.abs(terms[1].astype(np.float64)) <= 2.0**-8 * np.abs(x)) and np.any(terms[2].astype(np.float32) != 0)


@pytest.mark.parametrize("k", [16, 768, 3072])
def test_the_six_deep_product_is_as_close_to_the_exact_one_as_float32s(k):
    rng = np.random.default_rng(k)
    a = rng.uniform(-1, 1, size=(32, k)).astype(np.float32)
    b = rng.uniform(-1, 1, size=(k, 48)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    left, right = bf16_split.stacked_constant(a, axis=1, left=True), bf16_split.stacked_constant(b, axis=0)
    assert left.shape == (32, 6 * k) and right.shape == (6 * k, 48)
    six_deep = left.astype(np.float64) @ right.astype(np.float64)  # what the tensor cores sum, exactly
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    assert np.max(np.abs(six_deep - exact) / scale) <= 2.0**-23  # the products left out
    one_term = a.astype(ml_dtypes.bfloat16).astype(np.float64) @ b.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert np.max(np.abs(one_term - exact) / scale) > 2.0**-16  # plain bfloat16 is far off: the test can tell


def test_a_pattern_name_says_whether_it_splits():
    assert bf16_split.computes_bf16x6("cublas.dense_bias_bf16x6")
    assert not bf16_split.computes_bf16x6("cublas.dense_bias") and not bf16_split.computes_bf16x6("cublas.dense_tf32")
