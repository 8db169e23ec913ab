"""collage_core.model.rewrites: each rewrite leaves TVM's build computing the same numbers (float32 within the operator
cases' RTOL/ATOL, pads exactly), and leaves the operators the ONNX converter takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import helper
from tvm import relax, topi

from collage_core import tvm_compat
from collage_core.model import rewrites
from collage_core.relax_onnx import support
from collage_core.relax_onnx.operator_cases import F, R, assert_same, random_input
from collage_core.relax_onnx.placement_cases import module

RNG = np.random.default_rng(7)


def run(mod, arrays):
    executable = relax.build(mod, tvm_compat.host_cpu_target())
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return [tvm_compat.to_numpy(vm["main"](*[tvm_compat.to_tensor(a, tvm.cpu()) for a in arrays]))]


def calls(mod) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings if tvm_compat.is_op_call(b.value)]


def op_names(mod) -> list[str]:
    return [tvm_compat.op_name(call) for call in calls(mod)]


# A pooling whose one window covers its input, (input shape, attributes): ceil mode makes the one window in each.
WHOLE_WINDOW_POOLS = [
    ("efficientnet_pooler", (1, 8, 7, 7), dict(op="avg", pool_size=20, strides=20, ceil_mode=True, count_include_pad=True)),
    ("exclude_pad_padded", (1, 3, 5, 6), dict(op="avg", pool_size=7, strides=7, padding=(1, 1, 2, 0), ceil_mode=True)),
    (
        "include_pad_padded",
        (1, 3, 5, 6),
        dict(op="avg", pool_size=7, strides=7, padding=(1, 1, 2, 0), ceil_mode=True, count_include_pad=True),
    ),
    ("kernel_as_input", (2, 4, 5, 6), dict(op="avg", pool_size=(5, 6))),
    ("max_ceil", (1, 3, 5, 6), dict(op="max", pool_size=8, strides=3, padding=(1, 0, 0, 0), ceil_mode=True)),
    ("nhwc", (1, 5, 6, 3), dict(op="avg", pool_size=9, strides=9, ceil_mode=True, layout="NHWC")),
]


def pooling(attributes):
    attributes = dict(attributes)
    op = {"avg": R.nn.avg_pool2d, "max": R.nn.max_pool2d}[attributes.pop("op")]
    return lambda bb, x: op(x, **attributes)


@pytest.mark.parametrize("shape, attributes", [case[1:] for case in WHOLE_WINDOW_POOLS], ids=[case[0] for case in WHOLE_WINDOW_POOLS])
def test_whole_window_pooling_becomes_global_with_the_same_numbers(shape, attributes):
    mod = module(pooling(attributes), (shape, F))
    rewritten = rewrites.global_pooling(mod)
    names = op_names(rewritten)
    assert not {"relax.nn.avg_pool2d", "relax.nn.max_pool2d"} & set(names)
    assert names[0] == {"avg": "relax.mean", "max": "relax.max"}[attributes["op"]] or names == ["relax.sum", "relax.divide"]
    data = random_input(shape, F, RNG)
    assert_same(run(rewritten, [data]), run(mod, [data]))
    assert all(support.supports(call) for call in calls(rewritten))


@pytest.mark.parametrize(
    "attributes",
    [
        dict(op="avg", pool_size=3, strides=2, ceil_mode=True),  # several windows
        dict(op="avg", pool_size=7, padding=(2, 0, 0, 0), ceil_mode=True),  # the padding shifts the window off the end
        dict(op="max", pool_size=3, dilation=3),  # a dilated window skips rows
    ],
    ids=["several_windows", "window_off_the_end", "dilated"],
)
def test_pooling_that_is_not_global_stays(attributes):
    mod = module(pooling(attributes), ((1, 2, 7, 7), F))
    assert tvm_compat.structural_equal(rewrites.global_pooling(mod), mod)


def emit_pad(compute, *arguments):
    return lambda bb, x: bb.emit_te(compute, x, *arguments)


# TOPI kernels as TVM's ONNX importer emits them for Pad and for Conv's auto_pad, and what each becomes.
IMPORTER_PADS = [
    ("asymmetric_zero", emit_pad(topi.nn.pad, [0, 0, 0, 1], [0, 0, 1, 1], 0.0), ["relax.nn.pad"]),
    ("conv_same_one_by_one", emit_pad(topi.nn.pad, [0, 0, 0, 0], [0, 0, 0, 0], 0.0), []),
    ("reflect", emit_pad(topi.nn.mirror_pad, [0, 0, 2, 1], [0, 0, 1, 2], "REFLECT"), ["relax.nn.pad"]),
    ("edge", emit_pad(topi.nn.replicate_pad, [0, 1, 2, 0], [0, 0, 1, 3]), ["relax.nn.pad"]),
]


@pytest.mark.parametrize("make, expected", [case[1:] for case in IMPORTER_PADS], ids=[case[0] for case in IMPORTER_PADS])
def test_importer_pad_kernels_become_nn_pad_with_the_same_numbers(make, expected):
    shape = (1, 3, 5, 6)
    mod = module(make, (shape, F))
    assert op_names(mod) == ["relax.call_tir"]
    rewritten = rewrites.importer_pads(mod)
    assert op_names(rewritten) == expected
    assert all(support.supports(call) for call in calls(rewritten))
    data = random_input(shape, F, RNG)
    np.testing.assert_array_equal(run(rewritten, [data])[0], run(mod, [data])[0])


def test_a_kernel_the_rewrite_does_not_know_stays_and_the_converter_names_it():
    mod = module(emit_pad(topi.nn.pad, [0, 0, 1, 1], [0, 0, 1, 1], -1.0), ((1, 3, 5, 6), F))
    rewritten = rewrites.for_backends(mod)
    (call,) = calls(rewritten)
    assert tvm_compat.op_name(call) == "relax.call_tir"
    assert support.refusal(call) == "relax.call_tir of pad (a TIR function, not an operator) has no ONNX conversion"


def test_an_onnx_model_with_same_padding_and_a_ceil_mode_pooler_converts_whole():
    """TVM's ONNX importer pads each Conv with auto_pad SAME_UPPER by a TOPI kernel, as for EfficientNet's
    TorchScript export, whose pooler is an AveragePool as wide as the input or wider, in ceil mode."""
    weight = RNG.uniform(-1, 1, (4, 3, 3, 3)).astype(F)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("Pad", ["c", "pads"], ["p"], mode="constant"),
        helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[16, 16], strides=[16, 16], ceil_mode=1, count_include_pad=1),
    ]
    graph = helper.make_graph(
        nodes,
        "same_padding",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 9, 10])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 1, 1])],
        initializer=[
            onnx.numpy_helper.from_array(weight, "w"),
            onnx.numpy_helper.from_array(np.array([0, 0, 0, 1, 0, 0, 1, 0], "int64"), "pads"),
        ],
    )
    mod = tvm_compat.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert op_names(mod).count("relax.call_tir") == 2
    rewritten = rewrites.for_backends(mod)
    assert op_names(rewritten) == ["relax.nn.pad", "relax.nn.conv2d", "relax.nn.pad", "relax.mean"]
    assert all(support.supports(call) for call in calls(rewritten))
    data = random_input((1, 3, 9, 10), F, RNG)
    assert_same(run(rewritten, [data]), run(mod, [data]))


def test_a_concatenation_of_one_tensor_becomes_that_tensor_and_one_of_two_stays():
    x = random_input((2, 3, 4), F, RNG)
    lone = module(lambda bb, a: R.nn.relu(bb.emit(R.concat([a], axis=1))), ((2, 3, 4), F))
    rewritten = rewrites.for_backends(lone)
    assert "relax.concat" in op_names(lone) and op_names(rewritten) == ["relax.nn.relu"]
    assert_same(run(rewritten, [x])[0], np.maximum(x, 0))
    pair = module(lambda bb, a: R.concat([a, a], axis=1), ((2, 3, 4), F))
    assert op_names(rewrites.for_backends(pair)) == ["relax.concat"]


def test_a_running_sum_of_booleans_counts_in_int64_as_numpy_does_and_one_of_integers_stays():
    """PyTorch's ``mask.cumsum(-1)`` (GPT-2's positions): TVM's importer keeps the booleans' type, which no backend
    builds; the rewrite counts them in int64. ONNX's CumSum of int32 keeps its type."""
    mask = RNG.integers(0, 2, size=(2, 9)).astype(bool)
    booleans = module(lambda bb, m: R.cumsum(m, axis=-1), ((2, 9), "bool"))
    rewritten = rewrites.for_backends(booleans)
    assert op_names(rewritten) == ["relax.astype", "relax.cumsum"]
    assert tvm_compat.tensor_shape_dtype(rewritten["main"].body.body)[1] == "int64"
    (counted,) = run(rewritten, [mask])
    assert counted.dtype == np.int64 and np.array_equal(counted, np.cumsum(mask, axis=-1))
    integers = module(lambda bb, m: R.cumsum(m, axis=0, exclusive=True), ((2, 9), "int32"))
    assert op_names(rewrites.for_backends(integers)) == ["relax.cumsum"]


def test_a_product_of_operands_scaled_by_numbers_is_scaled_once_after_it_with_the_same_numbers():
    """The exporters' attention scores: Q and K each scaled by d ** -0.25, then K transposed into the product."""
    q, k = random_input((2, 3, 5, 8), F, RNG), random_input((2, 3, 5, 8), F, RNG)
    quarter = np.float32(8**-0.25)

    def scores(bb, a, b):
        scaled_q = bb.emit(R.multiply(a, relax.const(quarter)))
        scaled_k = bb.emit(R.multiply(relax.const(quarter), bb.emit(R.permute_dims(b, [0, 1, 3, 2]))))
        return R.matmul(scaled_q, scaled_k)

    mod = module(scores, ((2, 3, 5, 8), F), ((2, 3, 5, 8), F))
    rewritten = relax.transform.DeadCodeElimination(["main"])(rewrites.for_backends(mod))  # as the import does next
    assert op_names(rewritten) == ["relax.permute_dims", "relax.matmul", "relax.multiply"]
    expected = (q * quarter) @ (np.swapaxes(k, -1, -2) * quarter)
    assert_same(run(rewritten, [q, k]), [expected.astype(np.float32)])
    assert_same(run(rewritten, [q, k]), run(mod, [q, k]))


@pytest.mark.parametrize(
    "scale",
    [
        lambda bb, a: bb.emit(R.multiply(a, a)),  # a tensor, not a number
        lambda bb, a: bb.emit(R.multiply(a, relax.const(np.full((1, 4), 0.5, "float32")))),  # one number broadcast wider
    ],
    ids=["by a tensor", "broadcast wider"],
)
def test_a_product_whose_operand_is_not_scaled_by_one_number_stays(scale):
    mod = module(lambda bb, a, b: R.matmul(scale(bb, a), b), ((4,), F), ((4, 3), F))
    assert op_names(rewrites.for_backends(mod)) == op_names(mod)


def test_a_dense_layer_keeps_the_scale_of_its_input():
    """erf GELU ends in ``* 0.5`` before the next dense layer; libraries fuse the activation, not a scale after the layer."""
    weight = relax.const(RNG.uniform(-1, 1, size=(4, 3)).astype(np.float32))
    mod = module(lambda bb, a: R.matmul(bb.emit(R.multiply(a, relax.const(np.float32(0.5)))), weight), ((2, 4), F))
    assert op_names(rewrites.for_backends(mod)) == ["relax.multiply", "relax.matmul"]
