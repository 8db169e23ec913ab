"""Per-call overhead of a DNNL partition in TVM's VM, on a tiny one-operator softmax.

    python plugins/dnnl/benchmarks/call_overhead.py [--shape 1,64]

Times, per call, the same softmax:
  kernel from Python      collage_dnnl.run called directly on TVM tensors (oneDNN plus the lookup)
  VM -> DNNL partition    Relax VM calling the lowered partition (what a placement pays)
  VM -> TVM kernel        Relax VM calling TVM's own kernel (the VM's overhead plus TVM's loop)
The path is C++ from the VM to oneDNN: no Python runs in "VM -> DNNL partition".
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
import tvm
from tvm import relax

from collage_core.kit import RelaxGraph, tvm_compat
from collage_core.kit.testing import (
    MeasureSettings, build, discover_backends, get_plugin_manager, partition_module, time_callable,
)
from collage_dnnl import lowering, specs

SETTINGS = MeasureSettings(warmup=20, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=50.0, time_bound_s=10.0)


def softmax_module(shape) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(output)
    return bb.get()


def per_call(function) -> tuple[float, float]:
    """Median and interquartile range of one call, in microseconds."""

    def run(number: int) -> float:
        started = time.perf_counter()
        for _ in range(number):
            function()
        return (time.perf_counter() - started) / number

    cost = time_callable(run, SETTINGS)
    return cost.median_s * 1e6, cost.spread_s * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,64", help="the tensor's shape, comma-separated (default 1,64)")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))

    target, device = tvm_compat.host_cpu_target(), tvm.cpu(0)
    pm = get_plugin_manager()
    backends = {name: info.backend for name, info in discover_backends(pm).items()}
    mod = softmax_module(shape)
    graph = RelaxGraph.from_function(mod["main"])

    def placed_on(backend: str, pattern: str):
        part = SimpleNamespace(backend=backend, pattern=pattern, nodes=frozenset({0}))
        return relax.VirtualMachine(build(pm, partition_module(graph, [part]), backends, target), device)["main"]

    dnnl_vm, tvm_vm = placed_on("dnnl", "dnnl.softmax"), placed_on("tvm", "tvm.op")
    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype("float32")
    x_tensor, out_tensor = tvm_compat.to_tensor(x, device), tvm_compat.to_tensor(np.empty_like(x), device)
    spec = specs.recognize(specs.Group.from_function(graph.region_function([0])[0]))
    spec_tensor = tvm_compat.to_tensor(spec.array(), device)
    run = tvm.get_global_func(lowering.RUN_FUNCTION)
    expected = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(tvm_compat.to_numpy(dnnl_vm(x_tensor)), expected / expected.sum(-1, keepdims=True), rtol=1e-5)
    rows = [
        ("kernel from Python", lambda: run(spec_tensor, x_tensor, out_tensor)),
        ("VM -> DNNL partition", lambda: dnnl_vm(x_tensor)),
        ("VM -> TVM kernel", lambda: tvm_vm(x_tensor)),
    ]
    print(f"softmax on float32 {shape}")
    print(f"{'path':<24} {'median us':>10} {'IQR us':>8}")
    for name, function in rows:
        median, spread = per_call(function)
        print(f"{name:<24} {median:>10.2f} {spread:>8.2f}")


if __name__ == "__main__":
    main()
