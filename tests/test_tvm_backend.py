"""The TVM backend's own rewrite: small integer powers as multiplications (TVM's fast-math CUDA pow is NaN for x < 0)."""

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from collage_tvm.integer_powers import as_multiplications
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import discover_backends
from collage_core.build.executable import build
from collage_core.build.partition import partition_module
from collage_core.build.stage import WHOLE_MODEL_PATTERN
from collage_core.model.model_import import load_model
from collage_core.model.precision import at_precision
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Cost, Partition

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


def _cuda_sources(module) -> list[str]:
    found, stack = [], [module]
    while stack:
        current = stack.pop()
        if current.kind == "cuda":
            found.append(current.inspect_source())
        stack.extend(current.imports)
    return found


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
    whole = [Partition("tvm", WHOLE_MODEL_PATTERN, tuple(range(len(graph.graph))), WHOLE_MODEL_PATTERN, Cost.unknown())]
    executable = build(pm, partition_module(graph, whole), {"tvm": infos["tvm"]}, tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"}))
    sources = _cuda_sources(executable.mod)
    assert sources and sum(source.count("__global__") for source in sources) > 10
    # A call of powf, not the name in the 16-bit headers' list of half-precision math (`(hpow, powf)`).
    assert not any(re.search(r"\bpowf\s*\(", source) for source in sources)


def test_a_constant_that_broadcasts_the_base_is_left_to_tvm():
    x = relax.Var("x", relax.TensorType((6,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.power(x, relax.const(np.full((1, 1), 3.0, "float32"))))
        bb.emit_func_output(output)
    assert ops_in(as_multiplications(bb.get()["main"])) == ["relax.power"]
