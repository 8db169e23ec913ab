"""FLOPs counted from Relax modules, against counts made by hand; and the GPU peaks they are held against."""

from __future__ import annotations

import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from collage_core.outputs.flops import count_flops
from collage_core.outputs.peak import gpu_model, gpu_name, peak_of, throughput
from collage_core.testing import function_module

H200 = "cuda:sm_90a (NVIDIA H200, compute capability 9.0, CUDA 13.0, driver 580.159.04)"


def flops(make, *shapes) -> int:
    return count_flops(function_module(make, *shapes)).flops


def test_a_matrix_product_is_two_flops_per_multiply_add_over_its_broadcast_output():
    assert flops(lambda bb, a, b: relax.op.matmul(a, b), (2, 3, 4), (4, 5)) == 2 * (2 * 3 * 5) * 4
    assert flops(lambda bb, a, b: relax.op.matmul(a, b), (2, 1, 3, 4), (5, 4, 6)) == 2 * (2 * 5 * 3 * 6) * 4


def test_convolutions_count_their_window_over_their_group_of_input_channels():
    conv = relax.op.nn.conv2d
    assert flops(lambda bb, x, w: conv(x, w, padding=1), (1, 3, 8, 8), (16, 3, 3, 3)) == 2 * (16 * 8 * 8) * (3 * 3 * 3)
    grouped = flops(lambda bb, x, w: conv(x, w, padding=1, groups=4), (1, 8, 8, 8), (8, 2, 3, 3))
    assert grouped == 2 * (8 * 8 * 8) * (2 * 3 * 3)
    nhwc = flops(lambda bb, x, w: conv(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI"), (1, 8, 8, 3), (16, 3, 3, 3))
    assert nhwc == 2 * (8 * 8 * 16) * 27
    strided = flops(lambda bb, x, w: conv(x, w, strides=2), (2, 3, 9, 9), (4, 3, 3, 3))  # 4x4 outputs
    assert strided == 2 * (2 * 4 * 4 * 4) * 27
    assert flops(lambda bb, x, w: relax.op.nn.conv1d(x, w), (2, 4, 10), (6, 4, 3)) == 2 * (2 * 6 * 8) * (4 * 3)


def test_a_transposed_convolution_counts_each_input_element_once_per_output_channel_and_window_position():
    transposed = flops(lambda bb, x, w: relax.op.nn.conv2d_transpose(x, w, strides=2), (1, 4, 8, 8), (4, 3, 3, 3))
    assert transposed == 2 * (4 * 8 * 8) * (3 * 3 * 3)  # not the output's 3x17x17 times the window


def test_attention_counts_its_two_products():
    attention = flops(lambda bb, q, k, v: relax.op.nn.attention(q, k, v), (2, 16, 4, 8), (2, 32, 4, 8), (2, 32, 4, 6))
    assert attention == 2 * (2 * 4 * 16 * 32) * (8 + 6)


def test_a_dense_layer_counts_its_product_and_not_its_bias_or_activation():
    def dense(bb, x, w, b):
        return relax.op.nn.relu(relax.op.add(relax.op.matmul(x, relax.op.permute_dims(w)), b))

    count = count_flops(function_module(dense, (8, 768), (3072, 768), (3072,)))
    assert count.flops == 2 * 8 * 3072 * 768
    assert count.by_op == {"relax.matmul": 2 * 8 * 3072 * 768}


def test_calls_of_the_modules_other_functions_are_counted_once_per_call():
    @I.ir_module
    class Module:
        @R.function
        def layer(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")) -> R.Tensor((4, 16), "float32"):
            with R.dataflow():
                y = R.nn.relu(R.matmul(x, w))
                R.output(y)
            return y

        @R.function
        def main(x: R.Tensor((4, 16), "float32"), w: R.Tensor((16, 16), "float32")) -> R.Tensor((4, 16), "float32"):
            cls = Module
            with R.dataflow():
                a = cls.layer(x, w)
                b = cls.layer(a, w)
                c = R.matmul(b, w)
                R.output(c)
            return c

    assert count_flops(Module).flops == 3 * 2 * (4 * 16) * 16


def test_an_imported_model_counts_what_the_importers_own_check_counts():
    """The tiny ResNet that ships with the project: its products and convolutions as the import check counts them."""
    from pathlib import Path

    from collage_core.model.model_import import _multiply_adds, load_model

    imported = load_model(Path(__file__).resolve().parents[1] / "models" / "tiny_resnet.onnx")
    assert count_flops(imported.mod).flops == 2 * _multiply_adds(imported.mod["main"]) > 0


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100-SXM4-80GB", None),
    ],
)
def test_the_gpu_is_known_by_the_name_its_driver_reports(name, model):
    assert gpu_model(name) == model


def test_the_peak_comes_from_the_device_collage_records_at_the_runs_precision():
    assert gpu_name(H200) == "NVIDIA H200"
    assert gpu_name("llvm:znver3") == ""
    assert peak_of(H200, "fp32").tflops == 67.0
    assert peak_of(H200, "bf16").tflops == 989.5  # 1,979 with sparsity, halved
    assert peak_of(H200, "tf32").tflops == 494.5
    pcie = "cuda:sm_90 (NVIDIA H100 PCIe, compute capability 9.0, CUDA 12.4)"
    assert peak_of(pcie, "fp32").tflops == 51.0 and peak_of(pcie, "fp16").tflops == 756.5
    assert peak_of("llvm:znver3", "fp32") is None


def test_the_throughput_line_names_the_rate_the_fraction_of_peak_and_its_source():
    line = throughput(12_300_000_000, 2.674e-3, H200, "fp32").describe()
    assert line.startswith("12.3 GFLOP per run (2 FLOPs per multiply-add of matrix products, convolutions and attention;")
    assert line.endswith(
        "): 4.60 TFLOP/s, 6.9% of the H200's 67 TFLOP/s fp32 (CUDA cores) peak "
        "(NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/)"
    )
    assert "989.5 TFLOP/s bf16 dense tensor-core peak" in throughput(10**12, 1e-3, H200, "bf16").describe()
    cpu = throughput(4 * 10**9, 0.02, "llvm:znver3", "fp32")
    assert cpu.describe().endswith(": 200.0 GFLOP/s, peak of llvm:znver3 unknown") and cpu.to_json()["fraction_of_peak"] is None
