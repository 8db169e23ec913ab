"""Each engine's own session over the original model file: a contender Collage measures beside its
placements and returns when it wins (collage_core.model.original_model), and the hook that makes it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_optimize import op_level_costs_from
from tvm import relax

import collage_core
from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.hookspecs import hookimpl
from collage_core.measure.timing import MeasureSettings
from collage_core.model import original_model
from collage_core.model.model_import import load_model
from collage_core.outputs.end_to_end import PLACEMENT, SEARCHED, EndToEnd
from collage_core.outputs.placement_file import PlacementFileError, placement_from_json
from collage_core.outputs.result import SEARCHED_PLACEMENT_FILE
from collage_core.plugins import get_plugin_manager
from collage_core.records import GRAPH_LEVEL, Cost, Partition
from collage_core.search.baselines import IN_TURNS, MAX_RIVALS, closest_rivals
from collage_core.search.calibration import signature

MODELS = Path(__file__).resolve().parents[1] / "models"
TINY_RESNET = MODELS / "tiny_resnet.onnx"
TINY_BERT = MODELS / "tiny_bert.onnx"
TARGET = tvm_compat.host_cpu_target()
SESSION = original_model.contender_name("onnxruntime")
# ONNX Runtime's session against ONNX Runtime's reference: the same kernels, with Collage's thread count.
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture(scope="module")
def engines():
    pm = get_plugin_manager()
    infos = discover_backends(pm)
    if "onnxruntime" not in infos or not infos["onnxruntime"].availability.available:
        pytest.skip("ONNX Runtime's plugin is not installed or cannot run here")
    return pm, {name: info.backend for name, info in infos.items()}


class WrongSignature:
    """A plugin whose own session of the model takes no inputs: a broken contract."""

    @hookimpl(tryfirst=True)
    def collage_lower_whole_model(self, backend, func, name):
        return relax.Function([], relax.const(np.zeros((1,), "float32")))


class Raises:
    @hookimpl(tryfirst=True)
    def collage_lower_whole_model(self, backend):
        raise RuntimeError("cannot read this file")


def test_collage_lower_whole_model_gives_main_one_session_over_the_file_or_says_which_plugin_broke_the_contract(engines):
    """The module calls one function, the engine's session lowered from the file's bytes, with the model's
    inputs and outputs; a model without a file gets none, and a plugin that raises or returns a function of
    other inputs and outputs is named in one error."""
    pm, backends = engines
    model = load_model(TINY_RESNET)
    mod = original_model.lowered_module(pm, model, backends["onnxruntime"], TARGET)
    assert sorted(gvar.name_hint for gvar in mod.functions) == ["collage_onnxruntime_0", "main"]
    session = mod["collage_onnxruntime_0"]
    assert original_model.is_lowered_already(session) and not original_model.is_lowered_already(mod["main"])
    assert tvm_compat.structural_equal(tvm_compat.return_type(mod["main"]), tvm_compat.return_type(model.mod["main"]))
    assert [tvm_compat.tensor_shape_dtype(p) for p in mod["main"].params] == [(s.shape, s.dtype) for s in model.inputs]

    relax_only = load_model(model.mod, name="relax_module")
    assert relax_only.original is None
    assert original_model.lowered_module(pm, relax_only, backends["onnxruntime"], TARGET) is None
    assert original_model.lowered_module(pm, model, backends["tvm"], TARGET) is None  # TVM reads no model files

    # A plugin that raises leaves the answer to the others: here none runs files for TVM.
    for plugin, backend, complaint in (
        (
            WrongSignature(),
            "onnxruntime",
            "backend onnxruntime: collage_lower_whole_model returned a function that does not take the model's inputs and give its outputs",
        ),
        (
            Raises(),
            "tvm",
            "backend tvm: running the original model failed: plugin broken: collage_lower_whole_model "
            "raised RuntimeError: cannot read this file",
        ),
    ):
        pm.register(plugin, name="broken")
        try:
            with pytest.raises(original_model.OriginalModelError, match=re.escape(complaint)):
                original_model.lowered_module(pm, model, backends[backend], TARGET)
        finally:
            pm.unregister(name="broken")


def test_an_engines_own_session_is_another_placement_than_its_conversion_and_always_a_rival():
    """Its one partition holds the same operators as the engine alone over Collage's conversion: the two are
    told apart; and every engine's own session is timed in turns even when the closest baselines are others."""

    def parts(backend, pattern="region", seconds=1e-3):
        return [Partition(backend, f"{backend}.{pattern}", (0, 1), "key", Cost.measured(seconds, 0.0, 1))]

    def row(name, seconds, rival_parts):
        return EndToEnd(name, Cost.measured(seconds, 0.0, 5), {}), rival_parts

    converted, own = parts("onnxruntime"), parts("onnxruntime", original_model.ORIGINAL_MODEL)
    assert signature(converted) != signature(own) and original_model.engine_of(own) == "onnxruntime"
    assert original_model.engine_of(converted) is None
    crowd = [row(f"near {i}", 0.1 + 0.001 * i, parts(backend)) for i, backend in enumerate("abcdefg")]
    sessions = [row("openvino's own session", 0.3, parts("openvino", original_model.ORIGINAL_MODEL)), row(SESSION, 0.2, own)]
    rivals = closest_rivals(crowd + sessions, converted, Cost.measured(0.1, 0.0, 5), MeasureSettings())
    assert [entry.name for entry, _ in rivals] == ["near 0", "near 1", SESSION, "openvino's own session"]
    assert len(rivals) == MAX_RIVALS
    # The searched placement being the engine alone over the conversion leaves its own session a rival.
    rivals = closest_rivals([row(SESSION, 0.2, own)], converted, Cost.measured(0.1, 0.0, 5), MeasureSettings())
    assert [entry.name for entry, _ in rivals] == [SESSION]


def placement_json(**changes) -> dict:
    data = {
        "format": "collage-placement",
        "version": 1,
        "model": {"name": "m", "fingerprint": "f", "operators": ["relax.nn.relu", "relax.add"]},
        "target": {"kind": "llvm"},
        "device": "llvm",
        "backends": {},
        "search": "op-level",
        "partitions": [
            {
                "backend": "onnxruntime",
                "pattern": "onnxruntime.original_model",
                "operators": [0, 1],
                "key": "onnxruntime.original_model:abc",
                "cost": Cost.unknown().to_json(),
            }
        ],
        "original_model": {"engine": "onnxruntime", "format": "onnx", "sha256": "abc"},
    }
    return {**data, **changes}


def test_a_placement_file_says_which_file_an_engines_own_session_runs():
    placement = placement_from_json(placement_json(), "p.json")
    assert placement.original_model == {"engine": "onnxruntime", "format": "onnx", "sha256": "abc"}
    assert placement_from_json(placement.to_json(), "again") == placement
    with pytest.raises(PlacementFileError, match="does not say which file"):
        placement_from_json({k: v for k, v in placement_json().items() if k != "original_model"}, "p.json")
    with pytest.raises(PlacementFileError, match="not that one session"):
        placement_from_json(placement_json(original_model={"engine": "openvino", "format": "onnx", "sha256": "abc"}), "p.json")


def test_a_model_that_is_not_a_file_has_no_own_sessions_and_the_run_says_so():
    from collage_core.build.stage import own_sessions

    said = []
    engine = SimpleNamespace(kind=GRAPH_LEVEL)
    job = SimpleNamespace(
        imported=SimpleNamespace(original=None, onnx_export=None, source="torch", precision="fp32"),
        graph=SimpleNamespace(graph=[0, 1]),
        backends={"onnxruntime": engine},
        say=said.append,
    )
    assert own_sessions(job, None, None) == []
    assert said == [
        "no engine's own session over the original model is a contender: the model is a PyTorch module, "
        "not a file they read (export it to ONNX and give Collage the file to have them)"
    ]


def own_session_fastest(libraries, *args, **kwargs):
    """A contest in turns that ONNX Runtime's own session wins, 1 ms against 2 ms, whatever the machine does."""
    from collage_core.measure.in_turns import LibraryTurns

    return {name: LibraryTurns(*[Cost.measured(1e-3 if name == SESSION else 2e-3, 1e-5, 20)] * 2, 1.0) for name in libraries}


@pytest.fixture(scope="module")
def session_won(engines, tmp_path_factory, shared_cost_db):
    """tiny_resnet over TVM and ONNX Runtime, TVM's candidates costed by a deterministic model, in a contest
    that ONNX Runtime's own session wins."""
    from collage_core.build import stage as build_stage

    out = tmp_path_factory.mktemp("own-session") / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(build_stage, "time_in_turns", own_session_fastest)
        op_level_costs_from(monkeypatch, lambda candidate, ops: Cost.measured(1e-3, 0.0, 1))
        result = collage_core.optimize(
            str(TINY_RESNET),
            backends=["tvm", "onnxruntime"],
            cost_db=shared_cost_db,
            output_dir=out,
            search="op-level",
            calibration_rounds=0,
            show_progress=False,
        )
    return result, out


def test_an_engines_own_session_that_wins_the_contest_is_the_result_saved_replayed_and_exported(
    session_won, engines, tmp_path, monkeypatch, capsys
):
    from collage_core.build import stage as build_stage
    from collage_core.cli import main
    from collage_core.outputs.mlf import load_mlf

    result, out = session_won
    digest = result.model.original.digest
    assert result.placement.partitions == (
        Partition(
            "onnxruntime",
            "onnxruntime.original_model",
            range(45),
            f"onnxruntime.original_model:{digest}",
            result.placement.partitions[0].cost,
        ),
    )
    assert result.placement.original_model == {"engine": "onnxruntime", "format": "onnx", "sha256": digest}
    assert [(e.name, e.timed_in_turns) for e in result.end_to_end[:2]] == [(PLACEMENT, True), (f"{SEARCHED}, {IN_TURNS}", True)]
    assert result.latency() == Cost.measured(1e-3, 1e-5, 20)
    assert any(e.name == SESSION and not e.timed_in_turns and e.cost.is_measured for e in result.end_to_end)
    why = result.placement.why_chosen
    assert why.startswith(
        f"{SESSION} won the contest in turns: 1.000 ms against the searched placement's 2.000 ms, 2.00x; "
        f"{SESSION} runs the original model file as its users run it"
    )
    assert result.verification.passed
    inputs = result.model.random_inputs(seed=6)
    np.testing.assert_allclose(result.run(*inputs)[0], result.model.reference(inputs)[0], rtol=RTOL, atol=ATOL)
    saved = json.loads((out / "placement.json").read_text())
    assert saved["original_model"]["sha256"] == digest and saved["why_chosen"] == why
    assert f"why this placement: {why}" in (out / "report.txt").read_text().splitlines()
    assert json.loads((out / "results.json").read_text())["why_chosen"] == why
    assert (out / SEARCHED_PLACEMENT_FILE).exists()
    assert json.loads((out / f"{result.model.name}.so.runtime.json").read_text())["backends"].keys() == {"onnxruntime"}

    def must_not_run(*args, **kwargs):
        raise AssertionError("a replay measures no baselines and times no contest")

    monkeypatch.setattr(build_stage, "baselines", must_not_run)
    replayed = collage_core.optimize(
        str(TINY_RESNET),
        placement=out / "placement.json",
        backends=["tvm", "onnxruntime"],
        output_dir=tmp_path / "replay",
        show_progress=False,
    )
    assert replayed.placement.partitions == result.placement.partitions and replayed.verification.passed
    assert [(e.name, e.operators_by_backend) for e in replayed.end_to_end] == [(PLACEMENT, {"onnxruntime": 45})]

    tar = tmp_path / "tiny_resnet.tar"
    assert main(["export", str(TINY_RESNET), "--placement", str(out / "placement.json"), "-o", str(tar)]) == 0
    exported = load_mlf(tar)
    assert exported.metadata["placement"]["backends"] == {"onnxruntime": {"partitions": 1, "operators": 45}}
    np.testing.assert_allclose(exported.run(*inputs)[0], result.model.reference(inputs)[0], rtol=RTOL, atol=ATOL)
    capsys.readouterr()

    assert main(["optimize", str(TINY_BERT), "--placement", str(out / "placement.json"), "-o", str(tmp_path / "bert")]) != 0
    error = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]
    assert error == [
        f"collage: error: {out / 'placement.json'}: runs the original model file on {SESSION}, made from a "
        f"file of SHA-256 {digest[:12]}..., and this model's is {load_model(TINY_BERT).original.digest[:12]}...: "
        "it is another model; optimize this one"
    ]


class TwoInputs(torch.nn.Module):
    """A module of two inputs returning a dict: its export must take them in order and give its tensors flattened."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, features, scale):
        hidden = self.norm(self.linear(features)) * scale
        return {"hidden": torch.nn.functional.gelu(hidden), "sum": hidden.sum(-1)}


def test_a_pytorch_modules_onnx_export_gives_it_engines_own_sessions_whose_winner_is_returned_and_replayed(
    engines, tmp_path, monkeypatch, shared_cost_db
):
    """A PyTorch module has no file: its ONNX export stands for one, so an engine's own session is a contender.
    Here ONNX Runtime's session over the export wins a contest whose result is fixed; it is verified against
    PyTorch, computes what the module does on other inputs, and replays on the same module; a module of
    other weights is another model, refused in one line."""
    import torch

    from collage_core.build import stage as build_stage

    torch.manual_seed(0)
    module = TwoInputs().eval()
    example = (torch.randn(2, 16), torch.full((2, 1), 0.5))
    with monkeypatch.context() as patched:
        patched.setattr(build_stage, "time_in_turns", own_session_fastest)
        op_level_costs_from(patched, lambda candidate, ops: Cost.measured(1e-3, 0.0, 1))
        result = collage_core.optimize(
            module,
            example_inputs=example,
            backends=["tvm", "onnxruntime"],
            cost_db=shared_cost_db,
            output_dir=tmp_path / "out",
            search="op-level",
            calibration_rounds=0,
            show_progress=False,
        )
    digest = result.model.original.digest
    assert [part.pattern for part in result.placement.partitions] == ["onnxruntime.original_model"]
    assert result.placement.original_model == {"engine": "onnxruntime", "format": "onnx", "sha256": digest}
    assert result.verification.passed and [spec.name for spec in result.model.inputs] == ["features", "scale"]
    features, scale = np.random.default_rng(3).standard_normal((2, 16), dtype="float32"), np.full((2, 1), 2.0, "float32")
    with torch.no_grad():
        expected = module(torch.from_numpy(features), torch.from_numpy(scale))
    hidden, total = result.run(features, scale)
    np.testing.assert_allclose(hidden, expected["hidden"].numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(total, expected["sum"].numpy(), rtol=RTOL, atol=ATOL)

    same = TwoInputs().eval()
    same.load_state_dict(module.state_dict())
    replayed = collage_core.optimize(
        same, example_inputs=example, placement=tmp_path / "out" / "placement.json", output_dir=tmp_path / "replay", show_progress=False
    )
    assert replayed.placement.partitions == result.placement.partitions and replayed.verification.passed

    other = TwoInputs().eval()  # other weights: another export
    with pytest.raises(
        PlacementFileError,
        match=f"made from a file of SHA-256 {digest[:12]}.*changes with its weights and with the PyTorch version.*it is another model",
    ):
        collage_core.optimize(
            other, example_inputs=example, placement=tmp_path / "out" / "placement.json", output_dir=tmp_path / "other", show_progress=False
        )


def test_a_pytorch_module_is_exported_only_for_a_run_with_own_sessions_and_one_whose_export_fails_says_why(engines):
    import torch

    from collage_core.build.stage import own_sessions_wanted
    from collage_core.model.torch_onnx import TorchExportError, with_onnx_original
    from collage_core.options import OptimizeOptions

    pm = get_plugin_manager()
    infos = discover_backends(pm)
    engine, op_level, graph_level = infos["onnxruntime"], infos["tvm"], infos["inductor"]
    fp32, bf16 = SimpleNamespace(precision="fp32"), SimpleNamespace(precision="bf16")
    searching = OptimizeOptions()
    assert own_sessions_wanted(fp32, [op_level, engine], searching, None, pm)
    assert not own_sessions_wanted(fp32, [op_level], searching, None, pm)  # no engine: nothing to export for
    assert not own_sessions_wanted(fp32, [op_level, graph_level], searching, None, pm)  # Inductor runs no model files
    assert not own_sessions_wanted(bf16, [op_level, engine], searching, None, pm)  # the file computes in float32
    assert not own_sessions_wanted(fp32, [op_level, engine], OptimizeOptions(compare_backends=False), None, pm)
    assert own_sessions_wanted(fp32, [op_level], searching, SimpleNamespace(original_model={"engine": "onnxruntime"}), pm)

    class Unused(torch.nn.Module):
        def forward(self, x, ignored):
            return x * 2

    module = Unused()
    imported = load_model(module, (torch.ones(2), torch.ones(2)))
    with pytest.raises(TorchExportError, match="its ONNX export takes x, not x, ignored"):
        imported.onnx_export()
    said = []
    assert with_onnx_original(imported, True, said.append) is imported and imported.original is None
    assert said == [
        "no engine's own session over the module is a contender: PyTorch module Unused: its ONNX export takes x, not x, ignored "
        "(the exporter drops an input forward does not use)"
    ]
    assert with_onnx_original(imported, False, said.append) is imported and len(said) == 1


class Differences(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = torch.nn.Dropout(0.5)  # in eval mode, nothing: the export must have none either

    def forward(self, x):
        return torch.diff(self.dropout(x))  # the TorchScript exporter has no ONNX for aten::diff at opset 17 (GPT-2's masks call it)


def test_a_failed_export_is_one_line_without_the_exporters_graph_dump(capfd, monkeypatch):
    from collage_core.model import torch_onnx

    monkeypatch.setattr(torch_onnx, "_exported_from_program", lambda *args: None)  # as where onnxscript is not installed
    imported = load_model(Differences(), (torch.arange(6.0),))
    capfd.readouterr()
    with pytest.raises(torch_onnx.TorchExportError, match="PyTorch module Differences: its ONNX export failed: .*aten::diff"):
        imported.onnx_export()
    printed = capfd.readouterr()
    assert "graph" not in printed.out + printed.err, printed


def test_what_the_torchscript_exporter_refuses_is_exported_from_the_torch_export_program(capfd):
    import onnx
    import onnxruntime

    pytest.importorskip("onnxscript", reason="PyTorch's exporter from torch.export programs needs onnxscript")
    imported = load_model(Differences(), (torch.arange(6.0),))
    capfd.readouterr()
    exported = imported.onnx_export()
    assert "torchvision" not in capfd.readouterr().err  # the exporter's notices, dropped
    x = np.array([1.0, 4.0, 9.0, 16.0, 25.0, 36.0], "float32")
    session = onnxruntime.InferenceSession(exported.data, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {imported.inputs[0].name: x})[0], np.diff(x), rtol=RTOL, atol=ATOL)
    assert load_model(Differences(), (torch.arange(6.0),)).onnx_export().digest == exported.digest  # the same file again
    assert "Dropout" not in {node.op_type for node in onnx.load_from_string(exported.data).graph.node}


def _traced_pair():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x * 2, x + 1

    return torch.jit.trace(Pair(), (torch.ones(2, 3),)), (torch.ones(2, 3),)


def _encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval(), (torch.randn(1, 8, 32),)


@pytest.mark.parametrize("made", [_traced_pair, _encoder], ids=["traced module", "TransformerEncoder (fused attention in eval)"])
def test_a_modules_onnx_export_computes_what_the_module_does_in_onnx_runtime(made):
    """A traced module is exported as it is (it cannot be traced inside another); a TransformerEncoder with PyTorch's
    fused attention off for the export, and back on after."""
    import onnxruntime

    module, example = made()
    imported = load_model(module, example)
    exported = imported.onnx_export()
    assert torch.backends.mha.get_fastpath_enabled()
    inputs = [np.random.default_rng(1).standard_normal(tuple(x.shape), dtype="float32") for x in example]
    session = onnxruntime.InferenceSession(exported.data, providers=["CPUExecutionProvider"])
    got = session.run(None, {spec.name: array for spec, array in zip(imported.inputs, inputs)})
    for have, want in zip(got, imported.reference(inputs), strict=True):
        np.testing.assert_allclose(have, want, rtol=RTOL, atol=ATOL)
