"""Per-call overhead of the bridge from TVM's VM to ONNX Runtime, on a tiny one-operator partition.

    python plugins/onnxruntime/benchmarks/call_overhead.py [--shape 1,64]

Times, per call, the same ReLU:
  ORT run_with_iobinding  ONNX Runtime alone, buffers bound once (the floor)
  ORT session.run         ONNX Runtime's usual Python call: numpy in, numpy out
  bridge function         collage_onnxruntime.run called from Python on TVM tensors
  VM -> ORT partition     Relax VM calling the lowered partition (what a placement pays)
  VM -> TVM kernel        Relax VM calling TVM's own kernel (the VM's overhead alone)
The overhead of the bridge is "VM -> ORT partition" minus "ORT run_with_iobinding".
"""

from __future__ import annotations

import os

import numpy as np
from collage_onnxruntime import runtime
from tvm import relax

from collage_core.kit import relax_to_onnx, tvm_compat
from collage_core.kit.testing.benchmarks import OneOperator, shape_from_arguments, timed


def main() -> None:
    shape = shape_from_arguments(__doc__.splitlines()[0])
    relu = OneOperator.from_operator(relax.op.nn.relu, shape)
    onnxruntime_vm, tvm_vm = relu.vm("onnxruntime"), relu.vm("tvm")
    device = relu.device

    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype("float32")
    x_tensor = tvm_compat.to_tensor(x, device)
    out_tensor = tvm_compat.to_tensor(np.empty_like(x), device)
    serialized = relax_to_onnx.convert(relu.mod["main"]).SerializeToString()
    blob = tvm_compat.to_tensor(runtime.pack_model(serialized), device)
    session = runtime.session_for(serialized)
    out = np.empty_like(x)
    binding = session.io_binding()
    binding.bind_input("input_0", "cpu", 0, x.dtype, x.shape, x.ctypes.data)
    binding.bind_output("output_0", "cpu", 0, out.dtype, out.shape, out.ctypes.data)
    feeds = {"input_0": x}

    np.testing.assert_array_equal(tvm_compat.to_numpy(onnxruntime_vm(x_tensor)), np.maximum(x, 0))
    results = timed(
        [
            ("ORT run_with_iobinding", lambda: session.run_with_iobinding(binding)),
            ("ORT session.run", lambda: session.run(None, feeds)),
            ("bridge function", lambda: runtime.run(blob, x_tensor, out_tensor)),
            ("VM -> ORT partition", lambda: onnxruntime_vm(x_tensor)),
            ("VM -> TVM kernel", lambda: tvm_vm(x_tensor)),
        ]
    )
    floor = results[0][1]
    print(f"ReLU on float32 {shape}; ONNX Runtime intra-op threads: {len(os.sched_getaffinity(0))}, no spinning")
    print(f"{'path':<24} {'median us':>10} {'IQR us':>8} {'over ORT floor':>15}")
    for name, median, spread in results:
        print(f"{name:<24} {median:>10.2f} {spread:>8.2f} {median - floor:>+15.2f}")


if __name__ == "__main__":
    main()
