"""--accuracy-budget: units of a 16-bit model go back to float32 (exact weights, float32 arithmetic), chosen by
measured error until the placement holds the budget; the choice is kept in the placement file and replayed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tvm
from tvm import relax

from collage_core import cli, tvm_compat
from collage_core.candidates.enumeration import candidates_for
from collage_core.errors import CollageError
from collage_core.model import precision, widening
from collage_core.model.accuracy_budget import AccuracyBudgetError, blocks_of, fit
from collage_core.model.model_import import load_model
from collage_core.model.verify import compare_outputs
from collage_core.optimizer import optimize
from collage_core.outputs.placement_file import PlacementFileError, load_placement
from collage_core.search import accuracy_stage

MODELS = Path(__file__).resolve().parents[1] / "models"
CPU = tvm_compat.make_target(tvm_compat.host_cpu_target())


def run(mod, inputs) -> list:
    vm = relax.VirtualMachine(tvm.compile(mod, target=CPU), tvm.cpu())
    result = vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu()) for x in inputs])
    return [tvm_compat.to_numpy(r) for r in (result if not hasattr(result, "numpy") else [result])]


# tiny_bert in the default suite; the convolution net (10 s) and GPT-2 with --run-slow.
@pytest.mark.parametrize(
    "model", ["tiny_bert", pytest.param("tiny_resnet", marks=pytest.mark.slow), pytest.param("tiny_gpt2", marks=pytest.mark.slow)]
)
def test_every_unit_widened_computes_as_float32_does_and_none_widened_is_the_conversion(model):
    imported = load_model(MODELS / f"{model}.onnx")
    converted = precision.at_precision(imported, "bf16")
    units = widening.units(converted.mod)
    again = precision.at_precision(imported, "bf16").mod  # converted anew: another module, so its units are found anew
    assert len(units) >= 7 and units == widening.units(again)  # the same model has the same units
    assert widening.widen(converted.mod, [], imported.mod) is converted.mod
    inputs = imported.random_inputs()
    reference = imported.reference(inputs)
    exact = compare_outputs(run(imported.mod, inputs), reference, "onnxruntime")
    low = compare_outputs(run(converted.mod, inputs), reference, "onnxruntime")
    wide = compare_outputs(run(widening.widen(converted.mod, range(len(units)), imported.mod), inputs), reference, "onnxruntime")
    # Weights come back from the float32 model and no product sees a 16-bit operand: float32's error, not bf16's.
    assert wide.max_rel_error < 3 * exact.max_rel_error + 1e-6 < low.max_rel_error / 50, (exact, wide, low)


def test_a_widened_unit_reads_no_16_bit_value_and_the_others_keep_theirs():
    imported = load_model(MODELS / "tiny_bert.onnx")
    converted = precision.at_precision(imported, "fp16")
    units = widening.units(converted.mod)
    widened = precision.with_float32_units(converted, [0, len(units) - 1], imported)
    assert widened.float32_units == (0, len(units) - 1) and widened.precision == "fp16"
    assert widened.fingerprint == converted.fingerprint + f"+float32:0,{len(units) - 1}"

    def products(mod):
        found = []
        relax.analysis.post_order_visit(
            mod["main"],
            lambda e: (
                found.append(e)
                if isinstance(e, relax.Call) and tvm_compat.is_op_call(e) and tvm_compat.op_name(e) == "relax.matmul"
                else None
            ),
        )
        return [tvm_compat.tensor_shape_dtype(m.args[0])[1] for m in found]

    before, after = products(converted.mod), products(widened.mod)
    assert before.count("float16") == len(before) and after.count("float32") == 2 and after.count("float16") == len(before) - 2
    with pytest.raises(precision.PrecisionError, match=f"units 0-{len(units) - 1}, not \\[99\\]"):
        precision.with_float32_units(converted, [99], imported)


def test_blocks_split_units_in_order_and_evenly():
    assert blocks_of(8, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert blocks_of(3, 8) == [(0,), (1,), (2,)]
    assert sum(len(b) for b in blocks_of(97, 8)) == 97 and {len(b) for b in blocks_of(97, 8)} <= {12, 13}


def additive_error(contributions: dict):
    """A deterministic stand-in for measured error, for testing the choice only: independent rounding per unit."""
    probes, batches = [], []

    def errors_of(variants):
        batches.append(len(variants))
        probes.extend(variants)
        return [math.sqrt(sum(e**2 for unit, e in contributions.items() if unit not in float32_units)) + 1e-7 for float32_units in variants]

    errors_of.batches = batches
    return errors_of, probes


def test_the_blocks_bringing_most_error_go_back_first_and_the_first_choice_within_budget_is_kept():
    error_of, probes = additive_error({0: 1e-4, 1: 1e-4, 2: 1e-3, 3: 1e-3, 4: 5e-3, 5: 1e-4, 6: 1e-4, 7: 1e-4})
    fitted = fit(8, 2e-3, error_of, blocks=4, refinements=0)
    assert fitted.float32_units == (4, 5) and fitted.error <= 2e-3
    assert len(probes) == 1 + 4 + 1 and len(fitted.probes) == 6
    assert error_of.batches == [1, 4, 1]  # the blocks' probes are asked at once, to be built at once
    assert json.loads(json.dumps(fitted.to_json()))["float32_units"] == [4, 5]
    # Then the last block sent back is split: unit 5 brings little error and gets its 16 bits again, unit 4 does not.
    error_of, probes = additive_error({0: 1e-4, 1: 1e-4, 2: 1e-3, 3: 1e-3, 4: 5e-3, 5: 1e-4, 6: 1e-4, 7: 1e-4})
    fitted = fit(8, 2e-3, error_of, blocks=4)
    assert fitted.float32_units == (4,) and fitted.error <= 2e-3 and len(probes) == 6 + 2
    assert [p.why for p in fitted.probes[-2:]] == ["unit 4 back to 16 bits", "unit 5 back to 16 bits"]
    # A variant measured before is not probed again.
    error_of, probes = additive_error({0: 1e-3, 1: 1e-3})
    fitted = fit(2, 1.2e-3, error_of, blocks=2)
    assert len(probes) == len(set(probes)) == len(fitted.probes)

    error_of, probes = additive_error({0: 1e-4})
    assert fit(4, 1e-3, error_of).float32_units == () and len(probes) == 1  # already within: nothing changes


def test_a_budget_below_float32s_own_error_or_not_positive_is_refused():
    error_of, _ = additive_error({0: 1e-3, 1: 1e-3})
    with pytest.raises(AccuracyBudgetError, match="below what the placement measured with every unit in float32"):
        fit(2, 1e-8, error_of)
    with pytest.raises(AccuracyBudgetError, match="positive"):
        fit(2, 0.0, error_of)


@pytest.fixture()
def bf16_everywhere(monkeypatch):
    # TVM computes bfloat16 on any x86 CPU (slowly without bf16 units, which the check refuses): let it pass here.
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})


@pytest.mark.slow  # a minute: the whole optimize twice; the probes and the widening have quick tests of their own
def test_optimize_holds_the_budget_saves_the_choice_and_a_replay_widens_the_same_units(
    bf16_everywhere, tmp_path, capsys, monkeypatch, tvm_only_run
):
    model = MODELS / "tiny_bert.onnx"
    kwargs = tvm_only_run
    budget = 1e-4  # tiny_bert measures about 3e-4 with every unit at bf16, under 1e-6 in float32
    out = tmp_path / "out"
    held = optimize(model, precision="bf16", accuracy_budget=budget, accuracy_blocks=2, output_dir=out, **kwargs)
    assert held.accuracy.probes[0].float32_units == () and held.accuracy.probes[0].error > budget
    assert held.verification.passed and held.verification.max_rel_error <= budget
    assert (held.verification.rtol, held.verification.atol) == (budget, 0.0)
    assert held.accuracy.float32_units and held.model.float32_units == held.accuracy.float32_units
    assert held.placement.measured_error == held.verification.max_rel_error

    saved = load_placement(out / "placement.json")
    assert saved.float32_units == held.accuracy.float32_units and saved.accuracy_budget == budget
    results = json.loads((out / "results.json").read_text())["accuracy_budget"]
    assert results["float32_units"] == list(held.accuracy.float32_units) and len(results["probes"]) >= 2
    assert "units back in float32" in (out / "report.txt").read_text()

    def probing_again(*args, **kwargs):
        raise AssertionError("the rerun probed again")

    monkeypatch.setattr(accuracy_stage, "fit", probing_again)  # a rerun into the same directory reuses the probes
    again = optimize(model, precision="bf16", accuracy_budget=budget, accuracy_blocks=2, output_dir=out, **kwargs)
    assert again.accuracy == held.accuracy and again.placement.float32_units == held.placement.float32_units

    replayed = optimize(model, placement=out / "placement.json", **kwargs)
    assert replayed.model.fingerprint == held.model.fingerprint
    assert replayed.verification.max_rel_error == pytest.approx(held.verification.max_rel_error, rel=1e-3)

    assert cli.main(["show", str(out / "placement.json")]) == 0
    shown = capsys.readouterr().out
    assert "[bf16]" in shown and "[fp32]" in shown and f"accuracy budget {budget:g}, measured error" in shown


def test_a_budget_is_refused_at_fp32_and_when_replaying(bf16_everywhere, tmp_path):
    model = MODELS / "tiny_bert.onnx"
    with pytest.raises(CollageError, match="needs --precision bf16 or fp16"):
        optimize(model, backends=["tvm"], accuracy_budget=1e-3, show_progress=False)
    with pytest.raises(CollageError, match="needs verification"):
        optimize(model, backends=["tvm"], precision="bf16", accuracy_budget=1e-3, verify=False, show_progress=False)
    from collage_core.outputs.placement_file import Placement
    from collage_core.records import Cost, Partition

    whole = Partition("tvm", "tvm.op", [0], "k", Cost.measured(1e-6, 0.0, 3))
    made = Placement("tiny_bert", "f", ["relax.add"], {"kind": "llvm"}, "cpu", {}, "op-level", [whole], precision="bf16")
    with pytest.raises(CollageError, match="a placement file is replayed as it was made"):
        optimize(model, backends=["tvm"], placement=made.save(tmp_path / "p.json"), accuracy_budget=1e-3, show_progress=False)


def test_a_placement_file_with_bad_float32_units_is_refused_naming_the_file(tmp_path):
    from collage_core.outputs.placement_file import Placement
    from collage_core.records import Cost, Partition

    whole = Partition("tvm", "tvm.op", [0], "k", Cost.measured(1e-6, 0.0, 3))
    path = Placement(
        "m", "f", ["relax.add"], {"kind": "llvm"}, "cpu", {}, "op-level", [whole], precision="bf16", float32_units=[1, 2]
    ).save(tmp_path / "p.json")
    assert load_placement(path).float32_units == (1, 2)
    data = json.loads(path.read_text())
    for field, value, problem in [
        ("float32_units", [-1], "float32_units must be a list"),
        ("measured_error", "small", "measured_error must be a non-negative number"),
    ]:
        broken = dict(data, **{field: value})
        path.write_text(json.dumps(broken))
        with pytest.raises(PlacementFileError, match=f"p.json: {problem}"):
            load_placement(path)
    path.write_text(json.dumps(dict(data, precision="fp32")))
    with pytest.raises(PlacementFileError, match="float32_units given for a fp32 placement"):
        load_placement(path)


@pytest.mark.slow  # 22 s: six builds; how probes are chosen (fit) and widened have quick tests above
def test_probes_built_at_once_from_the_held_model_are_the_variants_each_sent_whole(bf16_everywhere, tmp_path, monkeypatch):
    from collage_core.backends import discover_backends, select_backends
    from collage_core.measure.job import Job
    from collage_core.measure.timing import MeasureSettings
    from collage_core.model.probes import outputs_of_variants
    from collage_core.model.relax_graph import RelaxGraph
    from collage_core.plugins import get_plugin_manager
    from collage_core.records import Cost
    from collage_core.search.baselines import searched_parts

    original = load_model(MODELS / "tiny_bert.onnx")
    converted = precision.at_precision(original, "bf16")
    count = len(widening.units(converted.mod))
    pm = get_plugin_manager()
    chosen = select_backends(discover_backends(pm), ["tvm"])

    def job_of(model) -> Job:
        return Job(
            model,
            RelaxGraph.from_function(model.mod["main"], model.mod),
            CPU,
            pm,
            chosen,
            MeasureSettings(),
            tmp_path,
            lambda message: None,
            False,
        )

    placed = []
    for units in [(), (0, count - 1), tuple(range(count))]:  # placed by the search on equal costs: any valid placement
        job = job_of(precision.with_float32_units(converted, units, original))
        candidates = candidates_for(pm, job.graph, chosen, CPU, converted.precision)
        placed.append((units, searched_parts(job.graph, candidates, {c.key: Cost.measured(1e-3, 0.0, 1) for c in candidates})))
    base = job_of(converted)
    at_once = outputs_of_variants(base, original, placed, workers=2)
    monkeypatch.setenv("COLLAGE_FRESH_WORKERS", "exec")  # no zygote: each variant is widened here and sent whole
    whole = outputs_of_variants(base, original, placed, workers=1)
    for held, sent in zip(at_once, whole):
        assert all((h == s).all() for h, s in zip(held, sent))
    reference = original.reference(base.inputs)
    errors = [compare_outputs(outputs, reference, "onnxruntime").max_rel_error for outputs in at_once]
    assert errors[2] < 1e-5 < errors[0] / 10, errors  # every unit widened in the worker computes as float32 does
