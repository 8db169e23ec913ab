"""``collage optimize``'s options and the Python API's keywords are one record, :class:`OptimizeOptions`:
the command reads its defaults, help and checks from the record's fields, and refuses a value in the
same words as the API. Nothing here imports a model or measures anything."""

from __future__ import annotations

import argparse
import inspect
import signal

import attrs
import pytest

import collage_core
from collage_core import cli, optimizer
from collage_core.api_checks import ArgumentError
from collage_core.errors import CollageError
from collage_core.measure.timing import MeasureSettings
from collage_core.options import OptimizeOptions, command_line_paths, field_at, with_values
from collage_core.search.two_level import TwoLevelSettings
from collage_core.tvm_compat import TargetError

MODEL = "model.onnx"  # never read: every run here stops before the model is imported

# Each option of collage optimize with a value, and the fields the command line sets (every other at its default).
OPTION_CASES = [
    (["--target", "cuda"], {"target": "cuda"}),
    (["--backends", "dnnl,tvm"], {"backends": ["dnnl", "tvm"]}),
    (["-o", "out"], {"output_dir": "out"}),
    (["--placement", "p.json"], {"placement": "p.json"}),
    (["--placement", "p.json", "--compare"], {"placement": "p.json", "compare_backends": True}),
    (["--no-compare"], {"compare_backends": False}),
    (["--cost-db", "costs.sqlite"], {"cost_db": "costs.sqlite"}),
    (["--remeasure-invalid"], {"remeasure_invalid": True}),
    (["--remeasure-held-up"], {"remeasure_held_up": True}),
    (["--search", "op-level"], {"search": "op-level"}),
    (["--budget", "30"], {"two_level.budget_s": 30.0}),
    (["--population", "4"], {"two_level.population": 4}),
    (["--generations", "0"], {"two_level.generations": 0}),
    (["--patience", "2"], {"two_level.patience": 2}),
    (["--min-gain", "0.05"], {"two_level.min_gain": 0.05}),
    (["--predict-margin", "0.3"], {"two_level.predict_margin": 0.3}),
    (["--build-every-genome"], {"two_level.predict_margin": None}),
    (["--seed", "-7"], {"two_level.seed": -7}),
    (["--latency", "after-pause"], {"latency": "after-pause"}),
    (["--baseline-limit", "5"], {"baseline_limit_s": 5.0}),
    (["--baseline-limit", "0"], {"baseline_limit_s": None}),
    (["--calibration-rounds", "0"], {"calibration_rounds": 0}),
    (["--tune-budget-s", "60"], {"tune_budget_s": 60.0}),
    (["--jobs", "3"], {"settings.build_workers": 3}),
    (["--precision", "bf16"], {"precision": "bf16"}),
    (["--precision", "bf16", "--accuracy-budget", "0.01"], {"precision": "bf16", "accuracy_budget": 0.01}),
    (["--layout", "nhwc"], {"layout": "nhwc"}),
    (["--accuracy-blocks", "3"], {"accuracy_blocks": 3}),
    (["--no-verify"], {"verify": False}),
    (["--no-cuda-graphs"], {"settings.cuda_graphs": False}),
    (["--rpc-tracker", "127.0.0.1:9190", "--rpc-key", "x86"], {"rpc_tracker": "127.0.0.1:9190", "rpc_key": "x86"}),
    (["--shapes", "batch=1,8 sequence=128"], {"shapes": "batch=1,8 sequence=128"}),
]


def parsed(*options: str) -> OptimizeOptions:
    return cli.options_from(cli._parser().parse_args(["optimize", MODEL, *options]))


def value_at(options: OptimizeOptions, path: str):
    for name in path.split("."):
        options = getattr(options, name)
    return options


def optimize_parser():
    parser = cli._parser()
    commands = next(action for action in parser._actions if action.choices and "optimize" in action.choices)
    return commands.choices["optimize"]


def run_main(argv: list[str], capfd) -> tuple[int, list[str]]:
    """``cli.main(argv)``'s status (argparse's 2 included) and the lines it wrote to stderr."""
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own handler
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, capfd.readouterr().err.splitlines()


def test_collage_optimize_without_options_reads_the_records_defaults():
    assert parsed() == OptimizeOptions()


def test_every_option_of_collage_optimize_is_a_field_and_every_field_an_option():
    options = {action.dest for action in optimize_parser()._actions if action.option_strings} - {"help", "strict"}
    assert options == set(command_line_paths())
    left_to_the_api = {
        field.name for field in attrs.fields(OptimizeOptions) if field.name not in {path.split(".")[0] for path in command_line_paths()}
    }
    assert left_to_the_api == {"show_progress"}
    assert all(field_at(name).metadata["api_only"] for name in left_to_the_api)


def test_each_option_takes_its_help_from_its_field():
    for action in optimize_parser()._actions:
        if action.option_strings and action.dest in set(command_line_paths()):
            metadata = field_at(action.dest).metadata
            said = metadata["help_for_none"] if action.default is argparse.SUPPRESS else metadata["help"]
            assert said in action.help % {"default": action.default}, action.dest


@pytest.mark.parametrize("argv, fields", OPTION_CASES, ids=lambda value: " ".join(value) if isinstance(value, list) else "")
def test_each_option_sets_its_field_and_only_it(argv, fields):
    options = parsed(*argv)
    assert {path: value_at(options, path) for path in fields} == fields
    assert options == with_values(fields)


def test_every_option_has_a_case_above():
    assert {path for _, fields in OPTION_CASES for path in fields} == set(command_line_paths())


@pytest.mark.parametrize(
    "argv, keywords, name, problem",
    [
        (["--precision", "fp8"], {"precision": "fp8"}, "precision", "must be one of fp32, tf32, bf16, fp16, not 'fp8'"),
        (["--layout", "nchw4c"], {"layout": "nchw4c"}, "layout", "must be one of auto, model, nhwc, not 'nchw4c'"),
        (["--search", "one-level"], {"search": "one-level"}, "search", "must be one of op-level, two-level, not 'one-level'"),
        (["--budget", "-5"], {"two_level": TwoLevelSettings(budget_s=-5)}, "two_level.budget_s", "must be at least 0, not -5"),
        (["--population", "1"], {"two_level": TwoLevelSettings(population=1)}, "two_level.population", "must be at least 2, not 1"),
        (["--accuracy-budget", "-0.1"], {"accuracy_budget": -0.1}, "accuracy_budget", "must be more than 0, not -0.1"),
        (["--jobs", "-1"], {"settings": MeasureSettings(build_workers=-1)}, "settings.build_workers", "must be at least 0, not -1"),
        (["--accuracy-blocks", "0"], {"accuracy_blocks": 0}, "accuracy_blocks", "must be at least 1, not 0"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_value_out_of_range_is_refused_in_the_same_words_by_the_command_and_the_api(
    argv, keywords, name, problem, tmp_path, monkeypatch, capfd
):
    monkeypatch.chdir(tmp_path)
    code, stderr = run_main(["optimize", MODEL, *argv], capfd)
    assert code == 2 and stderr[-1] == f"collage optimize: error: argument {argv[0]}: {problem}"
    with pytest.raises(ArgumentError) as refused:
        collage_core.optimize(MODEL, **keywords)
    assert str(refused.value) == f"optimize: {name} {problem}"
    assert not list(tmp_path.iterdir())


def test_a_target_tvm_does_not_make_is_refused_in_tvms_words_by_the_command_and_the_api(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code, stderr = run_main(["optimize", MODEL, "--target", "nonsense"], capfd)
    with pytest.raises(TargetError) as refused:
        collage_core.optimize(MODEL, target="nonsense")
    assert str(refused.value).startswith("target 'nonsense'")
    assert code == 2 and stderr[-1] == f"collage optimize: error: argument --target: {refused.value}"


@pytest.mark.parametrize(
    "argv, keywords, message",
    [
        (
            ["--accuracy-budget", "0.01"],
            {"accuracy_budget": 0.01},
            "an accuracy budget needs --precision bf16 or fp16 (at fp32 there is nothing to give back)",
        ),
        (
            ["--precision", "tf32", "--accuracy-budget", "0.01"],
            {"precision": "tf32", "accuracy_budget": 0.01},
            "an accuracy budget needs --precision bf16 or fp16 (at tf32 there is nothing to give back)",
        ),
        (
            ["--precision", "bf16", "--accuracy-budget", "0.01", "--no-verify"],
            {"precision": "bf16", "accuracy_budget": 0.01, "verify": False},
            "an accuracy budget is held by measuring the outputs against the reference: it needs verification and a model "
            "with a reference (ONNX or PyTorch)",
        ),
        (
            ["--rpc-tracker", "127.0.0.1:9190"],
            {"rpc_tracker": "127.0.0.1:9190"},
            "--rpc-tracker and --rpc-key go together: the tracker's address and the key of its servers",
        ),
        (
            ["--placement", "p.json", "--accuracy-budget", "0.01"],
            {"placement": "p.json", "accuracy_budget": 0.01},
            "--accuracy-budget searches; a placement file is replayed as it was made, with the units it kept in float32",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_options_that_cannot_run_together_are_refused_in_the_same_words_before_the_model_is_read(
    argv, keywords, message, tmp_path, monkeypatch, capfd
):
    monkeypatch.chdir(tmp_path)
    assert run_main(["optimize", MODEL, *argv], capfd) == (cli.EXIT_ERROR, [f"collage: error: {message}"])
    with pytest.raises(CollageError) as refused:
        collage_core.optimize(MODEL, **keywords)
    assert str(refused.value) == message
    assert not list(tmp_path.iterdir())


def test_the_command_hands_optimize_the_record_it_read(tmp_path, monkeypatch, capfd):
    handed = []

    def stopped(model, **keywords):
        handed.append((model, keywords))
        raise CollageError("stopped before the model is read")

    monkeypatch.setattr(optimizer, "optimize", stopped)
    code, _ = run_main(["optimize", MODEL, "--precision", "bf16", "--population", "4", "-o", str(tmp_path)], capfd)
    assert code == cli.EXIT_ERROR
    assert handed == [
        (MODEL, {"options": OptimizeOptions(precision="bf16", two_level=TwoLevelSettings(population=4), output_dir=tmp_path)})
    ]


def test_the_api_takes_a_record_with_keywords_that_win_over_it_and_refuses_an_unknown_keyword():
    assert collage_core.OptimizeOptions is OptimizeOptions
    record = OptimizeOptions(precision="bf16", calibration_rounds=0)
    assert OptimizeOptions.given(record, {"precision": "fp16"}) == OptimizeOptions(precision="fp16", calibration_rounds=0)
    assert OptimizeOptions.given(None, {}) == OptimizeOptions()
    with pytest.raises(TypeError, match="unexpected keyword argument 'precison'"):
        collage_core.optimize(MODEL, precison="bf16")
    with pytest.raises(ArgumentError, match=r"^optimize: options must be a collage_core\.options\.OptimizeOptions, not dict"):
        collage_core.optimize(MODEL, options={"precision": "bf16"})


def test_optimize_shows_every_option_as_a_keyword_with_its_default():
    parameters = inspect.signature(collage_core.optimize).parameters
    for field in attrs.fields(OptimizeOptions):
        assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[field.name].default == field.default
