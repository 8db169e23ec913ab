"""Shape profiles (``--shapes``): reading them, the padding rule, the dispatcher, the library that holds every
profile's placement, and ``optimize`` over a model with a symbolic batch and sequence, checked against ONNX Runtime."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import tvm
from onnx import TensorProto, helper
from shape_runs import optimized_for_shapes
from tvm import relax

import collage_core
from collage_core.build.profiles import entry_function, merged_module
from collage_core.errors import CollageError
from collage_core.model.padding import PaddingRule, padding_rule
from collage_core.model.shape_profiles import ShapeProfileError, parse_shapes, static_onnx, symbolic_inputs
from collage_core.outputs.dispatch import ShapeDispatch, ShapeNotServed, ShapeRecordError
from collage_core.outputs.index_ranges import IndexOutOfRange
from collage_core.outputs.placement_file import Placement
from collage_core.outputs.profiled_result import PLACEMENTS_FILE
from collage_core.outputs.run_inputs import InputMismatch
from collage_core.outputs.shape_differences import placement_differences
from collage_core.records import Cost, Partition

MODELS = Path(__file__).resolve().parents[1] / "models"
DYNAMIC_BERT = MODELS / "tiny_bert_dynamic.onnx"
# Few, short repeats: these tests check what the library computes and holds, not how fast it runs.
# ONNX Runtime against its own runs, and the library's float32 kernels against ONNX Runtime's.
RTOL, ATOL = 1e-4, 1e-5


def bert_inputs():
    return symbolic_inputs(onnx.load(str(DYNAMIC_BERT)))


def session_reference(proto):
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [value.name for value in proto.graph.input]
    return lambda arrays: session.run(None, dict(zip(names, arrays)))


def test_the_shipped_dynamic_model_names_its_batch_and_sequence():
    inputs = bert_inputs()
    assert [(spec.name, spec.dims, spec.dtype) for spec in inputs] == [
        ("input_ids", ("batch", "sequence"), "int64"),
        ("attention_mask", ("batch", "sequence"), "int64"),
    ]


def test_sizes_by_dimension_make_every_combination_in_order():
    profiles = parse_shapes("batch=1,8 sequence=128,512", bert_inputs())
    assert [p.label for p in profiles] == ["batch=1 sequence=128", "batch=1 sequence=512", "batch=8 sequence=128", "batch=8 sequence=512"]
    assert profiles[2].shape_of("attention_mask") == (8, 128)


def test_shapes_by_input_pair_up_and_bind_the_other_inputs():
    profiles = parse_shapes("input_ids=1x128,8x128,8x512", bert_inputs())
    assert [p.label for p in profiles] == ["batch=1 sequence=128", "batch=8 sequence=128", "batch=8 sequence=512"]
    assert [p.shape_of("attention_mask") for p in profiles] == [(1, 128), (8, 128), (8, 512)]


def test_a_shape_listed_twice_is_optimized_once():
    assert len(parse_shapes("batch=1,1 sequence=16", bert_inputs())) == 1


@pytest.mark.parametrize(
    "text, says",
    [
        ("batch=1", "give sizes for sequence too"),
        ("batch=1 sequence=16 width=3", "'width' is neither a symbolic dimension (batch, sequence) nor an input"),
        ("batch=1,x sequence=16", "not a list of sizes"),
        ("batch=0 sequence=16", "at least 1"),
        ("input_ids=1x16 batch=2", "not both"),
        ("input_ids=1x16x3", "rank 2"),
        ("input_ids=1x16 attention_mask=2x16", "gives batch two sizes"),
        ("input_ids=1x16 batch=1,2 sequence=8", "not both"),
        ("input_ids=1x16,2x16 attention_mask=1x16", "as many shapes"),
        ("batch", "is not NAME=SIZES"),
        ("batch=1 batch=2 sequence=3", "listed twice"),
        ("batch=99999999999 sequence=99999999", "input 'input_ids' alone would take"),  # before any array of it is made
    ],
)
def test_shapes_that_do_not_fit_the_model_are_refused_in_one_line(text, says):
    with pytest.raises(ShapeProfileError, match=re.escape(says)) as raised:
        parse_shapes(text, bert_inputs())
    assert "\n" not in str(raised.value)


def test_a_model_of_static_shapes_needs_no_shapes():
    with pytest.raises(ShapeProfileError, match="no symbolic dimensions"):
        parse_shapes("batch=1", symbolic_inputs(onnx.load(str(MODELS / "tiny_bert.onnx"))))


def test_optimizing_the_dynamic_model_without_shapes_says_to_list_them():
    with pytest.raises(collage_core.CollageError, match="--shapes, e.g. 'batch=1,8 sequence=1,8'"):
        collage_core.optimize(str(DYNAMIC_BERT), backends=["tvm"], show_progress=False)


def test_a_static_copy_has_the_profiles_sizes_and_computes_what_the_original_does():
    proto = onnx.load(str(DYNAMIC_BERT))
    profile = parse_shapes("batch=2 sequence=5", bert_inputs())[0]
    static = static_onnx(proto, profile)
    assert [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in static.graph.input] == [[2, 5], [2, 5]]
    assert [d.dim_value for d in static.graph.output[0].type.tensor_type.shape.dim] == [2, 5, 64]
    arrays = [np.random.default_rng(0).integers(0, 1000, (2, 5)), np.ones((2, 5), np.int64)]
    np.testing.assert_allclose(session_reference(static)(arrays)[0], session_reference(proto)(arrays)[0], rtol=RTOL, atol=ATOL)


def test_the_masked_encoder_may_be_padded_along_batch_and_sequence():
    proto = onnx.load(str(DYNAMIC_BERT))
    profiles = parse_shapes("batch=1,4 sequence=8,16", bert_inputs())
    rule = padding_rule(proto, bert_inputs(), profiles, session_reference(proto))
    assert rule == PaddingRule((("batch", ((0, 0),)), ("sequence", ((0, 1),))), ())


def softmax_model(rows: str = "batch", columns: str = "sequence", input_name: str = "x"):
    """Softmax along a symbolic second axis, with no mask: padding it changes every real position's output."""
    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [rows, columns])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, columns])
    graph = helper.make_graph([helper.make_node("Softmax", [input_name], ["y"], axis=1)], "softmax", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def unmasked_softmax_model():
    return softmax_model()


def test_padding_that_changes_the_real_positions_is_refused_and_the_batch_is_still_padded():
    proto = unmasked_softmax_model()
    inputs = symbolic_inputs(proto)
    rule = padding_rule(proto, inputs, parse_shapes("batch=1,4 sequence=8", inputs), session_reference(proto))
    assert rule.allows("batch") and not rule.allows("sequence")
    assert "changes the real positions' outputs" in dict(rule.refused)["sequence"]


def test_an_output_axis_the_inputs_do_not_name_refuses_padding():
    proto = unmasked_softmax_model()
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "unk__0"
    inputs = symbolic_inputs(proto)
    rule = padding_rule(proto, inputs, parse_shapes("batch=1,4 sequence=8", inputs), session_reference(proto))
    assert not rule.allowed and "output 0's axis 1 is unk__0" in dict(rule.refused)["batch"]


def bert_dispatch(padding=PaddingRule((("batch", ((0, 0),)), ("sequence", ((0, 1),))), ())):
    profiles = parse_shapes("batch=1,4 sequence=8,16", bert_inputs())
    return ShapeDispatch(tuple(bert_inputs()), tuple(profiles), tuple(entry_function(i) for i in range(len(profiles))), padding)


def test_a_call_runs_on_its_own_shape_else_the_smallest_that_covers_it_padded():
    dispatch = bert_dispatch()
    assert dispatch.choose([(4, 8), (4, 8)]).function == "main_shape3"
    assert not dispatch.choose([(4, 8), (4, 8)]).padded
    choice = dispatch.choose([(3, 9), (3, 9)])
    assert (choice.function, choice.cuts, choice.padded) == ("main_shape4", {(0, 0): 3, (0, 1): 9}, True)
    assert dispatch.choose([(1, 5), (1, 5)]).function == "main_shape1"
    assert dispatch.choose([(2, 8), (2, 8)]).function == "main_shape3"


def test_a_call_no_shape_serves_is_refused_naming_the_shapes_held():
    with pytest.raises(
        ShapeNotServed, match=r"input_ids 5x8, attention_mask 5x8: no listed shape covers it; this library holds the shapes batch=1"
    ):
        bert_dispatch().choose([(5, 8), (5, 8)])
    unpaddable = bert_dispatch(PaddingRule((("batch", ((0, 0),)),), (("sequence", "zero padding changes it"),)))
    with pytest.raises(ShapeNotServed, match="'sequence' cannot be padded \\(zero padding changes it\\)"):
        unpaddable.choose([(1, 9), (1, 9)])
    with pytest.raises(ShapeNotServed, match="gives 'sequence' the size 9, another input 8"):
        bert_dispatch().choose([(1, 8), (1, 9)])


def test_the_dispatchers_record_reads_back_the_same_in_input_order_whatever_order_the_file_keeps():
    inputs = symbolic_inputs(softmax_model("seq", "batch"))
    profiles = parse_shapes("seq=4 batch=2", inputs)
    dispatch = ShapeDispatch(tuple(inputs), tuple(profiles), ("main_shape1",), PaddingRule())
    again = ShapeDispatch.from_json(json.loads(json.dumps(dispatch.to_json(), sort_keys=True)))
    assert again == dispatch and again.profiles[0].label == "seq=4 batch=2"
    assert again.choose([(4, 2)]).function == "main_shape1"


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda d: d["profiles"][0]["sizes"].pop("sequence"), "sizes for ['batch']"),
        (lambda d: d["profiles"][0]["sizes"].update(batch=0), "whole numbers of at least 1"),
        (lambda d: d["profiles"][1].update(function="main_shape1"), "two shapes with one entry function"),
        (lambda d: d["padding"]["allowed"].update(width=[[0, 1]]), "padding rule names a dimension"),
        (lambda d: d.pop("inputs"), "KeyError"),
        (lambda d: d.update(profiles="x"), "cannot be read"),
    ],
)
def test_a_spoilt_record_of_shapes_is_refused_in_one_line_naming_it(spoil, says):
    data = json.loads(json.dumps(bert_dispatch().to_json()))
    spoil(data)
    with pytest.raises(ShapeRecordError, match=re.escape(says)) as raised:
        ShapeDispatch.from_json(data, "placements.json")
    assert str(raised.value).startswith("placements.json: ") and "\n" not in str(raised.value)


def test_a_dimension_named_as_an_input_is_read_by_the_form_of_its_sizes():
    inputs = symbolic_inputs(softmax_model("batch", "x", input_name="x"))
    assert [p.label for p in parse_shapes("batch=1,2 x=8", inputs)] == ["batch=1 x=8", "batch=2 x=8"]
    assert [p.label for p in parse_shapes("x=1x8,2x8", inputs)] == ["batch=1 x=8", "batch=2 x=8"]


def test_an_input_without_a_recorded_shape_is_refused_in_one_line():
    proto = softmax_model("batch", "sequence")
    proto.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ShapeProfileError, match="records no shape"):
        symbolic_inputs(proto)


def doubling_module(rows: int, weight: np.ndarray) -> tvm.IRModule:
    """``main(x) = part(x) @ weight``, ``part`` a private function and a TIR kernel of ``rows`` x 4."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 4), "float32"))
    with bb.function("part", [x], private=True):
        with bb.dataflow():
            doubled = bb.emit_te(lambda a: tvm.te.compute(a.shape, lambda i, j: a[i, j] * 2.0, name="double"), x)
            out = bb.emit_output(doubled)
        bb.emit_func_output(out)
    part = bb.get().get_global_var("part")
    y = relax.Var("x", relax.TensorType((rows, 4), "float32"))
    with bb.function("main", [y]):
        with bb.dataflow():
            called = bb.emit(relax.Call(part, [y]))
            out = bb.emit_output(relax.op.matmul(called, relax.const(weight)))
        bb.emit_func_output(out)
    return bb.get()


def test_merged_profiles_keep_their_own_functions_and_share_a_weight(tmp_path):
    weight = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    merged = merged_module([doubling_module(2, weight), doubling_module(3, weight)])
    names = sorted(gvar.name_hint for gvar in merged.get_global_vars())
    assert "main_shape1" in names and "main_shape2" in names and "part_shape1" in names and "part_shape2" in names
    assert "main" not in names
    vm = relax.VirtualMachine(relax.build(merged, "llvm"), tvm.cpu())
    for index, rows in enumerate((2, 3)):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype("float32")
        out = vm[entry_function(index)](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(out, (2 * x) @ weight, rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes") / "out"
    return optimized_for_shapes(str(DYNAMIC_BERT), "batch=1,2 sequence=8", folder), folder


def test_one_library_answers_each_shape_and_a_padded_one_as_onnxruntime_does(optimized):
    result, _ = optimized
    assert [p.label for p in result.dispatch.profiles] == ["batch=1 sequence=8", "batch=2 sequence=8"]
    assert result.verified and len(result.checks) == 3
    reference = session_reference(onnx.load(str(DYNAMIC_BERT)))
    rng = np.random.default_rng(5)
    for batch, sequence in [(1, 8), (2, 8), (2, 5), (1, 3)]:  # listed; then padded along the sequence and both
        ids = rng.integers(0, 1000, (batch, sequence))
        mask = np.ones((batch, sequence), np.int64)
        (out,) = result.run(ids, mask)
        assert out.shape == (batch, sequence, 64)
        np.testing.assert_allclose(out, reference([ids, mask])[0], rtol=1e-3, atol=1e-4)
    with pytest.raises(ShapeNotServed, match="this library holds the shapes batch=1 sequence=8; batch=2 sequence=8"):
        result.run(np.ones((3, 8), np.int64), np.ones((3, 8), np.int64))


def test_each_shapes_latency_is_read_by_its_label_or_index(optimized):
    result, _ = optimized
    for index, label in enumerate(["batch=1 sequence=8", "batch=2 sequence=8"]):
        assert result.latency(label) == result.latency(index) == result.latency(np.int64(index)) == result.shapes[index].latency()
        assert result.latency(label).is_measured
    with pytest.raises(
        CollageError, match="no shape 'batch=3' in this result \\(its shapes: 'batch=1 sequence=8', 'batch=2 sequence=8', or 0 to 1\\)"
    ):
        result.latency("batch=3")
    with pytest.raises(CollageError, match="no shape 2 in this result"):
        result.latency(2)
    with pytest.raises(CollageError, match="no row called 'nothing'"):
        result.latency(0, "nothing")


def test_one_shapes_placement_replays_and_exports_at_that_shape_without_a_word_of_another_model(optimized, tmp_path, caplog, capsys):
    """A --shapes run's shape-K/placement.json: the model has symbolic dimensions, so the replay needs the shape,
    and --shapes gives it (it was refused beside --placement, while the import asked for it); the model at that
    shape is the one the placement was made for (no fingerprint warning), and its outputs are ONNX Runtime's."""
    _, folder = optimized
    one = folder / "shape-2" / "placement.json"
    result = collage_core.optimize(
        str(DYNAMIC_BERT), placement=one, shapes="batch=2 sequence=8", output_dir=tmp_path / "replay", show_progress=False
    )
    assert result.verification.passed and result.model.name == "tiny_bert_dynamic"
    assert not [record for record in caplog.records if "another version of this model" in record.getMessage()]
    ids, mask = np.random.default_rng(3).integers(0, 1000, (2, 8)), np.ones((2, 8), np.int64)
    (out,) = result.run(ids, mask)
    np.testing.assert_allclose(out, session_reference(onnx.load(str(DYNAMIC_BERT)))([ids, mask])[0], rtol=1e-3, atol=1e-4)
    with pytest.raises(ShapeProfileError, match="a replay of a placement of one shape takes one shape, and 2 are listed"):
        collage_core.optimize(str(DYNAMIC_BERT), placement=one, shapes="batch=1,2 sequence=8", show_progress=False)
    with pytest.raises(CollageError, match="a placements file of several shapes replays the shapes it names: leave --shapes out"):
        collage_core.optimize(str(DYNAMIC_BERT), placement=folder / PLACEMENTS_FILE, shapes="batch=2 sequence=8", show_progress=False)
    from collage_core.cli import main
    from collage_core.outputs.mlf import load_mlf

    tar = tmp_path / "shape2.tar"
    assert main(["export", str(DYNAMIC_BERT), "--placement", str(one), "--shapes", "batch=2 sequence=8", "-o", str(tar)]) == 0
    capsys.readouterr()
    assert [spec["shape"] for spec in load_mlf(tar).input_specs] == [[2, 8], [2, 8]]


def test_the_folder_holds_one_library_every_shapes_placement_and_a_report_side_by_side(optimized):
    result, folder = optimized
    assert (folder / "tiny_bert_dynamic.so").is_file() and (folder / "tiny_bert_dynamic.so.runtime.json").is_file()
    placements = json.loads((folder / PLACEMENTS_FILE).read_text())
    assert len(placements["placements"]) == 2 and placements["shapes"]["padding"]["allowed"].keys() == {"batch", "sequence"}
    for index in (1, 2):
        assert (folder / f"shape-{index}" / "placement.json").is_file()
    report = (folder / "report.txt").read_text()
    assert "batch=1 sequence=8" in report and "batch=2 sequence=8" in report
    assert "padded: batch=2 sequence=4 runs on batch=2 sequence=8: numerics passed" in report
    runtime = json.loads((folder / "tiny_bert_dynamic.so.runtime.json").read_text())
    assert [p["function"] for p in runtime["shape_profiles"]["profiles"]] == ["main_shape1", "main_shape2"]


def test_the_command_refuses_shapes_that_do_not_fit_in_one_line_naming_them(tmp_path, capsys):
    from collage_core.cli import main

    code = main(["optimize", str(DYNAMIC_BERT), "--shapes", "batch=1,2", "-o", str(tmp_path / "out")])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("collage: error:")]
    assert code != 0 and errors == ["collage: error: --shapes: give sizes for sequence too (each symbolic dimension needs at least one)"]
    assert not (tmp_path / "out" / "tiny_bert_dynamic.so").exists()


@pytest.mark.slow
def test_the_command_times_each_shape_in_the_library_beside_its_own_library(tmp_path, capsys):
    from collage_core.cli import main

    out = tmp_path / "out"
    code = main(
        [
            "optimize",
            str(DYNAMIC_BERT),
            "--shapes",
            "input_ids=1x8,2x16",
            "--backends",
            "tvm",
            "-o",
            str(out),
            "--cost-db",
            str(tmp_path / "c.sqlite"),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "saved:" in printed
    results = json.loads((out / "results.json").read_text())
    listed = [check for check in results["checks"] if not check["padded"]]
    assert len(listed) == 2 and all(check["in_library_s"] > 0 and check["alone_s"] > 0 for check in listed)
    assert all(check["numerics"]["passed"] for check in results["checks"])


def test_a_result_of_several_shapes_saves_into_a_folder_it_makes(optimized, tmp_path):
    result, _ = optimized
    folder = result.save(tmp_path / "new" / "folder")
    assert {PLACEMENTS_FILE, "report.txt", "results.json", f"{result.name}.so"} <= {path.name for path in folder.iterdir()}


@pytest.fixture(scope="module")
def replayed(optimized, tmp_path_factory):
    _, folder = optimized
    out = tmp_path_factory.mktemp("replay")
    result = collage_core.optimize(str(DYNAMIC_BERT), placement=folder / PLACEMENTS_FILE, output_dir=out / "replay", show_progress=False)
    return result, out


def test_placements_json_replays_every_shape_as_it_was_placed(optimized, replayed):
    searched, _ = optimized
    result, _ = replayed
    assert [p.label for p in result.dispatch.profiles] == [p.label for p in searched.dispatch.profiles]
    assert [s.placement.partitions for s in result.shapes] == [s.placement.partitions for s in searched.shapes]
    assert result.verified and [s.replayed_from is not None for s in result.shapes] == [True, True]


def test_the_library_of_every_shape_exports_to_one_tar_that_dispatches_when_loaded(replayed):
    from collage_core.outputs.mlf import load_mlf
    from collage_core.outputs.mlf_export import export_mlf

    result, out = replayed
    tar = export_mlf(result, out / "model.tar", check_inputs=result.shapes[1].model.random_inputs())
    loaded = load_mlf(tar, out / "unpacked")
    assert [entry["function"] for entry in loaded.executor_config["entries"]] == ["main_shape1", "main_shape2"]
    reference = session_reference(onnx.load(str(DYNAMIC_BERT)))
    for batch, sequence in [(1, 8), (2, 6)]:
        ids, mask = np.random.default_rng(batch).integers(0, 1000, (batch, sequence)), np.ones((batch, sequence), np.int64)
        np.testing.assert_allclose(loaded.run(ids, mask)[0], reference([ids, mask])[0], rtol=1e-3, atol=1e-4)
    # a token id past the vocabulary is refused by the tar and by the library it came from, whatever the shape
    ids, mask = np.full((2, 6), 1000, np.int64), np.ones((2, 6), np.int64)
    for run in (loaded.run, result.run):
        with pytest.raises(IndexOutOfRange, match="input input_ids: 1000 at"):
            run(ids, mask)
        # inputs of another number or type, in one line before the dispatcher chooses
        with pytest.raises(InputMismatch, match=r"^1 input given; the model takes 2: input_ids \(int64\), attention_mask \(int64\)"):
            run(ids)
        with pytest.raises(InputMismatch, match="input attention_mask: int32 values where the model takes int64"):
            run(ids % 1000, mask.astype(np.int32))
    # each of the two shapes' entry functions holds the weights; the parameters member stores them once
    stored, held = loaded.metadata["memory"]["parameter_bytes"], loaded.metadata["memory"]["constant_bytes"]
    assert stored == sum(array.nbytes for array in loaded.parameters.values())
    assert 0 < stored < 0.6 * held


def test_a_placements_file_that_is_not_one_is_refused_in_one_line_naming_it(tmp_path):
    broken = tmp_path / "placements.json"
    broken.write_text(json.dumps({"format": "collage-shape-placements", "version": 1, "shapes": {"profiles": [{}]}, "placements": [{}]}))
    with pytest.raises(collage_core.CollageError, match=f"{re.escape(str(broken))}: shape 1: ") as raised:
        collage_core.optimize(str(DYNAMIC_BERT), placement=broken, show_progress=False)
    assert "\n" not in str(raised.value)


def test_collage_show_explains_and_draws_each_shape(optimized, tmp_path, capsys):
    from collage_core.cli import main

    _, folder = optimized
    assert main(["show", str(folder / PLACEMENTS_FILE)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("shape 1: batch=1 sequence=8") < printed.index("shape 2: batch=2 sequence=8")
    assert printed.count("why this placement:") == 2
    assert "every shape's placement puts each operator on the same backend" in printed or "where the placements differ:" in printed
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed: no picture")
    assert main(["show", str(folder / PLACEMENTS_FILE), "-o", str(tmp_path / "p.svg")]) == 0
    assert sorted(path.name for path in tmp_path.glob("p-shape*.svg")) == ["p-shape1.svg", "p-shape2.svg"]


def _placement(operators, chosen, considered=()):
    parts = [Partition(backend, f"{backend}.op", nodes, f"k{nodes}", Cost.measured(us * 1e-6, 0.0, 3)) for backend, nodes, us in chosen]
    considered = [
        Partition(backend, f"{backend}.op", nodes, f"c{nodes}", Cost.measured(us * 1e-6, 0.0, 3)) for backend, nodes, us in considered
    ]
    return Placement("m", "f", operators, {"kind": "cuda"}, "gpu", {}, "op-level", parts, considered=considered)


def test_where_shapes_differ_names_the_operators_that_move_and_the_costs_that_moved_them():
    operators = ["relax.matmul", "relax.add", "relax.matmul"]
    small = _placement(operators, [("cublas", (0, 1), 9.0), ("tvm", (2,), 4.0)], considered=[("tvm", (0,), 12.0), ("tvm", (1,), 1.0)])
    large = _placement(operators, [("tvm", (0,), 20.0), ("tvm", (1,), 2.0), ("tvm", (2,), 8.0)], considered=[("cublas", (0, 1), 31.0)])
    lines = placement_differences(["batch=1", "batch=8"], [small, large])
    assert lines[:3] == [
        "where the placements differ:",
        "  cublas runs 2 at batch=1, 0 at batch=8",
        "  tvm runs 1 at batch=1, 3 at batch=8",
    ]
    said = "\n".join(lines[3:])
    # Operators 0 and 1 move from cuBLAS to TVM; operator 2 stays on TVM and is not listed.
    assert "  1 relax.matmul: cublas at batch=1, tvm at batch=8" in said and "  1 relax.add: cublas at batch=1, tvm at batch=8" in said
    assert "    at batch=1: cublas.op 9.0 us (2 ops), tvm.op 12.0 us (1 op)" in said
    assert "    at batch=8: tvm.op 20.0 us (1 op), cublas.op 31.0 us (2 ops)" in said
    assert said.count("relax.matmul") == 1


def test_shapes_placed_alike_or_listing_other_operators_are_said_so():
    one = _placement(["relax.add"], [("tvm", (0,), 1.0)])
    assert placement_differences(["a", "b"], [one, one]) == ["every shape's placement puts each operator on the same backend"]
    other = _placement(["relax.add", "relax.add"], [("tvm", (0,), 1.0), ("cublas", (1,), 1.0)])
    lines = placement_differences(["a", "b"], [one, other])
    assert lines[1] == "  cublas runs 0 at a, 1 at b" and "only their numbers per backend are compared" in lines[-1]


def test_functions_equal_in_two_shapes_stay_each_shapes_own():
    weight = np.random.default_rng(0).standard_normal((4, 4)).astype("float32")
    merged = merged_module([doubling_module(2, weight), doubling_module(2, weight)])
    names = sorted(gvar.name_hint for gvar in merged.get_global_vars())
    assert {"main_shape1", "main_shape2", "part_shape1", "part_shape2"} <= set(names)
    vm = relax.VirtualMachine(relax.build(merged, "llvm"), tvm.cpu())
    x = np.ones((2, 4), "float32")
    for index in (0, 1):
        np.testing.assert_allclose(vm[entry_function(index)](tvm.runtime.tensor(x)).numpy(), (2 * x) @ weight, rtol=RTOL, atol=ATOL)
