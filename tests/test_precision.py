"""--precision: the model converted once, what each target allows, numerics within the precision's tolerance,
and the precision carried by fingerprints and placement files so that a replay converts the model the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model import dtypes, precision
from collage_core.model.model_import import load_model
from collage_core.model.verify import compare_outputs
from collage_core.optimizer import optimize
from collage_core.outputs.placement_file import PlacementFileError, load_placement

MODELS = Path(__file__).resolve().parents[1] / "models"
CPU = tvm_compat.host_cpu_target()
CUDA = {"kind": "cuda", "arch": "sm_90"}


def calls(mod, op: str) -> list:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and tvm_compat.op_name(expr) == op:
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def dtype(expr) -> str:
    return tvm_compat.tensor_shape_dtype(expr)[1]


@pytest.fixture(scope="module")
def tiny_bert():
    return load_model(MODELS / "tiny_bert.onnx")


def test_bf16_gives_matmuls_bfloat16_operands_accumulating_in_float32_and_keeps_softmax_and_the_interface_float32(tiny_bert):
    converted = precision.at_precision(tiny_bert, precision.BF16)
    mod = converted.mod
    assert converted.precision == "bf16" and converted.fingerprint == tiny_bert.fingerprint + "+bf16"
    assert "float16" not in mod.script().replace("bfloat16", "")
    matmuls = calls(mod, "relax.matmul")
    assert matmuls and all(dtype(m.args[0]) == dtype(m.args[1]) == "bfloat16" and dtype(m) == "float32" for m in matmuls)
    assert all(dtype(op.args[0]) == "float32" for name in ("relax.nn.softmax", "relax.nn.layer_norm") for op in calls(mod, name))
    assert [dtype(p) for p in mod["main"].params] == [spec.dtype for spec in tiny_bert.inputs]
    assert tvm_compat.tensor_shape_dtype(mod["main"].body.body)[1] == "float32"
    assert precision.at_precision(tiny_bert, precision.FP32) is tiny_bert


def test_tf32_keeps_the_float32_model_keyed_apart_and_held_to_sixteen_bit_tolerance(tiny_bert):
    """TF32 changes no operator (backends choose TF32 kernels by pattern); its costs and builds are its own."""
    at_tf32 = precision.at_precision(tiny_bert, precision.TF32)
    assert at_tf32.mod is tiny_bert.mod or tvm_compat.structural_equal(at_tf32.mod, tiny_bert.mod)
    assert at_tf32.precision == "tf32" and at_tf32.fingerprint == tiny_bert.fingerprint + "+tf32"
    assert precision.tolerance(precision.TF32) == precision.tolerance(precision.FP16)
    assert "tf32" in precision.describe(precision.TF32) and precision.describe(precision.FP32) is None
    assert dtypes.computes_tf32("cublas.dense_bias_tf32") and not dtypes.computes_tf32("cublas.dense_bias")


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_no_cast_of_a_constant_is_left_so_a_spelt_out_gelu_applies_constants_of_its_own_type(tiny_bert, name):
    mod = precision.at_precision(tiny_bert, name).mod
    assert not [cast for cast in calls(mod, "relax.astype") if tvm_compat.is_constant(cast.args[0])]
    [divide, *_] = calls(mod, "relax.divide")  # erf GELU's x / sqrt(2), after a 16-bit product's cast
    assert dtype(divide.args[1]) == precision.DTYPES[name] and tvm_compat.is_constant(divide.args[1])


# bf16 on every shipped model and fp16 on tiny_bert in the default suite; fp16 on the other two (15 s) with --run-slow.
@pytest.mark.parametrize(
    "model, name",
    [
        ("tiny_bert", "bf16"),
        ("tiny_gpt2", "bf16"),
        ("tiny_resnet", "bf16"),
        ("tiny_bert", "fp16"),
        pytest.param("tiny_gpt2", "fp16", marks=pytest.mark.slow),
        pytest.param("tiny_resnet", "fp16", marks=pytest.mark.slow),
    ],
)
def test_a_converted_model_matches_the_float32_reference_within_its_tolerance_and_no_closer_than_float32(model, name):
    imported = load_model(MODELS / f"{model}.onnx")
    inputs = imported.random_inputs()
    reference = imported.reference(inputs)

    def outputs(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target=tvm_compat.make_target(CPU)), tvm.cpu())
        result = vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu()) for x in inputs])
        return [tvm_compat.to_numpy(r) for r in (result if not hasattr(result, "numpy") else [result])]

    held_to = precision.tolerance(name)
    low = compare_outputs(outputs(precision.convert(imported.mod, name)), reference, "onnxruntime", held_to.rtol, held_to.atol)
    exact = compare_outputs(outputs(imported.mod), reference, "onnxruntime")
    assert low.passed, low.describe()
    assert exact.passed and low.max_abs_error > exact.max_abs_error  # the conversion did change the arithmetic


@pytest.mark.parametrize(
    "name, target, flags, refusal",
    [
        ("fp32", CPU, set(), None),
        ("bf16", CPU, {"avx512f", "amx_bf16"}, None),
        ("bf16", CPU, {"avx512f", "avx512_bf16"}, None),
        ("bf16", CPU, {"avx2", "fma"}, "has no fast bf16"),
        ("fp16", CPU, {"avx512f", "amx_bf16"}, "fp16 on the CPU"),
        ("tf32", CPU, set(), "tf32 on the CPU"),
        ("tf32", CUDA, set(), None),
        ("bf16", CUDA, set(), None),
        ("fp16", CUDA, set(), None),
        ("int8", CPU, set(), "unknown precision 'int8'"),
    ],
)
def test_a_precision_the_target_cannot_run_fast_is_refused_in_one_line(monkeypatch, name, target, flags, refusal):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    target = tvm.target.Target(target)
    if refusal is None:
        precision.check_precision(name, target)
        return
    with pytest.raises(precision.PrecisionError, match=refusal) as raised:
        precision.check_precision(name, target)
    assert "\n" not in str(raised.value)


@pytest.mark.slow  # the whole optimize and a replay at bf16, about a minute
def test_bf16_is_searched_verified_saved_and_replayed_at_its_own_precision(monkeypatch, tmp_path, tvm_only_run):
    # TVM computes bfloat16 on any x86 CPU (slowly where the CPU has no bf16 units, which the check refuses):
    # the test lets the check pass on every CPU so that the pipeline runs everywhere.
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"})
    model = MODELS / "tiny_bert.onnx"
    out = tmp_path / "out"
    kwargs = tvm_only_run
    result = optimize(model, precision="bf16", output_dir=out, **kwargs)
    assert result.placement.precision == "bf16" and result.model.fingerprint.endswith("+bf16")
    assert result.verification.passed and (result.verification.rtol, result.verification.atol) == (0.05, 0.005)
    assert json.loads((out / "placement.json").read_text())["precision"] == "bf16"
    assert "precision bf16" in (out / "report.txt").read_text()

    replayed = optimize(model, placement=out / "placement.json", **kwargs)
    assert replayed.placement.precision == "bf16" and replayed.verification.passed
    with pytest.raises(CollageError, match="made at precision bf16, not fp32"):
        optimize(model, placement=out / "placement.json", precision="fp32", **kwargs)

    exact = optimize(model, output_dir=tmp_path / "exact", **kwargs)
    assert exact.placement.precision == "fp32" and exact.verification.rtol == 1e-3
    assert exact.verification.max_abs_error < result.verification.max_abs_error


def test_a_placement_file_with_an_unknown_precision_is_refused_naming_the_file(tmp_path):
    from collage_core.outputs.placement_file import Placement
    from collage_core.records import Cost, Partition

    whole = Partition("tvm", "tvm.op", [0], "k", Cost.measured(1e-6, 0.0, 3))
    path = Placement("m", "f", ["relax.add"], {"kind": "llvm"}, "cpu", {}, "op-level", [whole]).save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["precision"] == "fp32"
    data["precision"] = "fp8"
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementFileError, match=r"p.json: unknown precision 'fp8'"):
        load_placement(path)
    del data["precision"]  # files written before the option existed are float32
    path.write_text(json.dumps(data))
    assert load_placement(path).precision == "fp32"


def test_inspect_at_bf16_shows_which_backends_refuse_bfloat16_and_why(capsys):
    from collage_core import cli

    assert cli.main(["inspect", str(MODELS / "tiny_bert.onnx"), "--precision", "bf16", "--backends", "onnxruntime", "--no-relax"]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime.matmul x8" in text and "bfloat16" in text
    with pytest.raises(SystemExit):
        cli.main(["inspect", str(MODELS / "tiny_bert.onnx"), "--precision", "int4"])


def test_bf16_runs_a_layer_norm_between_sixteen_bit_operators_in_float32_and_keeps_its_numbers():
    """TVM's mixed-precision pass leaves a layer norm on 16-bit values (DeiT's, Swin's and Whisper's, after a residual
    add) at 16 bits; TVM's layer norm takes no bfloat16, so at bf16 it runs in float32 between casts."""
    import numpy as np

    rng = np.random.default_rng(0)
    w1, w2 = (relax.const(rng.uniform(-0.5, 0.5, size=(16, 16)).astype("float32")) for _ in range(2))
    gamma, beta = (relax.const(rng.uniform(0.5, 1.5, size=(16,)).astype("float32")) for _ in range(2))
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w1))
            y = bb.emit(relax.op.add(bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, w2)), beta)), h))  # a residual add
            z = bb.emit(relax.op.nn.layer_norm(y, gamma, beta, axes=[-1]))
            out = bb.emit_output(relax.op.matmul(z, w1))
        bb.emit_func_output(out)
    mod = bb.get()
    converted = precision.convert(mod, precision.BF16)
    (norm,) = calls(converted, "relax.nn.layer_norm")
    assert [dtype(arg) for arg in norm.args] == ["float32"] * 3
    assert "float16" not in converted.script().replace("bfloat16", "")
    inputs = [rng.uniform(-1, 1, size=(4, 16)).astype("float32")]

    def run(module):
        vm = relax.VirtualMachine(tvm.compile(module, target=tvm_compat.make_target(CPU)), tvm.cpu())
        return [tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(inputs[0], tvm.cpu())))]

    held_to = precision.tolerance("bf16")
    result = compare_outputs(run(converted), run(mod), "float32 build", held_to.rtol, held_to.atol)
    assert result.passed, result.describe()


@pytest.mark.parametrize("mcpu, refused", [("sapphirerapids", False), ("znver4", False), ("znver3", True), ("skylake-avx512", True)])
def test_bf16_on_servers_is_judged_by_llvms_table_for_their_cpu_not_by_this_machines_flags(monkeypatch, mcpu, refused):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"amx_bf16"} if refused else set())  # this machine: the opposite
    target = tvm_compat.make_target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})
    if refused:
        with pytest.raises(CollageError, match=f"the servers' CPU \\({mcpu}, as LLVM names it\\) has no fast bf16"):
            precision.check_precision("bf16", target, remote=True)
    else:
        precision.check_precision("bf16", target, remote=True)
