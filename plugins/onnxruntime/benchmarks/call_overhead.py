"""Per-call overhead of the bridge from TVM's VM to ONNX Runtime, on a tiny one-operator partition.

    python plugins/onnxruntime/benchmarks/call_overhead.py [--shape 1,64] [--threads N]

Times, per call, the same ReLU:
  ORT run_with_iobinding  ONNX Runtime alone, buffers bound once (the floor)
  ORT session.run         ONNX Runtime's usual Python call: numpy in, numpy out
  bridge function         collage_onnxruntime.run called from Python on TVM tensors
  VM -> ORT partition     Relax VM calling the lowered partition (what a placement pays)
  VM -> TVM kernel        Relax VM calling TVM's own kernel (the VM's overhead alone)
The overhead of the bridge is "VM -> ORT partition" minus "ORT run_with_iobinding".
"""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace

import numpy as np
import tvm
from tvm import relax

from collage_core.kit import RelaxGraph, relax_to_onnx, tvm_compat
from collage_core.kit.testing import (
    MeasureSettings, build, discover_backends, get_plugin_manager, partition_module, time_callable,
)
from collage_onnxruntime import runtime

SETTINGS = MeasureSettings(warmup=20, min_repeats=7, max_repeats=31, target_spread=0.02, min_repeat_ms=50.0, time_bound_s=10.0)


def relu_module(shape) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            output = bb.emit_output(relax.op.nn.relu(x))
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
    mod = relu_module(shape)
    graph = RelaxGraph.from_function(mod["main"])

    def placed_on(backend: str):
        part = SimpleNamespace(backend=backend, pattern=f"{backend}.op", nodes=frozenset({0}))
        return build(pm, partition_module(graph, [part]), backends, target)

    onnxruntime_vm = relax.VirtualMachine(placed_on("onnxruntime"), device)["main"]
    tvm_vm = relax.VirtualMachine(placed_on("tvm"), device)["main"]

    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype("float32")
    x_tensor = tvm_compat.to_tensor(x, device)
    out_tensor = tvm_compat.to_tensor(np.empty_like(x), device)
    serialized = relax_to_onnx.convert(mod["main"]).SerializeToString()
    blob = tvm_compat.to_tensor(runtime.pack_model(serialized), device)
    session = runtime.session_for(serialized)
    out = np.empty_like(x)
    binding = session.io_binding()
    binding.bind_input("input_0", "cpu", 0, x.dtype, x.shape, x.ctypes.data)
    binding.bind_output("output_0", "cpu", 0, out.dtype, out.shape, out.ctypes.data)
    feeds = {"input_0": x}

    np.testing.assert_array_equal(tvm_compat.to_numpy(onnxruntime_vm(x_tensor)), np.maximum(x, 0))
    rows = [
        ("ORT run_with_iobinding", lambda: session.run_with_iobinding(binding)),
        ("ORT session.run", lambda: session.run(None, feeds)),
        ("bridge function", lambda: runtime.run(blob, x_tensor, out_tensor)),
        ("VM -> ORT partition", lambda: onnxruntime_vm(x_tensor)),
        ("VM -> TVM kernel", lambda: tvm_vm(x_tensor)),
    ]
    results = [(name, *per_call(function)) for name, function in rows]
    floor = results[0][1]
    print(f"ReLU on float32 {shape}; ONNX Runtime intra-op threads: {len(os.sched_getaffinity(0))}, no spinning")
    print(f"{'path':<24} {'median us':>10} {'IQR us':>8} {'over ORT floor':>15}")
    for name, median, spread in results:
        print(f"{name:<24} {median:>10.2f} {spread:>8.2f} {median - floor:>+15.2f}")


if __name__ == "__main__":
    main()
