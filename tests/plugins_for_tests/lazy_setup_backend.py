"""A backend whose first call in a process pays one-time setup, as ONNX Runtime's sessions do; never installed.

Backend ``lazysetup`` takes ``relu`` and runs it through the packed function
``collage_test.lazy_relu``, which sleeps ``SETUP_S`` on its first call in a process and then
computes ReLU with numpy, so its steady cost is microseconds.
"""

import time

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from collage_core import Availability, Backend, Pattern, hookimpl, tvm_compat
from collage_core.build.executable import replace_functions
from collage_core.records import OP_LEVEL

BACKEND = "lazysetup"
RUN_FUNCTION = "collage_test.lazy_relu"
SETUP_S = 1.0
_set_up = []


def _lazy_relu(data, out) -> None:
    if not _set_up:
        time.sleep(SETUP_S)
        _set_up.append(True)
    out.copyfrom(np.maximum(data.numpy(), 0))


# Registered on import: every process that loads the plugin (the measurement workers) can run it.
tvm.register_global_func(RUN_FUNCTION, _lazy_relu, override=True)


def _lower(func: relax.Function, name: str) -> relax.Function:
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    bb = relax.BlockBuilder()
    with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
        with bb.dataflow():
            output = bb.emit_output(relax.call_dps_packed(RUN_FUNCTION, params, tvm_compat.return_type(func)))
        bb.emit_func_output(output)
    return bb.get()[name]


@hookimpl
def collage_register_backends(register):
    register(Backend(BACKEND, OP_LEVEL, ("cpu",), "1", "relu whose first call sleeps, for tests only"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name == BACKEND else None


@hookimpl
def collage_contribute_patterns(backend, target):
    return [Pattern(f"{BACKEND}.relu", is_op("relax.nn.relu")(wildcard()))] if backend.name == BACKEND else None


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return replace_functions(mod, function_names, _lower) if backend.name == BACKEND else None


@hookimpl
def collage_prepare_runtime(backend):
    return True if backend.name == BACKEND else None
