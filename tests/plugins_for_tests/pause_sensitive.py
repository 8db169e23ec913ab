"""Two backends whose run times are set, one of them slow after a pause, as OpenVINO can be; never installed.

Backend ``pausesensitive`` runs ``relu`` in ``WARM_S`` when its last run in the process ended less than
``IDLE_S`` ago, and in ``AFTER_PAUSE_S`` otherwise; backend ``steady`` runs it in ``STEADY_S`` always.
Warm and back to back, ``pausesensitive`` is the faster; after a pause, ``steady`` is. Each sleeps its
time and computes ReLU with numpy, so which is faster does not depend on the machine.
"""

import time

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from collage_core import Availability, Backend, Pattern, hookimpl, tvm_compat
from collage_core.build.executable import replace_functions
from collage_core.records import OP_LEVEL

PAUSE_SENSITIVE = "pausesensitive"
STEADY = "steady"
WARM_S = 0.002
AFTER_PAUSE_S = 0.030
STEADY_S = 0.008
IDLE_S = 0.2
_last_run_end = [float("-inf")]


def _pause_sensitive_relu(data, out) -> None:
    idle_s = time.perf_counter() - _last_run_end[0]
    time.sleep(WARM_S if idle_s < IDLE_S else AFTER_PAUSE_S)
    out.copyfrom(np.maximum(data.numpy(), 0))
    _last_run_end[0] = time.perf_counter()


def _steady_relu(data, out) -> None:
    time.sleep(STEADY_S)
    out.copyfrom(np.maximum(data.numpy(), 0))


RUN_FUNCTIONS = {PAUSE_SENSITIVE: "collage_test.pause_sensitive_relu", STEADY: "collage_test.steady_relu"}
# Registered on import: every process that loads the plugin (the measurement workers) can run them.
tvm.register_global_func(RUN_FUNCTIONS[PAUSE_SENSITIVE], _pause_sensitive_relu, override=True)
tvm.register_global_func(RUN_FUNCTIONS[STEADY], _steady_relu, override=True)


def _lowering(backend: str):
    def lower(func: relax.Function, name: str) -> relax.Function:
        params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
        bb = relax.BlockBuilder()
        with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
            with bb.dataflow():
                call = relax.call_dps_packed(RUN_FUNCTIONS[backend], params, tvm_compat.return_type(func))
                output = bb.emit_output(call)
            bb.emit_func_output(output)
        return bb.get()[name]

    return lower


@hookimpl
def collage_register_backends(register):
    register(Backend(PAUSE_SENSITIVE, OP_LEVEL, ("cpu",), "1", "relu, slow after a pause, for tests only"))
    register(Backend(STEADY, OP_LEVEL, ("cpu",), "1", "relu at a steady speed, for tests only"))


@hookimpl
def collage_check_availability(backend):
    return Availability.yes() if backend.name in RUN_FUNCTIONS else None


@hookimpl
def collage_contribute_patterns(backend, target):
    return [Pattern(f"{backend.name}.relu", is_op("relax.nn.relu")(wildcard()))] if backend.name in RUN_FUNCTIONS else None


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    return replace_functions(mod, function_names, _lowering(backend.name)) if backend.name in RUN_FUNCTIONS else None


@hookimpl
def collage_prepare_runtime(backend):
    return True if backend.name in RUN_FUNCTIONS else None
