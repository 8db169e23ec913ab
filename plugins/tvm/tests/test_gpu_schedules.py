"""The TVM plugin's kernels on GPUs: scheduled by the plugin as TVM's pipeline would (dlight), a short row's softmax or
norm with a warp per row (``collage_tvm.gpu_schedules.ShortRows``).

Without a GPU these tests look at the schedules and the CUDA code the build writes; those marked ``gpu`` run the
kernels on one (``--run-gpu``) against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from collage_tvm import gpu_schedules, kernels
from tvm import relax, te, topi

from collage_core.kit import tvm_compat
from collage_core.kit.testing import build, cuda_source, function_module, lower_partitions, partition_module, whole_candidate

R = relax.op


def cuda_target():
    return tvm_compat.make_target({"kind": "cuda", "arch": "sm_90a"})


def softmax_kernel(shape):
    x = te.placeholder(shape, "float32", name="x")
    return te.create_prim_func([x, topi.nn.softmax(x)])


def thread_extents(func) -> dict:
    """The extent of each thread axis ``func``'s loops are bound to."""
    found = {}

    def visit(loop):
        if loop.thread_binding is not None:
            found[loop.thread_binding.thread_tag] = int(loop.extent)

    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, visit), order="post")
    return found


def scheduled_by(rule, func):
    with cuda_target():
        sch = rule.apply(func, cuda_target(), False)
    return None if sch is None else sch.mod["main"]


@pytest.mark.parametrize("shape", [(8, 12, 128, 128), (2, 77, 77), (3, 256), (5, 3)])
def test_a_short_row_gets_a_warp_several_rows_to_a_block(shape):
    scheduled = scheduled_by(gpu_schedules.ShortRows(), softmax_kernel(shape))
    assert scheduled is not None
    assert thread_extents(scheduled) == {
        "blockIdx.x": -(-int(np.prod(shape[:-1])) // gpu_schedules.ROWS_PER_BLOCK),
        "threadIdx.y": gpu_schedules.ROWS_PER_BLOCK,
        "threadIdx.x": gpu_schedules.WARP,
    }


def test_dlights_own_rule_gives_the_same_row_256_threads():
    """What ShortRows is for: GeneralReduction's block for one row of 128."""
    scheduled = scheduled_by(tvm.s_tir.dlight.gpu.GeneralReduction(), softmax_kernel((8, 12, 128, 128)))
    assert thread_extents(scheduled) == {"blockIdx.x": 8 * 12 * 128, "threadIdx.x": 256}


def test_long_symbolic_and_other_kernels_are_left_to_dlights_rules():
    assert scheduled_by(gpu_schedules.ShortRows(), softmax_kernel((4, gpu_schedules.MAX_ROW + 1))) is None
    n = tvm.tirx.Var("n", "int64")
    assert scheduled_by(gpu_schedules.ShortRows(), softmax_kernel((4, n))) is None
    x = te.placeholder((64, 64), "float32")
    elementwise = te.create_prim_func([x, topi.exp(x)])
    assert scheduled_by(gpu_schedules.ShortRows(), elementwise) is None
    total = te.create_prim_func([x, topi.sum(x, axis=-1)])  # a reduction with no elementwise block after it
    assert scheduled_by(gpu_schedules.ShortRows(), total) is None
    # A softmax over the middle axis of a square tensor: its kinds and extents are a short row's, its rows are not.
    square = te.placeholder((2, 64, 64), "float32")
    assert scheduled_by(gpu_schedules.ShortRows(), te.create_prim_func([square, topi.nn.softmax(square, axis=1)])) is None
    assert scheduled_by(gpu_schedules.ShortRows(), te.create_prim_func([square, topi.nn.softmax(square, axis=2)])) is not None


def softmax_then_scale(bb, x):
    return bb.emit(R.multiply(R.nn.softmax(x, axis=-1), relax.const(2.0, "float32")))


def norm_then_relu(bb, x):
    size = tvm_compat.tensor_shape_dtype(x)[0][-1]
    gamma, beta = (relax.const(np.linspace(0.5, 1.5, size, dtype="float32")) for _ in range(2))
    return bb.emit(R.nn.relu(R.nn.layer_norm(x, gamma, beta, axes=[-1])))


def placed_on_tvm(pm, backends, make, shape, pattern_name):
    from collage_tvm import hooks

    mod = function_module(make, shape)
    graph, candidate = whole_candidate(mod, hooks.patterns(cuda_target(), None), pattern_name)
    return partition_module(graph, [candidate])


def test_the_plugin_schedules_its_partitions_kernels_and_the_build_keeps_them(pm, backends):
    placed = placed_on_tvm(pm, backends, softmax_then_scale, (8, 12, 128, 128), "tvm.softmax_elementwise1")
    lowered = lower_partitions(pm, placed, backends, cuda_target())
    ((gvar, kernel),) = [(g, f) for g, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert gvar.name_hint == "collage_tvm_0_fused_softmax_multiply"
    assert int(kernel.attrs["op_pattern"]) == kernels.OPAQUE and bool(kernel.attrs[kernels.SCHEDULED])
    assert thread_extents(kernel)["threadIdx.x"] == gpu_schedules.WARP
    sources = cuda_source(build(pm, placed, backends, cuda_target()).mod)
    assert "collage_tvm_0_fused_softmax_multiply_kernel" in sources and "__shfl_down_sync" in sources


def test_on_the_cpu_the_partition_stays_for_tvms_own_pipeline(pm, backends):
    placed = placed_on_tvm(pm, backends, softmax_then_scale, (2, 16), "tvm.softmax_elementwise1")
    lowered = lower_partitions(pm, placed, backends, tvm_compat.make_target({"kind": "llvm"}))
    assert not any(isinstance(func, tvm.tirx.PrimFunc) for _, func in lowered.functions_items())


def softmax_reference(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def norm_reference(x):
    gamma = np.linspace(0.5, 1.5, x.shape[-1], dtype="float32")
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    return np.maximum((x - mean) / np.sqrt(var + 1e-5) * gamma + gamma, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "make, reference, pattern_name, shape",
    [
        (softmax_then_scale, lambda x: 2 * softmax_reference(x), "tvm.softmax_elementwise1", (8, 12, 128, 128)),
        (softmax_then_scale, lambda x: 2 * softmax_reference(x), "tvm.softmax_elementwise1", (3, 77, 77)),
        (softmax_then_scale, lambda x: 2 * softmax_reference(x), "tvm.softmax_elementwise1", (5, 1)),
        (softmax_then_scale, lambda x: 2 * softmax_reference(x), "tvm.softmax_elementwise1", (6, 257)),
        (norm_then_relu, norm_reference, "tvm.layer_norm_elementwise1", (7, 197, 64)),
    ],
)
def test_short_rows_match_numpy_on_cuda(pm, backends, make, reference, pattern_name, shape):
    placed = placed_on_tvm(pm, backends, make, shape, pattern_name)
    device = tvm.cuda(0)
    vm = relax.VirtualMachine(build(pm, placed, backends, tvm_compat.make_target({"kind": "cuda"})), device)
    x = np.random.default_rng(3).uniform(-4, 4, size=shape).astype("float32")
    got = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(x, device)))
    # float32 sums of at most 257 terms in another order than numpy's, of values near 1: within 1e-5.
    np.testing.assert_allclose(got, reference(x), rtol=1e-5, atol=1e-5)
