"""ONNX Runtime's CPU execution provider as a Collage backend.

Each partition is converted to an ONNX model (``collage_core.kit.relax_to_onnx``) and replaced by a call to the
packed function ``collage_onnxruntime.run`` that carries the model as a constant, so the built
executable is self-contained: running it needs only ``import collage_onnxruntime``.
"""

from __future__ import annotations

from typing import Optional

from tvm import relax

from collage_core.kit import GRAPH_LEVEL, Backend, engine_hooks, engine_lowering, relax_to_onnx
from collage_onnxruntime import runtime

BACKEND = "onnxruntime"
INSTALL_HINT = "pip install onnxruntime"

# How partitions are lowered and run (revision 2: sessions spin when they run the whole executable; 3: ceil-mode
# pooling, resize and pad converted). Part of the backend's version, so costs measured with other code are never reused.
LOWERING_REVISION = 3


def _describe(onnxruntime_version: str) -> Backend:
    return Backend(
        name=BACKEND,
        kind=GRAPH_LEVEL,
        device_kinds=("cpu",),
        version=f"{onnxruntime_version}+lowering-{LOWERING_REVISION}",
        description="ONNX Runtime, CPU execution provider (partitions converted to ONNX opset 17)",
        runtime_needs=f"the collage-onnxruntime plugin (pip install -e plugins/onnxruntime) and onnxruntime ({INSTALL_HINT})",
        lowering_uses_device=False,  # compiles only: candidates are built several at once
    )


def _missing(onnxruntime) -> Optional[str]:
    if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
        return f"this onnxruntime has no CPUExecutionProvider: {INSTALL_HINT}"
    return None


def lower_function(func: relax.Function, name: str, spinning: bool = False) -> relax.Function:
    """``func`` with its body replaced by one ``collage_onnxruntime.run`` call on its ONNX model
    (run by a session whose idle threads spin, with ``spinning``)."""
    model = relax_to_onnx.convert(func, name)
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, runtime.pack_model(model.SerializeToString(), spinning))


def _lowering(mod, function_names, target):
    spinning = engine_lowering.runs_alone(mod, function_names)
    return lambda func, name: lower_function(func, name, spinning)


def _whole_model(model: bytes, func: relax.Function, name: str) -> relax.Function:
    # The model file as its users run it: ONNX Runtime's default session (all graph optimizations, idle threads
    # spinning: nothing else runs beside it) with Collage's threads.
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, runtime.pack_model(model, spinning=True))


HOOKS = engine_hooks(
    BACKEND,
    engine="onnxruntime",
    install_hint=INSTALL_HINT,
    describe=_describe,
    missing=_missing,
    target_kinds=("llvm", "c"),
    lowering=_lowering,
    whole_onnx_model=_whole_model,
    register_runtime=runtime.register,
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
