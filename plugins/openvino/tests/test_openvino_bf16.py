"""bfloat16 partitions (``collage optimize --precision bf16``) on OpenVINO: taken only where the CPU computes bf16
fast, converted exactly (16-bit products cast to float32 before ONNX's same-typed MatMul), compiled with OpenVINO's
bf16 inference precision, and read and written in place across bfloat16 region boundaries."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from collage_openvino import hooks, runtime
from tvm import relax

from collage_core.kit import RelaxGraph, engine_lowering, engine_operators, enumerate_candidates, relax_to_onnx, tvm_compat
from collage_core.kit.testing import build, contribute_patterns, precision, rounded_to
from collage_core.kit.testing.placement_cases import module, place, run_vm

TARGET = tvm_compat.host_cpu_target()
R = relax.op
BF16, F = "bfloat16", "float32"
FAST_BF16 = hooks.sixteen_bit() == frozenset({BF16})
RNG = np.random.default_rng(5)
WEIGHT = RNG.uniform(-0.5, 0.5, size=(32, 48)).astype(F)
BIAS = RNG.uniform(-1, 1, size=(48,)).astype(F)
# One bfloat16 rounding of results of order 1 (2^-8), twice over: OpenVINO and TVM may round at different steps.
RTOL, ATOL = 2e-2, 2e-2


def bf16(array):
    return rounded_to(array, "bfloat16")


def mixed_dense(bb, x):
    """As TVM's mixed-precision pass writes a dense layer: bf16 operands, float32 accumulation, bf16 epilogue."""
    product = bb.emit(R.matmul(x, relax.const(bf16(WEIGHT)), out_dtype=F))
    shifted = bb.emit(R.add(bb.emit(R.astype(product, BF16)), relax.const(bf16(BIAS))))
    return R.multiply(shifted, bb.emit(R.erf(shifted)))


@pytest.mark.skipif(not FAST_BF16, reason="this CPU has no fast bfloat16 (AMX or AVX512-BF16): OpenVINO refuses bf16 here")
def test_a_bfloat16_region_with_bfloat16_boundaries_runs_on_openvino_in_bf16_and_matches_tvm(pm, backends):
    mod = module(mixed_dense, ((4, 32), BF16))
    graph, placed = place(mod, "openvino", set(range(4)))
    x = bf16(RNG.uniform(-1, 1, size=(4, 32)))
    got = run_vm(build(pm, placed, backends, TARGET), x)  # input and output bfloat16: read and written through uint16 views
    expected = run_vm(build(pm, place(mod, "tvm", set(range(4)))[1], backends, TARGET), x)
    assert str(got.dtype) == BF16
    got, expected = got.astype(np.float32), expected.astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL * np.abs(expected).max())
    serialized, options = blob_of(hooks.lower_function(mod["main"], "m"))
    assert runtime.inference_precision(options) == "bf16"
    onnx_model = onnx.load_from_string(serialized)
    # float32 inside, OpenVINO's bf16 policy deciding what runs in bf16: bfloat16 only where the region's
    # input enters and its output leaves, and TVM's casts around the product are identities.
    casts = [node for node in onnx_model.graph.node if node.op_type == "Cast"]
    assert [c.input[0] for c in casts][:1] == [relax_to_onnx.input_name(0)] and casts[-1].output[0] == relax_to_onnx.output_name(0)
    assert len(casts) == 2
    exact = relax_to_onnx.convert(mod["main"], "m", frozenset({BF16}))  # as TVM's pass wrote it, products widened exactly
    assert len([node for node in exact.graph.node if node.op_type == "Cast"]) > 2


def blob_of(lowered):
    (binding,) = lowered.body.blocks[0].bindings
    return engine_lowering.unpack_blob(tvm_compat.constant_array(binding.value.args[1].fields[0]))


def test_float32_partitions_stay_exact_in_f32():
    float32 = module(lambda bb, x: R.matmul(x, relax.const(WEIGHT)), ((4, 32), F))
    _, options = blob_of(hooks.lower_function(float32["main"], "m"))
    assert runtime.inference_precision(options) == "f32"


def test_bfloat16_is_refused_where_the_cpu_has_no_fast_bfloat16_and_by_backends_that_did_not_opt_in(pm, backends, monkeypatch):
    graph = RelaxGraph.from_function(module(mixed_dense, ((4, 32), BF16))["main"])
    product = graph.graph.ops.index("relax.matmul")
    call = next(
        b.value
        for b in module(mixed_dense, ((4, 32), BF16))["main"].body.blocks[0].bindings
        if tvm_compat.op_name(b.value) == "relax.matmul"
    )
    assert engine_operators.refusal(call) == "relax.matmul mixes bfloat16, float32"
    assert engine_operators.refusal(call, frozenset({BF16})) is None
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})
    refused: list = []
    candidates = enumerate_candidates(graph, contribute_patterns(pm, backends["openvino"], TARGET), refused)
    assert not any(product in c.nodes for c in candidates)
    assert any("bfloat16" in r.reason for r in refused)
