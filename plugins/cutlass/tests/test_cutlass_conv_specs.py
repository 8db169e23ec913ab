"""CUTLASS convolution candidates: each spec, read back as the kernel computes it between the lowering's layout
changes, against TVM's own CPU build of the same Relax (no GPU needed), the refusals, and the lowered function.

``cutlass_cases.conv_reference`` follows runtime/conv_runner.h in PyTorch (float64 on the CPU): NHWC
activations, KRSC filters, the epilogue in float32 rounded once. TVM's build rounds after each step, so
the two agree within four units in the last place of the 16-bit output (``sixteen_bit_atol``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from collage_cutlass import conv_specs, lowering, patterns, specs, tuning
from collage_cutlass.conv_kernels import CONV_TILE_CONFIGS, ConvKind
from cutlass_cases import OUT_DTYPES, conv_reference
from tvm import relax

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, enumerate_candidates, load_model, tvm_compat
from collage_core.kit.testing import assert_matches, function_module, inputs_and_answer, operand_arrays, rounded_to, whole_candidate

R = relax.op
F = "float32"
MODELS = Path(__file__).resolve().parents[3] / "models"
RNG = np.random.default_rng(0)


def _filters(*shape, dtype="float16"):
    return relax.const(rounded_to(RNG.uniform(-0.5, 0.5, size=shape).astype(F), dtype), dtype)


def _conv(bb, x, filters, dtype="float16", **attributes):
    """A convolution as `--precision fp16|bf16` writes it: a float32 result cast to 16 bits."""
    return bb.emit(R.astype(bb.emit(R.nn.conv2d(x, filters, out_dtype=F, **attributes)), dtype))


def _bias(channels, layout="NCHW", dtype="float16"):
    shape = (1, channels, 1, 1) if layout == "NCHW" else (1, 1, 1, channels)
    return relax.const(rounded_to(RNG.uniform(-0.5, 0.5, size=shape).astype(F), dtype), dtype)


def check_conv_candidate(graph: RelaxGraph, nodes, tf32: bool = False) -> conv_specs.ConvSpec:
    standalone = graph.standalone_module(nodes)
    func = standalone["main"]
    spec = specs.recognize(Group.from_function(func), tf32=tf32)
    assert isinstance(spec, conv_specs.ConvSpec)
    inputs, expected = inputs_and_answer(standalone, RNG)
    assert_matches(conv_reference(spec, operand_arrays(spec.operands, func.params, inputs)), expected, OUT_DTYPES[spec.words[2]])
    return spec


def _bias_add_relu(bb, x, skip):
    y = bb.emit(R.add(_conv(bb, x, _filters(16, 8, 3, 3), padding=[1, 1, 1, 1]), _bias(16)))
    return R.nn.relu(bb.emit(R.add(y, skip)))


# Each case by name: the pattern that covers it, then "__" and what else it tries.
CASES = {
    "conv2d_bias_add_relu": (_bias_add_relu, [(2, 8, 9, 9), (2, 16, 9, 9)], "float16"),
    "conv2d_bias_relu__stride2_uneven_padding": (
        lambda bb, x: R.nn.relu(
            bb.emit(
                R.add(
                    _conv(bb, x, _filters(24, 16, 3, 3, dtype="bfloat16"), "bfloat16", strides=[2, 2], padding=[0, 1, 1, 0]),
                    _bias(24, dtype="bfloat16"),
                )
            )
        ),
        [(1, 16, 11, 10)],
        "bfloat16",
    ),
    "conv2d_bias": (lambda bb, x: R.add(_conv(bb, x, _filters(8, 8, 1, 1)), _bias(8)), [(3, 8, 7, 5)], "float16"),
    "conv2d_silu__dilation2": (
        lambda bb, x: R.nn.silu(_conv(bb, x, _filters(16, 8, 3, 3), dilation=[2, 2], padding=[2, 2, 2, 2])),
        [(1, 8, 12, 12)],
        "float16",
    ),
    "conv2d_bias__nhwc": (
        lambda bb, x: R.add(
            _conv(bb, x, _filters(16, 3, 3, 8), data_layout="NHWC", kernel_layout="OHWI", padding=[1, 1, 1, 1]), _bias(16, "NHWC")
        ),
        [(2, 6, 6, 8)],
        "float16",
    ),
    # Height and width apart everywhere (filter, stride, dilation, padding, input), so a swap of the two shows.
    "conv2d_relu__3x1_asymmetric": (
        lambda bb, x: R.nn.relu(_conv(bb, x, _filters(16, 8, 3, 1), strides=[1, 2], dilation=[2, 1], padding=[2, 0, 1, 1])),
        [(2, 8, 10, 7)],
        "float16",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_convolution_pattern_covers_its_case_and_computes_what_tvm_computes(case):
    make, shapes, dtype = CASES[case]
    pattern_name = case.split("__")[0]
    graph, candidate = whole_candidate(function_module(make, *shapes, dtype=dtype), patterns.patterns(), f"cutlass.{pattern_name}")
    assert candidate is not None, f"no cutlass.{pattern_name} candidate covers the whole function"
    spec = check_conv_candidate(graph, candidate.nodes)
    assert spec.kind.operand_dtype == dtype and spec.kind.out_dtype == dtype
    assert spec.output_channel_first == (not case.endswith("__nhwc"))


def test_an_nchw_convolution_is_called_between_its_layout_changes_and_its_filter_is_transposed_once():
    make, shapes, dtype = CASES["conv2d_bias_add_relu"]
    graph, candidate = whole_candidate(function_module(make, *shapes, dtype=dtype), patterns.patterns(), "cutlass.conv2d_bias_add_relu")
    spec = check_conv_candidate(graph, candidate.nodes)
    assert spec.kind == ConvKind("float16", "float16", bias=True, residual=True, activation="relu")
    assert spec.channel_first == (0, 3)  # the input and the residual
    assert tvm_compat.constant_array(spec.operands[1]).shape == (16, 3, 3, 8)  # KRSC
    assert spec.words[6:15] == (2, 9, 9, 8, 16, 3, 3, 9, 9)


def test_the_lowered_partition_transposes_in_calls_the_kernel_and_transposes_back(monkeypatch):
    """Lowering without a GPU takes the first configuration; loading the kernel (nvcc) is the GPU tests' part."""
    make, shapes, dtype = CASES["conv2d_bias_add_relu"]
    graph, candidate = whole_candidate(function_module(make, *shapes, dtype=dtype), patterns.patterns(), "cutlass.conv2d_bias_add_relu")
    func = graph.standalone_module(candidate.nodes)["main"]
    for name in ("cutlass_includes", "find_nvcc", "load", "record_chosen"):
        monkeypatch.setattr(lowering.library, name, lambda *args: None)
    monkeypatch.setattr(tuning.cuda_libraries, "first_gpu", _no_gpu)
    text = lowering.lower_function(func, "part").script()
    kernel = ConvKind("float16", "float16", True, True, "relu").kernel(CONV_TILE_CONFIGS[0])
    assert f'"collage_cutlass.{kernel.name}"' in text
    assert text.count("R.permute_dims") == 3 and "axes=[0, 2, 3, 1]" in text and "axes=[0, 3, 1, 2]" in text
    assert 'R.Tensor((2, 9, 9, 16), dtype="float16")' in text  # the kernel writes NHWC


def _no_gpu():
    raise tuning.CudaUnavailable("no GPU here")


def _recognize_all(mod, tf32=False):
    graph = RelaxGraph.from_function(mod["main"])
    return specs.recognize(Group.from_function(graph.standalone_module(range(len(graph.graph)))["main"]), tf32=tf32)


@pytest.mark.parametrize(
    "make, shapes, dtype, reason",
    [
        (lambda bb, x: _conv(bb, x, _filters(16, 3, 3, 3)), [(1, 3, 8, 8)], "float16", "3 input channels; .* multiple of 8"),
        (lambda bb, x: _conv(bb, x, _filters(12, 8, 3, 3)), [(1, 8, 8, 8)], "float16", "12 output channels"),
        (lambda bb, x: _conv(bb, x, _filters(16, 4, 3, 3), groups=2), [(1, 8, 8, 8)], "float16", "2 groups"),
        (lambda bb, x: R.nn.conv2d(x, relax.const(np.ones((16, 8, 3, 3), F))), [(1, 8, 8, 8)], F, "float32 as TF32"),
        (
            lambda bb, x: _conv(bb, x, _filters(3, 3, 8, 16), data_layout="NHWC", kernel_layout="HWIO"),
            [(1, 8, 8, 8)],
            "float16",
            "layouts NHWC/HWIO",
        ),
        (lambda bb, x: _conv(bb, x, _filters(16, 8, 1, 1), strides=[9, 9]), [(1, 8, 20, 20)], "float16", "strides \\[9, 9\\].* 1 to 8"),
        (lambda bb, x: _conv(bb, x, _filters(16, 8, 3, 3), dilation=[128, 1]), [(1, 8, 300, 8)], "float16", "dilated .* at most 254"),
    ],
)
def test_convolutions_the_kernels_cannot_run_are_refused_with_the_reason(make, shapes, dtype, reason):
    with pytest.raises(Refused, match=reason):
        _recognize_all(function_module(make, *shapes, dtype=dtype))


def test_at_tf32_a_float32_convolution_is_a_tf32_kernel_computing_what_tvm_computes():
    def make(bb, x):
        return R.nn.relu(bb.emit(R.add(bb.emit(R.nn.conv2d(x, _filters(8, 8, 3, 3, dtype=F), padding=[1, 1, 1, 1])), _bias(8, dtype=F))))

    graph, candidate = whole_candidate(function_module(make, (1, 8, 6, 6)), patterns.patterns(tf32=True), "cutlass.conv2d_bias_relu_tf32")
    assert candidate is not None
    spec = check_conv_candidate(graph, candidate.nodes, tf32=True)
    assert (spec.kind.operand_dtype, spec.kind.out_dtype) == (F, F)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_in_a_sixteen_bit_resnet_every_convolution_with_aligned_channels_takes_its_cast_bias_and_relu(precision):
    graph = RelaxGraph.from_function(at_precision(load_model(str(MODELS / "tiny_resnet.onnx")), precision).mod["main"])
    candidates = enumerate_candidates(graph, patterns.patterns())
    convs = [node for node in range(len(graph.graph)) if graph.graph.ops[node] == "relax.nn.conv2d"]
    first = [node for node in convs if tvm_compat.tensor_shape_dtype(graph.call(node).args[0])[0][1] == 3]
    assert len(first) == 1 and not any(first[0] in c.nodes for c in candidates)  # 3 input channels: refused
    for node in set(convs) - set(first):
        largest = max((c for c in candidates if node in c.nodes), key=lambda c: len(c.nodes))
        names = sorted(graph.graph.ops[n] for n in largest.nodes)
        assert "relax.astype" in names and "relax.add" in names, f"{largest.pattern}: {names}"
        check_conv_candidate(graph, largest.nodes)
    assert any(c.pattern.endswith("_add_relu") for c in candidates)  # a residual block's last convolution
