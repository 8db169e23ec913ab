"""ONNX Runtime's CPU execution provider as a Collage backend.

Each partition is converted to an ONNX model (``relax_to_onnx``) and replaced by a call to the
packed function ``collage_onnxruntime.run`` that carries the model as a constant, so the built
executable is self-contained: running it needs only ``import collage_onnxruntime``.
"""

from __future__ import annotations

import importlib

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from collage_core import tvm_compat
from collage_core.build import replace_functions
from collage_core.hookspecs import hookimpl
from collage_core.records import GRAPH_LEVEL, Availability, Backend, Pattern
from collage_onnxruntime import relax_to_onnx, runtime, support

BACKEND = "onnxruntime"
INSTALL_HINT = "pip install onnxruntime"


# How many arguments each operator's calls have, where not one. (TVM 0.27's matcher fails on
# ``varg_default_wildcard`` when a call has more arguments than its pattern, so each count is spelt out.)
ARGUMENT_COUNTS = {
    **{op: (2,) for op in support.BINARY_NUMERIC + support.BINARY_FLOAT + support.COMPARISONS},
    **{op: (2,) for op in ("relax.nn.conv2d", "relax.matmul", "relax.reshape", "relax.broadcast_to", "relax.take")},
    **{op: (3,) for op in ("relax.clip", "relax.nn.layer_norm", "relax.where")},
    "relax.strided_slice": (4, 5),  # data, axes, begin, end, and strides unless all are 1
}


def operator_pattern(op_name: str):
    """``op_name`` called on wildcards, for each argument count its calls may have."""
    alternatives = [is_op(op_name)(*[wildcard() for _ in range(count)]) for count in ARGUMENT_COUNTS.get(op_name, (1,))]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def _supported(match) -> bool:
    return support.supports(match.root)


def pattern_name(op_name: str) -> str:
    """``relax.nn.conv2d`` -> ``onnxruntime.conv2d``."""
    return f"{BACKEND}.{op_name.rsplit('.', 1)[1]}"


def _import_onnxruntime():
    """The onnxruntime module, or the error importing it raised (the backend is then unavailable)."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as error:
        return error


# How partitions are lowered and run (revision 2: sessions spin when they run the whole
# executable). Part of the backend's version, so costs measured with other code are never reused.
LOWERING_REVISION = 2


@hookimpl
def collage_register_backends(register):
    onnxruntime = _import_onnxruntime()
    register(
        Backend(
            name=BACKEND,
            kind=GRAPH_LEVEL,
            device_kinds=("cpu",),
            version=f"{getattr(onnxruntime, '__version__', 'not installed')}+lowering-{LOWERING_REVISION}",
            description="ONNX Runtime, CPU execution provider (partitions converted to ONNX opset 17)",
            runtime_needs=f"the collage-onnxruntime plugin (pip install -e plugins/onnxruntime) and onnxruntime ({INSTALL_HINT})",
            lowering_uses_device=False,  # compiles only: candidates are built several at once
        )
    )


@hookimpl
def collage_check_availability(backend):
    if backend.name != BACKEND:
        return None
    onnxruntime = _import_onnxruntime()
    if isinstance(onnxruntime, ImportError):
        return Availability.no(f"onnxruntime cannot be imported ({onnxruntime}): {INSTALL_HINT}")
    if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
        return Availability.no(f"this onnxruntime has no CPUExecutionProvider: {INSTALL_HINT}")
    return Availability.yes()


@hookimpl
def collage_contribute_patterns(backend, target):
    if backend.name != BACKEND:
        return None
    if target.kind.name not in ("llvm", "c"):
        return []
    return [
        Pattern(pattern_name(op), operator_pattern(op), check=_supported)
        for op in support.SUPPORTED_OPS
    ]


def lower_function(func: relax.Function, name: str, spinning: bool = False) -> relax.Function:
    """``func`` with its body replaced by one ``collage_onnxruntime.run`` call on its ONNX model
    (run by a session whose idle threads spin, with ``spinning``)."""
    model = relax_to_onnx.convert(func, name)
    blob = relax.const(runtime.pack_model(model.SerializeToString(), spinning), "uint8")
    return_type = tvm_compat.return_type(func)
    out_types = list(return_type.fields) if isinstance(return_type, relax.TupleType) else return_type
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    bb = relax.BlockBuilder()
    with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
        with bb.dataflow():
            output = bb.emit_output(relax.call_dps_packed(runtime.RUN_FUNCTION, [blob, *params], out_types))
        bb.emit_func_output(output)
    return bb.get()[name]


def runs_alone(mod, function_names) -> bool:
    """Whether ``main`` does nothing but call these partitions (and pass tuples around): then no
    other backend's kernel runs between them, and their idle threads may spin."""
    ours = set(function_names)
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call):
                if not (isinstance(value.op, tvm.ir.GlobalVar) and value.op.name_hint in ours):
                    return False
            elif not (isinstance(value, (relax.Tuple, relax.TupleGetItem, relax.Var)) or tvm_compat.is_constant(value)):
                return False
    return True


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    if backend.name != BACKEND:
        return None
    spinning = runs_alone(mod, function_names)
    return replace_functions(mod, function_names, lambda func, name: lower_function(func, name, spinning))



@hookimpl
def collage_prepare_runtime(backend):
    if backend.name != BACKEND:
        return None
    onnxruntime = _import_onnxruntime()
    if isinstance(onnxruntime, ImportError):
        raise RuntimeError(f"onnxruntime cannot be imported ({onnxruntime}): {INSTALL_HINT}")
    runtime.register()
    return True
