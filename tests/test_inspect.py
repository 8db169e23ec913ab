"""``collage inspect``: the imported Relax, each backend's candidates and refused matches with the
checks' reasons, nothing measured; ``--strict`` fails a run in which anything warned."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from collage_core import cli, inspection
from collage_core.candidates.fused_groups import shape_of
from collage_core.plugins import get_plugin_manager

MODELS = Path(__file__).resolve().parents[1] / "models"
PICKY = "plugins_for_tests.refusing_checks_plugin"


@pytest.fixture
def with_picky(monkeypatch):
    monkeypatch.setattr(inspection, "get_plugin_manager", lambda: get_plugin_manager(extra_modules=[PICKY]))


@pytest.fixture(scope="module")
def resnet_ops():
    from collage_core.model.model_import import load_model
    from collage_core.model.relax_graph import RelaxGraph

    model = load_model(str(MODELS / "tiny_resnet.onnx"))
    return RelaxGraph.from_function(model.mod["main"], model.mod).graph.ops


def test_refused_matches_carry_the_checks_reasons_and_a_broken_check_is_told_apart(with_picky, resnet_ops):
    result = inspection.inspect_model(str(MODELS / "tiny_resnet.onnx"), backends=["picky", "tvm"])
    picky = next(view for view in result.views if view.name == "picky")
    ops = Counter(resnet_ops)
    assert Counter(c.pattern for c in picky.candidates) == {"picky.conv2d": ops["relax.nn.conv2d"]}
    relu = [r for r in picky.refusals if r.pattern == "picky.relu"]
    assert len(relu) == ops["relax.nn.relu"] and not any(r.broken for r in relu)
    assert all(r.reason.endswith("elements, over the 1000 this backend takes") for r in relu)
    assert len(result.broken_checks()) == ops["relax.add"]
    assert {r.pattern for r in result.broken_checks()} == {"picky.add"}

    text = inspection.render_inspection(result, show_relax=False)
    assert "picky.relu x" in text and "16384 elements, over the 1000 this backend takes" in text
    assert f"{ops['relax.add']} matches were refused because a check raised" in text
    assert "def main(" not in text
    assert "def main(" in inspection.render_inspection(result)  # the imported Relax, first


def test_strict_fails_a_run_in_which_a_check_raised_and_otherwise_the_run_ends_with_a_summary(with_picky, capsys):
    argv = ["inspect", str(MODELS / "tiny_resnet.onnx"), "--backends", "picky", "--no-relax"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: pattern picky.add: the check raised ZeroDivisionError" in err
    assert "collage: 1 warning(s) in this run" in err and "--strict" in err
    assert cli.main([*argv, "--strict"]) == cli.EXIT_WARNINGS


def test_a_named_backend_is_inspected_where_it_cannot_run():
    result = inspection.inspect_model(str(MODELS / "tiny_bert.onnx"), target={"kind": "cuda", "arch": "sm_90"}, backends=["cublas"])
    cublas = result.views[0]
    assert cublas.name == "cublas" and cublas.candidates
    assert any(r.reason == "a constant right operand is the dense patterns' match" for r in cublas.refusals)
    text = inspection.render_inspection(result, show_relax=False)
    available = not result.unavailable
    assert available or "cublas: not available here (" in text and "its patterns are inspected all the same" in text


def test_an_unknown_backend_is_named_with_the_installed_ones():
    with pytest.raises(Exception, match="unknown backend 'nosuch'.*tvm"):
        inspection.inspect_model(str(MODELS / "tiny_resnet.onnx"), backends=["nosuch"])


def test_python_m_collage_core_runs_the_cli():
    run = subprocess.run(
        [sys.executable, "-m", "collage_core", "inspect", str(MODELS / "tiny_resnet.onnx"), "--backends", "tvm", "--no-relax"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "tvm.op" in run.stdout and "45 of 45" in run.stdout


def test_a_backend_chosen_by_default_on_cuda_only_is_inspected_by_default_there_only():
    """TorchInductor is placed on by default on CUDA and only when named on the CPU; inspecting needs no GPU."""
    from collage_core.backends import discover_backends
    from collage_core.inspection import inspect_model
    from collage_core.plugins import get_plugin_manager

    infos = discover_backends(get_plugin_manager())
    if "inductor" not in infos or not infos["inductor"].availability.available:
        pytest.skip("the inductor plugin is not available here")
    model = Path(__file__).resolve().parents[1] / "models" / "tiny_resnet.onnx"
    on_cuda = {view.name for view in inspect_model(model, target="cuda").views}
    on_cpu = {view.name for view in inspect_model(model, target="llvm").views}
    assert "inductor" in on_cuda and "inductor" not in on_cpu


def test_inspect_shows_what_cudnn_takes_with_the_convolutions_in_nhwc():
    """At bf16 cuDNN's fused convolutions (with their bias and ReLU) match only with --layout nhwc."""
    model, cuda = str(MODELS / "tiny_resnet.onnx"), {"kind": "cuda", "arch": "sm_90"}

    def fused(layout):
        view = inspection.inspect_model(model, target=cuda, backends=["cudnn"], precision="bf16", layout=layout).views[0]
        return {candidate.pattern for candidate in view.candidates if "_nhwc_" in candidate.pattern}

    assert fused("nhwc") >= {"cudnn.conv2d_nhwc_cast_bias", "cudnn.conv2d_nhwc_cast_bias_relu"}
    assert fused("model") == set()
    # by default (auto) it is inspected as optimize would place it: NHWC at 16 bits on CUDA, and says so
    default = inspection.inspect_model(model, target=cuda, backends=["cudnn"], precision="bf16")
    assert default.layout == "nhwc" and "convolutions in NHWC" in inspection.render_inspection(default, show_relax=False)
    at_fp32 = inspection.inspect_model(model, target=cuda, backends=["cudnn"])
    assert at_fp32.layout == "model" and "convolutions in" not in inspection.render_inspection(at_fp32, show_relax=False)


def test_a_model_with_symbolic_dimensions_is_inspected_at_the_one_shape_given(capsys):
    """Without a shape the import says to list one; with one the graph is imported at it (the embedding's gather
    and the layers come out of batch 2, sequence 8); a list of several is refused in one line."""
    model = str(MODELS / "tiny_bert_dynamic.onnx")
    with pytest.raises(Exception, match="has a dynamic shape"):
        inspection.inspect_model(model, backends=["tvm"])
    result = inspection.inspect_model(model, backends=["tvm"], shapes="batch=2 sequence=8")
    assert result.model_name == "tiny_bert_dynamic"
    shapes = {tuple(int(d) for d in shape_of(param)) for param in result.graph.func.params}
    assert shapes == {(2, 8)}
    assert cli.main(["inspect", model, "--backends", "tvm", "--no-relax", "--shapes", "batch=1,2 sequence=8"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "collage: error: --shapes: inspect takes one shape, and 2 are listed (batch=1 sequence=8; batch=2 sequence=8); give one size each"
    )
