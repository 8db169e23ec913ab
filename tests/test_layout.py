"""--layout nhwc: every 2-d convolution rewritten channel-last once, outputs unchanged (checked against ONNX
Runtime through TVM's build), and the layout carried by fingerprints and placement files so a replay does the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model import layout
from collage_core.model.model_import import check_against_reference, load_model
from collage_core.optimizer import optimize
from collage_core.outputs.placement_file import Placement, PlacementFileError, load_placement
from collage_core.records import Cost, Partition

MODELS = Path(__file__).resolve().parents[1] / "models"


def convolution_layouts(mod) -> list[tuple[str, str, str]]:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and tvm_compat.op_name(expr) == "relax.nn.conv2d":
            found.append((str(expr.attrs.data_layout), str(expr.attrs.kernel_layout), str(expr.attrs.out_layout)))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_nhwc_rewrites_every_convolution_and_tvms_build_still_matches_onnx_runtime():
    model = load_model(str(MODELS / "tiny_resnet.onnx"))
    assert set(convolution_layouts(model.mod)) == {("NCHW", "OIHW", "NCHW")}
    nhwc = layout.with_layout(model, "nhwc")
    assert convolution_layouts(nhwc.mod) == [("NHWC", "OHWI", "NHWC")] * len(convolution_layouts(model.mod))
    assert nhwc.layout == "nhwc" and nhwc.fingerprint == f"{model.fingerprint}+nhwc"
    # TVM's CPU build of the rewritten model against ONNX Runtime on the original file, within float32's tolerance
    # (atol 1e-4 + rtol 1e-3 x max|reference|); a mismatch raises.
    assert "numerics passed" in check_against_reference(nhwc)
    # The layout changes left: into NHWC at the input, and back before the classifier's pooling and flattening.
    assert 1 <= layout._count_ops(nhwc.mod, "relax.permute_dims") <= 3
    assert layout.with_layout(nhwc, "nhwc") is nhwc


def test_a_model_without_convolutions_is_left_as_it_is_and_unknown_layouts_are_refused():
    model = load_model(str(MODELS / "tiny_bert.onnx"))
    assert layout.with_layout(model, "nhwc") is model
    with pytest.raises(CollageError, match="unknown layout 'nchw4c'"):
        layout.with_layout(model, "nchw4c")


@pytest.mark.parametrize(
    "model, target, precision, asked, chosen",
    [
        ("tiny_resnet", "cuda", "bf16", None, "nhwc"),
        ("tiny_resnet", "cuda", "fp16", "auto", "nhwc"),
        ("tiny_resnet", "cuda", "fp32", None, "model"),  # cuDNN's float32 convolutions are slower in NHWC
        ("tiny_resnet", "cuda", "tf32", None, "model"),
        ("tiny_resnet", "llvm", "bf16", None, "model"),  # untuned TVM is slower in NHWC on the CPU
        ("tiny_bert", "cuda", "bf16", None, "model"),  # no convolution to rewrite
        ("tiny_resnet", "cuda", "bf16", "model", "model"),
        ("tiny_resnet", "llvm", "fp32", "nhwc", "nhwc"),
    ],
)
def test_auto_takes_nhwc_for_16_bit_convolutions_on_cuda_and_the_models_own_layout_elsewhere(model, target, precision, asked, chosen):
    mod = load_model(str(MODELS / f"{model}.onnx")).mod
    assert layout.resolve(asked, tvm_compat.make_target(target), precision, mod) == chosen


def test_the_import_stage_places_a_16_bit_resnet_for_cuda_in_nhwc_and_says_why_unless_told_otherwise():
    from collage_core.model.stage import import_model
    from collage_core.options import OptimizeOptions

    said = []
    imported = import_model(str(MODELS / "tiny_resnet.onnx"), None, OptimizeOptions(target="cuda", precision="bf16"), said.append)
    assert imported.original.layout == imported.model.layout == "nhwc"
    assert set(convolution_layouts(imported.model.mod)) == {("NHWC", "OHWI", "NHWC")}
    assert any("--layout auto" in line for line in said) and any("numerics passed" in line for line in said)
    told = import_model(
        str(MODELS / "tiny_resnet.onnx"), None, OptimizeOptions(target="cuda", precision="bf16", layout="model"), said.append
    )
    assert told.model.layout == "model" and set(convolution_layouts(told.model.mod)) == {("NCHW", "OIHW", "NCHW")}


def test_a_placement_file_keeps_its_layout_and_refuses_an_unknown_one(tmp_path):
    whole = Partition("tvm", "tvm.op", [0], "k", Cost.measured(1e-6, 0.0, 3))
    placement = Placement("m", "f+nhwc", ["relax.nn.conv2d"], {"kind": "llvm"}, "cpu", {}, "op-level", [whole], layout="nhwc")
    path = placement.save(tmp_path / "p.json")
    assert load_placement(path).layout == "nhwc"
    data = json.loads(path.read_text())
    data["layout"] = "nchw4c"
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementFileError, match=r"p.json: unknown layout 'nchw4c'"):
        load_placement(path)
    del data["layout"]  # files written before the option existed keep the model's layout
    path.write_text(json.dumps(data))
    assert load_placement(path).layout == "model"


@pytest.mark.slow  # a whole optimize and a replay, about a minute
def test_nhwc_is_placed_verified_saved_and_replayed_in_its_own_layout(tmp_path, tvm_only_run):
    model = MODELS / "tiny_resnet.onnx"
    out = tmp_path / "out"
    kwargs = tvm_only_run
    result = optimize(model, layout="nhwc", output_dir=out, **kwargs)
    assert result.placement.layout == "nhwc" and result.model.fingerprint.endswith("+nhwc") and result.verification.passed
    assert json.loads((out / "placement.json").read_text())["layout"] == "nhwc"
    assert "convolutions in NHWC" in (out / "report.txt").read_text()
    replayed = optimize(model, placement=out / "placement.json", **kwargs)
    assert replayed.placement.layout == "nhwc" and replayed.verification.passed
    with pytest.raises(CollageError, match="made at layout nhwc, not model"):
        optimize(model, placement=out / "placement.json", layout="model", **kwargs)


def test_tvm_compiles_the_nhwc_model_for_cuda_at_bf16_here():
    """TVM's CUDA code for every operator of the channel-last 16-bit model compiles (no GPU needed to compile;
    running it is the GPU tests')."""
    from collage_core.backends import registered_backends
    from collage_core.build.executable import build
    from collage_core.model.precision import at_precision
    from collage_core.plugins import get_plugin_manager

    model = at_precision(layout.with_layout(load_model(str(MODELS / "tiny_resnet.onnx")), "nhwc"), "bf16")
    pm = get_plugin_manager()
    executable = build(pm, model.mod, registered_backends(pm), tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"}))
    kinds = {getattr(module, "kind", None) for host in executable.mod.imports for module in host.imports}
    assert kinds == {"cuda"}  # the kernels went to CUDA device code
