"""The TVM backend's own rewrites: small integer powers as multiplications (TVM's fast-math CUDA pow is NaN for x < 0),
a split's parts as slices (each fuses with the views that read it), and a reshape after a norm over the last axis done
before it (what follows the norm fuses with it)."""

import collections
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from collage_tvm import prepare, split_parts
from collage_tvm.integer_powers import as_multiplications
from collage_tvm.reshapes_first import reshapes_before_norms
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build.executable import build
from collage_core.build.partition import partition_module
from collage_core.kit.testing import cuda_source, lower_partitions
from collage_core.model.model_import import load_model
from collage_core.model.precision import at_precision
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Cost, Partition
from collage_core.search.regions import whole_model_pattern

MODELS = Path(__file__).resolve().parents[1] / "models"
X = np.linspace(-3.0, 3.0, 24, dtype=np.float32).reshape(4, 6)


def power_module(exponent: float) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.power(x, relax.const(exponent, "float32")))
        bb.emit_func_output(output)
    return bb.get()


def ops_in(func) -> list[str]:
    return [b.value.op.name for block in func.body.blocks for b in block.bindings if tvm_compat.is_op_call(b.value)]


@pytest.mark.parametrize("exponent, multiplications", [(2.0, 1), (3.0, 2), (4.0, 3)])
def test_integer_powers_become_multiplications_and_compute_the_same(exponent, multiplications):
    rewritten = as_multiplications(power_module(exponent)["main"])
    assert ops_in(rewritten) == ["relax.multiply"] * multiplications
    executable = tvm.compile(relax.transform.LegalizeOps()(tvm.IRModule({"main": rewritten})), target=tvm_compat.host_cpu_target())
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    result = tvm_compat.to_numpy(vm["main"](tvm_compat.to_tensor(X, tvm.cpu(0))))
    np.testing.assert_allclose(result, X.astype(np.float64) ** exponent, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exponent", [2.5, 5.0, -1.0])
def test_other_powers_are_left_to_tvm(exponent):
    assert ops_in(as_multiplications(power_module(exponent)["main"])) == ["relax.power"]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_gpt2_on_cuda_compiles_to_kernels_without_powf(precision):
    """TVM generates CUDA code here without a GPU: GPT-2's tanh GELU (x**3) must not reach fast-math powf, at 16 bits
    too, where the conversion leaves the exponent a constant (a cast of it at run time hid it from the rewrite, and
    GPT-2 at bf16 gave NaN on an H100)."""
    pm = get_plugin_manager()
    infos = {name: info.backend for name, info in discover_backends(pm).items()}
    model = at_precision(load_model(str(MODELS / "tiny_gpt2.onnx")), precision)
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    assert "relax.power" in graph.graph.ops
    whole = [Partition("tvm", whole_model_pattern("tvm"), tuple(range(len(graph.graph))), whole_model_pattern("tvm"), Cost.unknown())]
    executable = build(pm, partition_module(graph, whole), {"tvm": infos["tvm"]}, tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"}))
    source = cuda_source(executable.mod)
    assert source.count("__global__") > 10
    # A call of powf, not the name in the 16-bit headers' list of half-precision math (`(hpow, powf)`).
    assert not re.search(r"\bpowf\s*\(", source)


def test_a_constant_that_broadcasts_the_base_is_left_to_tvm():
    x = relax.Var("x", relax.TensorType((6,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.power(x, relax.const(np.full((1, 1), 3.0, "float32"))))
        bb.emit_func_output(output)
    assert ops_in(as_multiplications(bb.get()["main"])) == ["relax.power"]


def split_views_module(shape, axis, sections, views: bool = True) -> tvm.IRModule:
    """``x`` split along ``axis``; each part reshaped to two more axes and transposed (GPT-2's q, k and v), or
    returned as it is."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, sections, axis=axis))
            outputs = []
            for index in range(len(tvm_compat.value_type(parts).fields)):
                part = bb.emit(relax.TupleGetItem(parts, index))
                if views:
                    part_shape = tvm_compat.tensor_shape_dtype(part)[0]
                    heads = bb.emit(relax.op.reshape(part, (*part_shape[:-1], 2, part_shape[-1] // 2)))
                    part = bb.emit(relax.op.permute_dims(heads, [0, 2, 1, 3]))
                outputs.append(part)
            output = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(output)
    return bb.get()


def run_on_cpu(func, *arrays):
    executable = tvm.compile(relax.transform.LegalizeOps()(tvm.IRModule({"main": func})), target=tvm_compat.host_cpu_target())
    results = relax.VirtualMachine(executable, tvm.cpu(0))["main"](*[tvm_compat.to_tensor(a, tvm.cpu(0)) for a in arrays])
    return [tvm_compat.to_numpy(result) for result in results]


@pytest.mark.parametrize("sections, bounds", [(3, [(0, 4), (4, 8), (8, 12)]), ([2, 6], [(0, 2), (2, 6), (6, 12)])])
def test_the_parts_of_a_split_become_slices_that_compute_the_same(sections, bounds):
    func = split_views_module((2, 3, 12), -1, sections)["main"]
    rewritten = split_parts.as_slices(func)
    assert "relax.split" not in ops_in(rewritten) and ops_in(rewritten).count("relax.strided_slice") == 3
    x = np.arange(2 * 3 * 12, dtype=np.float32).reshape(2, 3, 12)
    expected = [x[..., a:b].reshape(2, 3, 2, (b - a) // 2).transpose(0, 2, 1, 3) for a, b in bounds]
    for got, want in zip(run_on_cpu(rewritten, x), expected):
        np.testing.assert_array_equal(got, want)  # copies: exactly the same values


def test_a_part_read_after_its_splits_block_stays_a_part_and_the_function_still_builds():
    """A slice there would read the split's input, a dataflow variable, outside its block."""
    x = relax.Var("x", relax.TensorType((2, 12), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            doubled = bb.emit(relax.op.add(x, x))
            first = bb.emit_output(relax.TupleGetItem(bb.emit(relax.op.split(doubled, 3, axis=1)), 0))
            parts = bb.emit_output(relax.op.split(doubled, 2, axis=1))
        output = bb.emit(relax.Tuple([first, relax.TupleGetItem(parts, 1)]))
        bb.emit_func_output(output)
    rewritten = split_parts.as_slices(bb.get()["main"])
    assert ops_in(rewritten).count("relax.strided_slice") == 1 and "relax.split" in ops_in(rewritten)
    got = run_on_cpu(rewritten, X.reshape(2, 12))
    np.testing.assert_array_equal(got[0], 2 * X.reshape(2, 12)[:, :4])
    np.testing.assert_array_equal(got[1], 2 * X.reshape(2, 12)[:, 6:])


def test_a_split_whose_parts_have_no_known_extent_is_left_as_it_is():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((2, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, 2, axis=1))
            output = bb.emit_output(relax.TupleGetItem(parts, 0))
        bb.emit_func_output(output)
    assert ops_in(split_parts.as_slices(bb.get()["main"])) == ["relax.split"]


def kernel_launches(pm, placed, backends, target) -> dict[str, int]:
    """The CUDA kernels one run of ``placed`` launches, by the TIR function whose kernels they are: a function
    called once launches each of its kernels (``<function>_kernel``, ``<function>_kernel_1``, ...) once."""
    lowered = tvm_compat.lowered_for_build(lower_partitions(pm, placed, backends, target), target)
    executable = build(pm, placed, backends, target)
    defined = re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(\s*[^;]*?\)\s*\{", cuda_source(executable.mod))
    functions = {gvar.name_hint for gvar, func in lowered.functions_items() if tvm_compat.is_tir_function(func)}
    called = collections.Counter()
    for _, func in lowered.functions_items():
        if not tvm_compat.is_tir_function(func):
            relax.analysis.post_order_visit(
                func,
                lambda node: (
                    called.update([node.name_hint]) if isinstance(node, tvm.ir.GlobalVar) and node.name_hint in functions else None
                ),
            )
    return {name: times * sum(bool(re.fullmatch(rf"{name}_kernel(_\d+)?", kernel)) for kernel in defined) for name, times in called.items()}


def test_gpt2s_q_k_v_on_cuda_take_one_kernel_each_where_the_split_took_one_more_each(monkeypatch):
    """TVM's build of tiny GPT-2 for CUDA, made here without a GPU: each layer's split of q, k and v fuses with the
    reshape and the transpose of each part, so the split's own three kernels are launched no more."""
    pm = get_plugin_manager()
    backends = {"tvm": {name: info.backend for name, info in discover_backends(pm).items()}["tvm"]}
    model = load_model(str(MODELS / "tiny_gpt2.onnx"))
    graph = RelaxGraph.from_function(model.mod["main"], model.mod)
    splits = graph.graph.ops.count("relax.split")
    assert splits >= 1  # one per layer
    whole = [Partition("tvm", whole_model_pattern("tvm"), tuple(range(len(graph.graph))), whole_model_pattern("tvm"), Cost.unknown())]
    target = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"})
    with_slices = kernel_launches(pm, partition_module(graph, whole), backends, target)
    monkeypatch.setattr(split_parts, "as_slices", lambda func: func)
    without = kernel_launches(pm, partition_module(graph, whole), backends, target)
    assert not any("split" in name for name in with_slices)
    assert sum(launches for name, launches in without.items() if "split" in name) == 3 * splits
    assert sum(without.values()) - sum(with_slices.values()) == 3 * splits


def norm_reshape_cast_module(norm: str = "layer_norm") -> tvm.IRModule:
    """GPT-2's layer norm at bf16: normalized, reshaped into rows, cast to 16 bits for the next product."""
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gamma, beta = relax.const(np.linspace(0.5, 1.5, 8, dtype="float32")), relax.const(np.full(8, 0.25, "float32"))
            if norm == "layer_norm":
                normed = bb.emit(relax.op.nn.layer_norm(x, gamma, beta, axes=[2], epsilon=1e-3))
            elif norm == "rms_norm":
                normed = bb.emit(relax.op.nn.rms_norm(x, gamma, axes=[-1], epsilon=1e-3))
            else:
                normed = bb.emit(relax.op.nn.softmax(x, axis=2))
            rows = bb.emit(relax.op.reshape(normed, (8, 8)))
            output = bb.emit_output(relax.op.astype(rows, "float16"))
        bb.emit_func_output(output)
    return bb.get()


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "softmax"])
def test_a_reshape_after_a_norm_over_the_last_axis_comes_first_and_computes_the_same(norm):
    func = norm_reshape_cast_module(norm)["main"]
    rewritten = reshapes_before_norms(func)
    assert ops_in(rewritten) == ["relax.reshape", f"relax.nn.{norm}", "relax.astype"]
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 4, 8)
    run = [
        tvm_compat.to_numpy(
            relax.VirtualMachine(
                tvm.compile(relax.transform.LegalizeOps()(tvm.IRModule({"main": f})), target=tvm_compat.host_cpu_target()), tvm.cpu(0)
            )["main"](tvm_compat.to_tensor(x, tvm.cpu(0)))
        )
        for f in (func, rewritten)
    ]
    assert run[1].dtype == np.float16 and run[1].shape == (8, 8)
    np.testing.assert_array_equal(run[1], run[0])  # the same float32 sums in the same order, cast the same way


def test_a_reshape_that_moves_the_normalized_axis_stays_after_the_norm():
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.reshape(relax.op.nn.softmax(x, axis=-1), (2, 32)))
        bb.emit_func_output(output)
    assert ops_in(reshapes_before_norms(bb.get()["main"])) == ["relax.nn.softmax", "relax.reshape"]


def test_a_norm_something_else_reads_too_stays_before_its_reshape():
    """Moving it would compute the norm twice: once for the reshape, once for the other reader."""
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            normed = bb.emit(relax.op.nn.softmax(x, axis=-1))
            rows = bb.emit(relax.op.reshape(normed, (8, 8)))
            output = bb.emit_output(relax.Tuple([rows, bb.emit(relax.op.add(normed, normed))]))
        bb.emit_func_output(output)
    assert ops_in(reshapes_before_norms(bb.get()["main"])) == ["relax.nn.softmax", "relax.reshape", "relax.add"]


def test_gpt2s_norm_and_cast_at_sixteen_bits_are_one_cuda_kernel():
    """On CUDA (built here without a GPU) TVM fuses the cast into the layer norm once the reshape comes first, a view
    of the input."""
    target = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"})

    def called(func) -> list[str]:
        lowered = tvm_compat.lowered_for_build(tvm.IRModule({"main": func}), target)
        names = {gvar.name_hint for gvar, f in lowered.functions_items() if tvm_compat.is_tir_function(f)}
        found = []
        relax.analysis.post_order_visit(
            lowered["main"],
            lambda node: found.append(node.name_hint) if isinstance(node, tvm.ir.GlobalVar) and node.name_hint in names else None,
        )
        return found

    func = norm_reshape_cast_module()["main"]
    assert len(called(func)) == 2  # the norm, then the reshape and the cast
    assert called(prepare.prepared(func)) == ["fused_layer_norm_cast"]
