"""The ONNX converter, operator by operator: each case converted, run by ONNX Runtime and compared
with TVM's own build (``collage_core.relax_onnx.operator_cases`` says how closely), and each
refusal refused."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime
import pytest

from collage_core import tvm_compat
from collage_core.relax_onnx import converter, support
from collage_core.relax_onnx.operator_cases import (
    ATOL,
    CASES,
    NCHW,
    REFUSED,
    ROWS,
    RTOL,
    WEIGHT,
    F,
    R,
    assert_same,
    const,
    function,
    pool_configurations,
    random_input,
    run_tvm,
)


def run_onnx(func, arrays):
    model = converter.convert(func)
    onnx.checker.check_model(model, full_check=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {converter.input_name(i): array for i, array in enumerate(arrays)}
    return session.run(None, feeds)


@pytest.mark.parametrize("make, specs, kind", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_operator_matches_tvm(make, specs, kind):
    func = function(make, *specs)
    rng = np.random.default_rng(1)
    arrays = [random_input(shape, dtype, rng, kind) for shape, dtype in specs]
    assert_same(run_onnx(func, arrays), run_tvm(func, arrays))


def test_every_supported_operator_is_converted_and_tested():
    assert set(converter.CONVERTERS) == set(support.SUPPORTED_OPS)
    tested = {
        tvm_compat.op_name(binding.value)
        for _, make, specs, _ in CASES
        for binding in function(make, *specs).body.blocks[0].bindings
        if tvm_compat.is_op_call(binding.value)
    }
    assert set(support.SUPPORTED_OPS) - tested == set()


def test_model_is_opset_17_with_constants_as_initializers():
    func = function(lambda x: R.nn.conv2d(x, const(WEIGHT)), NCHW)
    model = converter.convert(func, "conv")
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input_0"]
    assert [o.name for o in model.graph.output] == ["output_0"]
    (weight,) = model.graph.initializer
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), WEIGHT)


def test_gelu_is_the_erf_formula_without_a_gelu_node():
    model = converter.convert(function(R.nn.gelu, ROWS))
    assert {node.op_type for node in model.graph.node} == {"Mul", "Erf", "Add", "Identity"}
    x = np.linspace(-3, 3, 64, dtype=F).reshape(4, 16)
    expected = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(run_onnx(function(R.nn.gelu, ROWS), [x])[0], expected, rtol=RTOL, atol=ATOL)


def test_pooling_is_refused_or_matches_tvm():
    accepted = 0
    for config in pool_configurations(60):
        op, size = config.pop("op"), config.pop("size")
        func = function(lambda x: op(x, **config), ((1, 2, *size), F))
        if not support.supports(func.body.blocks[0].bindings[0].value):
            continue
        accepted += 1
        data = random_input((1, 2, *size), F, np.random.default_rng(accepted))
        assert_same(run_onnx(func, [data]), run_tvm(func, [data]))
    assert accepted >= 40


@pytest.mark.parametrize("make, specs, reason", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_unsupported_call_is_refused_and_not_converted(make, specs, reason):
    func = function(make, *specs)
    call = func.body.blocks[0].bindings[-1].value
    assert not support.supports(call)
    assert reason in support.refusal(call)
    with pytest.raises(converter.UnsupportedError, match=reason):
        converter.convert(func)


def _nodes(make, *specs):
    return [
        (node.op_type, {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
        for node in converter.convert(function(make, *specs)).graph.node
        if node.op_type != "Identity"
    ]


def test_ceil_mode_reaches_onnx_as_end_padding_and_count_include_pad_as_a_pad():
    # Runtimes disagree on ceil mode's last window and on what it counts; floor mode over explicit zeros does not.
    (pad, _), (pool, attributes) = _nodes(
        lambda x: R.nn.avg_pool2d(x, 3, strides=2, padding=(1, 0, 2, 1), ceil_mode=True, count_include_pad=True), ((1, 4, 9, 10), F)
    )
    assert (pad, pool) == ("Pad", "AveragePool")
    assert attributes["ceil_mode"] == 0 and attributes["count_include_pad"] == 0
    assert attributes["pads"] == [0, 0, 0, 0]  # the windows reach no further than the padding (9 + 1 + 1 rows)


def test_a_window_over_the_whole_input_is_a_global_pooling():
    # OpenVINO refuses an AveragePool wider than its input (EfficientNet's pooler).
    assert _nodes(lambda x: R.nn.avg_pool2d(x, 12, strides=12, ceil_mode=True, count_include_pad=True), ((1, 4, 9, 10), F)) == [
        ("GlobalAveragePool", {})
    ]


def test_nearest_resize_rounding_halves_to_even_is_taken_where_no_coordinate_is_a_half():
    ((op, attributes),) = _nodes(
        lambda x: R.image.resize2d(x, (4, 3), method="nearest_neighbor", coordinate_transformation_mode="align_corners"), ((1, 3, 7, 5), F)
    )
    assert (op, attributes["nearest_mode"], attributes["coordinate_transformation_mode"]) == (
        "Resize",
        b"round_prefer_floor",
        b"align_corners",
    )
