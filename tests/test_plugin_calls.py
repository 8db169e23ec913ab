"""collage_core.build.plugin_calls: what lowered partitions call outside TVM's kernels, and a run's calls counted."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from collage_core import testing, tvm_compat
from collage_core.build.plugin_calls import counting_calls, outside_calls

RELU = "collage_test.counted_relu"


def relu_calling(packed_function: str) -> tvm.IRModule:
    def make(bb, x):
        return relax.call_dps_packed(packed_function, [x], tvm_compat.value_type(x))

    return testing.function_module(make, (2, 3))


def test_outside_calls_are_the_packed_functions_called_and_plain_relax_calls_none():
    assert outside_calls(relu_calling(RELU)) == {RELU}
    assert outside_calls(testing.function_module(lambda bb, x: relax.op.nn.relu(x), (2, 3))) == set()


def test_a_run_made_inside_is_counted_and_the_function_is_registered_back_on_leaving():
    def relu(x, out):
        out.copyfrom(np.maximum(x.numpy(), 0))

    tvm_ffi.register_global_func(RELU, relu, override=True)
    original = tvm_ffi.get_global_func(RELU)
    executable = relax.build(relu_calling(RELU), tvm_compat.host_cpu_target())
    x = tvm_compat.to_tensor(np.array([[-1, 2, -3], [4, -5, 6]], "float32"), tvm.cpu(0))
    with counting_calls([RELU, "collage_test.not_registered"]) as calls:
        assert dict(calls) == {RELU: 0}
        vm = relax.VirtualMachine(executable, tvm.cpu(0))
        result = vm["main"](x)
        vm["main"](x)
    assert dict(calls) == {RELU: 2}
    np.testing.assert_array_equal(result.numpy(), [[0, 2, 0], [4, 0, 6]])
    assert tvm_ffi.get_global_func(RELU).same_as(original)
    relax.VirtualMachine(executable, tvm.cpu(0))["main"](x)
    assert calls[RELU] == 2
