"""One small Relax function per operator the ONNX converter takes, and per refusal: the numerics
cases every backend that runs converted ONNX models is tested on.

TVM's build of the same function is the reference: it is what Relax means. A backend's test runs
each of :data:`CASES` through its own runtime and compares with :func:`run_tvm` by
:func:`assert_same`: integer, boolean and data-movement results must be equal; float32 results
agree within RTOL/ATOL (a few float32 roundings of values near 1; the transcendental functions are
polynomial approximations in every runtime, a few ulp apart). :data:`REFUSED` holds calls the
converter must refuse, each with words its reason contains.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat

R = relax.op
RTOL, ATOL = 1e-5, 1e-5
F = "float32"


def function(make, *specs) -> relax.Function:
    """A one-block function over parameters of ``specs`` (shape, dtype) whose result is ``make(*params)``."""
    params = [relax.Var(f"p{i}", relax.TensorType(shape, dtype)) for i, (shape, dtype) in enumerate(specs)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            result = make(*params)
            if isinstance(result, (list, tuple)):
                outputs = [bb.emit(expr) for expr in result]
                output = bb.emit_output(relax.Tuple(outputs))
            else:
                output = bb.emit_output(result)
        bb.emit_func_output(output)
    return bb.get()["main"]


def random_input(shape, dtype, rng, kind="any"):
    """Random values of a kind: any, positive, ties (equal values happen) or nan."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("int"):
        return rng.integers(0, 4, size=shape).astype(dtype)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, size=shape).astype(dtype)
    if kind == "ties":  # comparisons: equal values happen
        return rng.integers(-2, 3, size=shape).astype(dtype)
    if kind == "nan":  # isnan: about a third of the values are NaN
        values = rng.uniform(-2.0, 2.0, size=shape).astype(dtype)
        return np.where(rng.uniform(size=shape) < 0.3, np.nan, values).astype(dtype)
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)


def run_tvm(func, arrays):
    """``func``'s results on ``arrays``, built by TVM for this CPU."""
    device = tvm.cpu(0)
    executable = relax.build(tvm.IRModule({"main": func}), tvm_compat.host_cpu_target())
    result = relax.VirtualMachine(executable, device)["main"](*[tvm_compat.to_tensor(a, device) for a in arrays])
    results = list(result) if isinstance(result, tvm.ir.Array) or type(result).__name__ == "Array" else [result]
    return [tvm_compat.to_numpy(r) for r in results]


def assert_same(actual, expected):
    """Equal shapes and dtypes; floats within RTOL/ATOL, everything else exactly equal."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(got, want)


def const(array):
    return relax.const(np.asarray(array))


RNG = np.random.default_rng(0)
WEIGHT = RNG.uniform(-1, 1, size=(8, 3, 3, 3)).astype(F)
GROUPED_WEIGHT = RNG.uniform(-1, 1, size=(8, 2, 3, 3)).astype(F)
GAMMA, BETA = RNG.uniform(0.5, 1.5, size=(16,)).astype(F), RNG.uniform(-1, 1, size=(16,)).astype(F)
NCHW = ((2, 3, 9, 9), F)
NCHW4 = ((1, 4, 9, 10), F)
ROWS = ((4, 16), F)

# (id, make, input specs (shape, dtype), input kind)
CASES = [
    ("conv2d", lambda x: R.nn.conv2d(x, const(WEIGHT)), [NCHW], "any"),
    ("conv2d_strided_padded", lambda x: R.nn.conv2d(x, const(WEIGHT), strides=2, padding=(1, 0, 2, 1)), [NCHW], "any"),
    ("conv2d_dilated", lambda x: R.nn.conv2d(x, const(WEIGHT), dilation=2, padding=2), [NCHW], "any"),
    ("conv2d_grouped", lambda x: R.nn.conv2d(x, const(GROUPED_WEIGHT), groups=2, padding=1), [NCHW4], "any"),
    ("matmul", R.matmul, [((4, 8), F), ((8, 5), F)], "any"),
    ("matmul_batched_broadcast", R.matmul, [((2, 3, 4, 8), F), ((3, 8, 5), F)], "any"),
    ("matmul_vector", R.matmul, [((8,), F), ((2, 8, 5), F)], "any"),
    ("add", R.add, [((2, 3, 4), F), ((3, 1), F)], "any"),
    ("add_int64", R.add, [((2, 3), "int64"), ((3,), "int64")], "any"),
    ("subtract", R.subtract, [((2, 3), F), ((2, 3), F)], "any"),
    ("multiply", R.multiply, [((2, 3), F), ((1, 3), F)], "any"),
    ("multiply_int64", R.multiply, [((2, 3), "int64"), ((2, 3), "int64")], "any"),
    ("divide", R.divide, [((2, 3), F), ((2, 3), F)], "positive"),
    ("power", R.power, [((2, 3), F), ((2, 3), F)], "positive"),
    ("power_const", lambda x: R.power(x, relax.const(2.0, F)), [((2, 3), F)], "any"),
    ("maximum", R.maximum, [((2, 3), F), ((3,), F)], "any"),
    ("minimum", R.minimum, [((2, 3), "int64"), ((2, 3), "int64")], "any"),
    ("relu", R.nn.relu, [ROWS], "any"),
    ("gelu", R.nn.gelu, [ROWS], "any"),
    ("gelu_tanh", R.nn.gelu_tanh, [ROWS], "any"),
    ("silu", R.nn.silu, [ROWS], "any"),
    ("sigmoid", R.sigmoid, [ROWS], "any"),
    ("tanh", R.tanh, [ROWS], "any"),
    ("erf", R.erf, [ROWS], "any"),
    ("sqrt", R.sqrt, [ROWS], "positive"),
    ("rsqrt", R.rsqrt, [ROWS], "positive"),
    ("exp", R.exp, [ROWS], "any"),
    ("log", R.log, [ROWS], "positive"),
    ("negative", R.negative, [ROWS], "any"),
    ("abs", R.abs, [ROWS], "any"),
    ("clip", lambda x: R.clip(x, 0.0, 6.0), [ROWS], "any"),
    ("clip_int64", lambda x: R.clip(x, 1, 2), [((4, 5), "int64")], "any"),
    ("less", R.less, [((2, 3), F), ((3,), F)], "ties"),
    ("less_equal", R.less_equal, [((2, 3), F), ((2, 3), F)], "ties"),
    ("greater", R.greater, [((2, 3), "int64"), ((2, 3), "int64")], "any"),
    ("greater_equal", R.greater_equal, [((2, 3), F), ((2, 3), F)], "ties"),
    ("equal", R.equal, [((2, 3), "int64"), ((2, 3), "int64")], "any"),
    ("not_equal", R.not_equal, [((2, 3), F), ((2, 3), F)], "ties"),
    ("where", R.where, [((2, 3), "bool"), ((2, 3), F), ((3,), F)], "any"),
    ("where_int64", R.where, [((2, 3), "bool"), ((2, 3), "int64"), ((2, 3), "int64")], "any"),
    ("max_pool2d", lambda x: R.nn.max_pool2d(x, 3, strides=2, padding=1), [NCHW], "any"),
    ("max_pool2d_ceil_dilated", lambda x: R.nn.max_pool2d(x, 2, strides=2, dilation=2, ceil_mode=True), [NCHW4], "any"),
    ("avg_pool2d", lambda x: R.nn.avg_pool2d(x, 3, strides=2, padding=1), [NCHW], "any"),
    ("avg_pool2d_include_pad", lambda x: R.nn.avg_pool2d(x, 3, strides=2, padding=1, count_include_pad=True), [NCHW], "any"),
    ("avg_pool2d_ceil", lambda x: R.nn.avg_pool2d(x, 2, strides=2, ceil_mode=True), [NCHW4], "any"),
    # Ceil mode adds a window that overhangs the input: Relax counts the explicit padding, never the overhang.
    ("avg_pool2d_ceil_include_pad", lambda x: R.nn.avg_pool2d(x, 2, strides=2, ceil_mode=True, count_include_pad=True), [NCHW4], "any"),
    (
        "avg_pool2d_ceil_include_pad_padded",
        lambda x: R.nn.avg_pool2d(x, 3, strides=2, padding=(1, 0, 2, 1), ceil_mode=True, count_include_pad=True),
        [NCHW4],
        "any",
    ),
    ("max_pool2d_ceil_drops_window_past_input", lambda x: R.nn.max_pool2d(x, 1, strides=2, ceil_mode=True), [((1, 2, 10, 10), F)], "any"),
    ("max_pool2d_uneven_padding", lambda x: R.nn.max_pool2d(x, 3, padding=(2, 1, 0, 2)), [NCHW4], "any"),
    # One window over the whole input: EfficientNet's pooler, AvgPool2d(1280, ceil_mode=True) over 7x7.
    ("avg_pool2d_global_ceil", lambda x: R.nn.avg_pool2d(x, 12, strides=12, ceil_mode=True, count_include_pad=True), [NCHW4], "any"),
    (
        "avg_pool2d_global_include_padded",
        lambda x: R.nn.avg_pool2d(x, 11, strides=11, padding=(1, 1, 2, 0), ceil_mode=True, count_include_pad=True),
        [NCHW4],
        "any",
    ),
    ("max_pool2d_global", lambda x: R.nn.max_pool2d(x, 10, padding=(1, 0, 0, 0)), [NCHW4], "any"),
    ("resize2d_linear_half_pixel", lambda x: R.image.resize2d(x, (16, 11)), [((1, 3, 5, 7), F)], "any"),
    (
        "resize2d_linear_align_corners_down",
        lambda x: R.image.resize2d(x, (3, 4), coordinate_transformation_mode="align_corners"),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    (
        "resize2d_linear_asymmetric",
        lambda x: R.image.resize2d(x, (10, 9), coordinate_transformation_mode="asymmetric"),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    (
        "resize2d_linear_pytorch_half_pixel_to_1",
        lambda x: R.image.resize2d(x, (1, 13), coordinate_transformation_mode="pytorch_half_pixel"),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    (
        "resize2d_nearest_asymmetric_floor_3x",
        lambda x: R.image.resize2d(
            x, (15, 21), method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="floor"
        ),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    (
        "resize2d_nearest_half_pixel_round_prefer_ceil",
        lambda x: R.image.resize2d(x, (12, 9), method="nearest_neighbor", rounding_method="round_prefer_ceil"),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    (
        "resize2d_nearest_round_down",
        lambda x: R.image.resize2d(
            x, (4, 3), method="nearest_neighbor", coordinate_transformation_mode="align_corners", rounding_method=""
        ),
        [((1, 3, 7, 5), F)],
        "any",
    ),
    (
        "resize2d_nearest_ceil_2x",
        lambda x: R.image.resize2d(x, (10, 14), method="nearest_neighbor", rounding_method="ceil"),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    ("resize2d_cubic_half_pixel", lambda x: R.image.resize2d(x, (9, 16), method="cubic"), [((1, 3, 5, 7), F)], "any"),
    (
        "resize2d_cubic_align_corners",
        lambda x: R.image.resize2d(x, (11, 4), method="cubic", coordinate_transformation_mode="align_corners", cubic_alpha=-0.5),
        [((1, 3, 5, 7), F)],
        "any",
    ),
    ("pad_constant", lambda x: R.nn.pad(x, [0, 0, 0, 0, 1, 2, 0, 3], pad_value=1.5), [NCHW4], "any"),
    ("pad_reflect", lambda x: R.nn.pad(x, [0, 0, 0, 0, 2, 1, 3, 0], pad_mode="reflect"), [NCHW4], "any"),
    ("pad_replicate", lambda x: R.nn.pad(x, [0, 0, 1, 0, 2, 2, 0, 1], pad_mode="replicate"), [NCHW4], "any"),
    ("pad_int64", lambda x: R.nn.pad(x, [1, 0, 0, 2], pad_value=7), [((3, 4), "int64")], "any"),
    ("adaptive_avg_pool2d", lambda x: R.nn.adaptive_avg_pool2d(x, 1), [NCHW], "any"),
    ("mean", lambda x: R.mean(x, axis=[2, 3], keepdims=True), [NCHW], "any"),
    ("mean_all", lambda x: R.mean(x), [NCHW], "any"),
    ("sum", lambda x: R.sum(x, axis=[1], keepdims=False), [NCHW], "any"),
    ("sum_int64_all", lambda x: R.sum(x), [((3, 4), "int64")], "any"),
    ("max", lambda x: R.max(x, axis=[-1]), [NCHW], "any"),
    ("min", lambda x: R.min(x, axis=[0, 2], keepdims=True), [NCHW], "any"),
    ("softmax", lambda x: R.nn.softmax(x, axis=-1), [ROWS], "any"),
    ("softmax_axis0", lambda x: R.nn.softmax(x, axis=0), [ROWS], "any"),
    ("log_softmax", lambda x: R.nn.log_softmax(x, axis=1), [ROWS], "any"),
    ("layer_norm", lambda x: R.nn.layer_norm(x, const(GAMMA), const(BETA), axes=[-1]), [((2, 4, 16), F)], "any"),
    (
        "layer_norm_two_axes",
        lambda x: R.nn.layer_norm(x, const(np.ones((4, 16), F)), const(np.zeros((4, 16), F)), axes=[1, 2]),
        [((2, 4, 16), F)],
        "any",
    ),
    ("reshape", lambda x: R.reshape(x, (2, 3, -1)), [NCHW], "any"),
    ("reshape_int64", lambda x: R.reshape(x, (6,)), [((2, 3), "int64")], "any"),
    ("permute_dims", lambda x: R.permute_dims(x, [0, 2, 3, 1]), [NCHW], "any"),
    ("permute_dims_reverse", lambda x: R.permute_dims(x), [((2, 3, 4), F)], "any"),
    ("concat", lambda x, y: R.concat([x, y, x], axis=1), [((2, 3), F), ((2, 5), F)], "any"),
    ("concat_negative_axis", lambda x, y: R.concat([x, y], axis=-2), [((2, 3), "int64"), ((4, 3), "int64")], "any"),
    ("strided_slice", lambda x: R.strided_slice(x, axes=[1, 2], begin=[0, 1], end=[2, 100], strides=[1, 2]), [NCHW], "any"),
    ("strided_slice_negative", lambda x: R.strided_slice(x, axes=[-1], begin=[-4], end=[-1]), [NCHW], "any"),
    ("squeeze", lambda x: R.squeeze(x, [1]), [((2, 1, 3), F)], "any"),
    ("squeeze_all", lambda x: R.squeeze(x), [((1, 2, 1, 3), F)], "any"),
    ("expand_dims", lambda x: R.expand_dims(x, [0, -1]), [((2, 3), F)], "any"),
    ("flatten", R.flatten, [((2, 3, 4), F)], "any"),
    ("take", lambda x, i: R.take(x, i, axis=0), [((10, 4), F), ((2, 3), "int64")], "any"),
    ("take_axis1_int32", lambda x, i: R.take(x, i, axis=1), [((2, 5, 3), F), ((4,), "int32")], "any"),
    ("take_wrap_const", lambda x: R.take(x, const(np.array([-1, 0, 2], "int64")), axis=0, mode="wrap"), [((3, 2), F)], "any"),
    ("astype_to_int64", lambda x: R.astype(x, "int64"), [ROWS], "any"),
    ("astype_to_float32", lambda x: R.astype(x, F), [((2, 3), "int64")], "any"),
    ("broadcast_to", lambda x: R.broadcast_to(x, (2, 4, 3)), [((4, 1), F)], "any"),
    ("two_outputs", lambda x: [R.nn.relu(x), R.exp(x)], [ROWS], "any"),
    ("split_sections", lambda x: R.split(x, 2, axis=1), [((2, 6, 3), F)], "any"),
    ("split_indices_negative_axis", lambda x: R.split(x, [1, 3], axis=-1), [((2, 3, 5), "int64")], "any"),
    ("split_pieces_used", lambda x: [R.add(x[0], x[1]) for x in [R.split(x, 2, axis=0)]][0], [ROWS], "any"),
    ("isnan", R.isnan, [ROWS], "nan"),
    ("logical_not", R.logical_not, [((2, 3), "bool")], "any"),
]


def pool_configurations(count: int, seed: int = 11):
    """Random max/avg pooling attributes over small inputs, ceil mode and padding included; every fifth a window as
    large as the input or larger (a global pooling, where the padding lets it be one)."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        kernel = int(rng.integers(1, 4))
        size = tuple(int(v) for v in rng.integers(5, 12, 2))
        config = dict(
            op=(relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d)[index % 2],
            size=size,
            pool_size=kernel,
            strides=int(rng.integers(1, 4)),
            padding=[int(v) for v in rng.integers(0, kernel, 4)],
            dilation=int(rng.integers(1, 3)) if index % 2 == 0 else 1,
            ceil_mode=bool(rng.integers(0, 2)),
            count_include_pad=bool(rng.integers(0, 2)),
        )
        if index % 5 == 4:
            config.update(
                pool_size=[side + int(rng.integers(0, 3)) for side in size],
                strides=int(rng.integers(1, 20)),
                padding=[int(v) for v in rng.integers(0, 2, 4)],
                dilation=1,
            )
        yield config


# (id, make, input specs, words the refusal's reason contains)
REFUSED = [
    (
        "conv2d_nhwc",
        lambda x: R.nn.conv2d(x, const(np.ones((3, 3, 3, 8), F)), data_layout="NHWC", kernel_layout="HWIO"),
        [((1, 9, 9, 3), F)],
        "data_layout",
    ),
    ("conv2d_out_dtype", lambda x: R.nn.conv2d(x, const(WEIGHT), out_dtype="float64"), [NCHW], "on float64"),
    ("add_float16", R.add, [((2, 3), "float16"), ((2, 3), "float16")], "float16"),
    ("divide_int64", R.divide, [((2, 3), "int64"), ((2, 3), "int64")], "on int64"),
    ("dynamic_shape", R.nn.relu, [((tvm.tirx.Var("n", "int64"), 3), F)], "dynamic"),
    ("max_pool2d_window_in_padding", lambda x: R.nn.max_pool2d(x, 2, strides=1, padding=(0, 0, 3, 0)), [NCHW4], "wholly in the padding"),
    ("max_pool2d_padding_as_wide_as_window", lambda x: R.nn.max_pool2d(x, 2, padding=2, dilation=2), [NCHW4], "as wide as the window"),
    ("avg_pool2d_dilated", lambda x: R.nn.avg_pool2d(x, 2, dilation=2), [NCHW], "dilation"),
    ("max_pool2d_nhwc", lambda x: R.nn.max_pool2d(x, 2, layout="NHWC"), [NCHW], "layout"),
    ("adaptive_avg_pool2d_2x2", lambda x: R.nn.adaptive_avg_pool2d(x, 2), [NCHW], "1x1"),
    ("resize2d_nhwc", lambda x: R.image.resize2d(x, (10, 10), layout="NHWC"), [((1, 5, 5, 3), F)], "layout"),
    (
        "resize2d_tf_half_pixel_for_nn",
        lambda x: R.image.resize2d(x, (10, 10), method="nearest_neighbor", coordinate_transformation_mode="tf_half_pixel_for_nn"),
        [NCHW],
        "coordinate_transformation_mode",
    ),
    ("resize2d_cubic_exclude_outside", lambda x: R.image.resize2d(x, (12, 12), method="cubic", cubic_exclude=1), [NCHW], "exclude_outside"),
    (
        "resize2d_align_corners_to_1",
        lambda x: R.image.resize2d(x, (1, 12), coordinate_transformation_mode="align_corners"),
        [NCHW],
        "length of 1",
    ),
    (
        "resize2d_nearest_half_to_even",
        lambda x: R.image.resize2d(
            x, (18, 18), method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="round"
        ),
        [NCHW],
        "to even",
    ),
    (
        "resize2d_nearest_inexact_boundary",
        lambda x: R.image.resize2d(
            x, (3, 3), method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="floor"
        ),
        [NCHW],
        "inexactly",
    ),
    ("pad_circular", lambda x: R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], pad_mode="circular"), [NCHW], "circular"),
    ("pad_reflect_wider_than_axis", lambda x: R.nn.pad(x, [0, 0, 0, 0, 9, 0, 0, 0], pad_mode="reflect"), [NCHW], "as wide as the axis"),
    (
        "layer_norm_leading_axis",
        lambda x: R.nn.layer_norm(x, const(np.ones(2, F)), const(np.zeros(2, F)), axes=[0]),
        [((2, 4, 16), F)],
        "trailing",
    ),
    (
        "layer_norm_no_center",
        lambda x: R.nn.layer_norm(x, const(GAMMA), const(BETA), axes=[-1], center=False),
        [((2, 4, 16), F)],
        "center or scale",
    ),
    ("strided_slice_reverse", lambda x: R.strided_slice(x, axes=[0], begin=[3], end=[0], strides=[-1]), [ROWS], "step"),
    ("take_clip_variable", lambda x, i: R.take(x, i, axis=0, mode="clip"), [((10, 4), F), ((3,), "int64")], "out of range"),
    ("take_wrap_out_of_range", lambda x: R.take(x, const(np.array([5], "int64")), axis=0, mode="wrap"), [((3, 2), F)], "out of range"),
    ("clip_min_above_max", lambda x: R.clip(x, 3.0, 1.0), [ROWS], "above max"),
    ("split_empty_piece", lambda x: R.split(x, [0, 2], axis=1), [((2, 6), F)], "split into pieces of"),
    ("isnan_int64", R.isnan, [((2, 3), "int64")], "isnan of int64"),
    ("logical_not_int64", R.logical_not, [((2, 3), "int64")], "logical_not on int64"),
    ("cumsum", lambda x: R.cumsum(x, axis=0), [ROWS], "no ONNX conversion"),
    ("conv1d", lambda x: R.nn.conv1d(x, const(np.ones((4, 3, 3), F))), [((1, 3, 9), F)], "no ONNX conversion"),
]
