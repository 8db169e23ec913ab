"""ONNX Runtime's CPU execution provider as a Collage backend.

Each partition is converted to an ONNX model (``collage_core.kit.relax_to_onnx``) and replaced by a call to the
packed function ``collage_onnxruntime.run`` that carries the model as a constant, so the built
executable is self-contained: running it needs only ``import collage_onnxruntime``.
"""

from __future__ import annotations

import importlib

from tvm import relax

from collage_core.kit import (
    GRAPH_LEVEL,
    Availability,
    Backend,
    engine_lowering,
    engine_patterns,
    hookimpl,
    hookimpl_for,
    relax_to_onnx,
    replace_functions,
)
from collage_onnxruntime import runtime

BACKEND = "onnxruntime"
INSTALL_HINT = "pip install onnxruntime"


def _import_onnxruntime():
    """The onnxruntime module, or the error importing it raised (the backend is then unavailable)."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as error:
        return error


# How partitions are lowered and run (revision 2: sessions spin when they run the whole executable; 3: ceil-mode
# pooling, resize and pad converted). Part of the backend's version, so costs measured with other code are never reused.
LOWERING_REVISION = 3


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


@hookimpl_for(BACKEND)
def collage_check_availability(backend):
    onnxruntime = _import_onnxruntime()
    if isinstance(onnxruntime, ImportError):
        return Availability.no(f"onnxruntime cannot be imported ({onnxruntime}): {INSTALL_HINT}")
    if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
        return Availability.no(f"this onnxruntime has no CPUExecutionProvider: {INSTALL_HINT}")
    return Availability.yes()


@hookimpl_for(BACKEND)
def collage_contribute_patterns(backend, target):
    if target.kind.name not in ("llvm", "c"):
        return []
    return engine_patterns.operator_patterns(BACKEND)


def lower_function(func: relax.Function, name: str, spinning: bool = False) -> relax.Function:
    """``func`` with its body replaced by one ``collage_onnxruntime.run`` call on its ONNX model
    (run by a session whose idle threads spin, with ``spinning``)."""
    model = relax_to_onnx.convert(func, name)
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, runtime.pack_model(model.SerializeToString(), spinning))


@hookimpl_for(BACKEND)
def collage_lower_partitions(backend, mod, function_names, target):
    spinning = engine_lowering.runs_alone(mod, function_names)
    return replace_functions(mod, function_names, lambda func, name: lower_function(func, name, spinning))


@hookimpl_for(BACKEND)
def collage_lower_whole_model(backend, model, model_format, func, name, target):
    if model_format != "onnx" or target.kind.name not in ("llvm", "c"):
        return None
    # The model file as its users run it: ONNX Runtime's default session (all graph optimizations, idle threads
    # spinning: nothing else runs beside it) with Collage's threads.
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, runtime.pack_model(model, spinning=True))


@hookimpl_for(BACKEND)
def collage_prepare_runtime(backend):
    onnxruntime = _import_onnxruntime()
    if isinstance(onnxruntime, ImportError):
        raise RuntimeError(f"onnxruntime cannot be imported ({onnxruntime}): {INSTALL_HINT}")
    runtime.register()
    return True
