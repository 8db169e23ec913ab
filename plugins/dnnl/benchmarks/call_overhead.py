"""Per-call overhead of a DNNL partition in TVM's VM, on a tiny one-operator softmax.

    python plugins/dnnl/benchmarks/call_overhead.py [--shape 1,64]

Times, per call, the same softmax:
  kernel from Python      collage_dnnl.run called directly on TVM tensors (oneDNN plus the lookup)
  VM -> DNNL partition    Relax VM calling the lowered partition (what a placement pays)
  VM -> TVM kernel        Relax VM calling TVM's own kernel (the VM's overhead plus TVM's loop)
The path is C++ from the VM to oneDNN: no Python runs in "VM -> DNNL partition".
"""

from __future__ import annotations

import numpy as np
import tvm
from collage_dnnl import lowering, specs
from tvm import relax

from collage_core.kit import tvm_compat
from collage_core.kit.testing.benchmarks import OneOperator, shape_from_arguments, timed


def main() -> None:
    shape = shape_from_arguments(__doc__.splitlines()[0])
    softmax = OneOperator.from_operator(lambda x: relax.op.nn.softmax(x, axis=-1), shape)
    dnnl_vm, tvm_vm = softmax.vm("dnnl", "dnnl.softmax"), softmax.vm("tvm")
    device = softmax.device
    x = np.random.default_rng(0).uniform(-1, 1, size=shape).astype("float32")
    x_tensor, out_tensor = tvm_compat.to_tensor(x, device), tvm_compat.to_tensor(np.empty_like(x), device)
    spec = specs.recognize(specs.Group.from_function(softmax.graph.region_function([0])[0]))
    spec_tensor = tvm_compat.to_tensor(spec.array(), device)
    run = tvm.get_global_func(lowering.RUN_FUNCTION)
    expected = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(tvm_compat.to_numpy(dnnl_vm(x_tensor)), expected / expected.sum(-1, keepdims=True), rtol=1e-5)
    results = timed(
        [
            ("kernel from Python", lambda: run(spec_tensor, x_tensor, out_tensor)),
            ("VM -> DNNL partition", lambda: dnnl_vm(x_tensor)),
            ("VM -> TVM kernel", lambda: tvm_vm(x_tensor)),
        ]
    )
    print(f"softmax on float32 {shape}")
    print(f"{'path':<24} {'median us':>10} {'IQR us':>8}")
    for name, median, spread in results:
        print(f"{name:<24} {median:>10.2f} {spread:>8.2f}")


if __name__ == "__main__":
    main()
