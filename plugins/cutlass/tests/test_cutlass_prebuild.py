"""Compiling a model's CUTLASS kernels ahead of time (no GPU needed): which kernels, and what is said."""

from __future__ import annotations

from pathlib import Path

from collage_cutlass import patterns, prebuild, specs, tuning
from collage_cutlass.conv_kernels import CONV_TILE_CONFIGS

from collage_core.kit import Group, Refused, RelaxGraph, at_precision, enumerate_candidates, load_model

MODELS = Path(__file__).resolve().parents[3] / "models"


def test_the_kinds_named_are_those_of_every_candidate_cutlass_accepts():
    function = at_precision(load_model(str(MODELS / "tiny_bert.onnx")), "fp16").mod["main"]
    graph = RelaxGraph.from_function(function)
    accepted, refused = set(), 0
    for candidate in enumerate_candidates(graph, patterns.patterns()):
        try:
            accepted.add(specs.recognize(Group.from_function(graph.standalone_module(candidate.nodes)["main"])).kind)
        except Refused:
            refused += 1
    assert prebuild.kinds_in(function) == accepted
    assert any(kind.activation == "gelu_erf" for kind in accepted) and any(kind.a_k_major and kind.b_k_major for kind in accepted)
    assert {kind.operand_dtype for kind in accepted} == {"float16"}


def test_each_kind_is_compiled_in_every_configuration_tuning_tries(monkeypatch):
    function = at_precision(load_model(str(MODELS / "tiny_gpt2.onnx")), "fp16").mod["main"]
    kinds = prebuild.kinds_in(function)
    monkeypatch.setenv("COLLAGE_CUTLASS_TILES", "2")
    wanted = prebuild.kernels_for(kinds)
    assert len(wanted) == 2 * len(kinds) and {k.config for k in wanted} == set(tuning.configs())


def test_a_dry_run_lists_the_kernels_and_compiles_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    assert prebuild.main([str(MODELS / "tiny_bert.onnx"), "--tiles", "3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kernel kinds at fp16" in out and "each in up to 3 configurations)" in out
    assert not list(tmp_path.glob("cutlass/gemm_*"))


def test_a_model_that_does_not_load_is_named_in_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    assert prebuild.main([str(broken), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {broken}:") and "\n" not in err


def test_a_resnet_names_its_convolution_kernels_each_in_the_convolution_configurations(monkeypatch):
    function = at_precision(load_model(str(MODELS / "tiny_resnet.onnx")), "fp16").mod["main"]
    kinds = prebuild.kinds_in(function)
    assert kinds and {kind.op for kind in kinds} == {"conv2d"}
    assert any(kind.bias and kind.activation == "relu" for kind in kinds)
    monkeypatch.setenv("COLLAGE_CUTLASS_TILES", "2")
    wanted = prebuild.kernels_for(kinds)
    assert len(wanted) == 2 * len(kinds) and all(kernel.name.startswith("conv2d_") for kernel in wanted)
    assert {kernel.config for kernel in wanted} == set(CONV_TILE_CONFIGS[:2])


def test_the_gpu_tests_kernels_cover_every_problem_they_place_and_a_dry_run_compiles_nothing(tmp_path, monkeypatch, capsys):
    import gpu_test_kernels
    import test_cutlass_kernels as tests

    monkeypatch.delenv("COLLAGE_CUTLASS_TILES", raising=False)
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    kinds = gpu_test_kernels.kinds()
    assert {kind.operand_dtype for kind in kinds} == {"bfloat16", "float16", "float32"}
    assert sum(kind.op == "conv2d" for kind in kinds) >= len(tests.CONV_CASES) - 1  # one case may share a kind
    wanted = gpu_test_kernels.kernels()
    assert len(wanted) == 2 * len(kinds) + 1 and any(kernel.config.scheduler == "streamk" for kernel in wanted)
    assert gpu_test_kernels.main(["--dry-run"]) == 0
    assert f"{len(wanted)} kernels for the GPU tests, {len(wanted)} to compile" in capsys.readouterr().out
    assert not list(tmp_path.glob("cutlass/gemm_*"))
