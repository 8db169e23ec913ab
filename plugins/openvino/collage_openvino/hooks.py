"""OpenVINO's CPU plugin as a Collage backend (graph level; fp32, and bf16 on CPUs with AMX or AVX512-BF16).

Each partition is converted to an ONNX model (``collage_core.kit.relax_to_onnx``), which OpenVINO reads
and compiles, and replaced by a call to the packed function ``collage_openvino.run`` that carries
the model as a constant, so the built executable is self-contained: running it needs only
``import collage_openvino``. With ``collage optimize --precision bf16`` on a CPU with bf16 units, regions
holding bfloat16 tensors are taken too and compiled with OpenVINO's bf16 inference precision.
"""

from __future__ import annotations

from typing import Optional

from collage_core.kit import GRAPH_LEVEL, Backend, engine_hooks, engine_lowering, has_fast_bf16, relax_to_onnx, tvm_compat
from collage_openvino import runtime

BACKEND = "openvino"
INSTALL_HINT = "pip install openvino"
# How partitions are lowered and run. Part of the backend's version, so costs measured with other
# code are never reused.
LOWERING_REVISION = 4


def sixteen_bit() -> frozenset:
    """The 16-bit types partitions may hold: bfloat16 where this CPU computes it fast, else none."""
    return frozenset({"bfloat16"}) if has_fast_bf16() else frozenset()


def _describe(openvino_version: str) -> Backend:
    return Backend(
        name=BACKEND,
        kind=GRAPH_LEVEL,
        device_kinds=("cpu",),
        version=f"{openvino_version.split('-')[0]}+lowering-{LOWERING_REVISION}",
        description="OpenVINO, CPU plugin in fp32, and bf16 for bf16 partitions (converted to ONNX opset 17)",
        runtime_needs=f"the collage-openvino plugin (pip install -e plugins/openvino) and openvino ({INSTALL_HINT})",
        lowering_uses_device=False,  # converts only; OpenVINO compiles when the partition first runs
    )


def _missing(openvino) -> Optional[str]:
    try:
        devices = runtime.core().available_devices
    except Exception as error:  # noqa: BLE001 - OpenVINO raises its own RuntimeError subclasses
        return f"openvino cannot start ({error}): {INSTALL_HINT}"
    if "CPU" not in devices:
        return f"this openvino has no CPU plugin (devices: {', '.join(devices) or 'none'}): {INSTALL_HINT}"
    return None


def lower_function(func, name: str):
    """``func`` with its body replaced by one ``collage_openvino.run`` call on its ONNX model."""
    taken = sixteen_bit()
    holds_16_bit = any(dtype in taken for dtype in _dtypes(func))
    # A bfloat16 partition goes to OpenVINO as float32 arithmetic compiled under its bf16 inference precision:
    # OpenVINO then chooses what runs in bf16 (as its own bf16 mode does), without TVM's casts around every product.
    model = relax_to_onnx.convert(func, name, taken, widened=taken if holds_16_bit else frozenset())
    options = runtime.BF16_INFERENCE if holds_16_bit else 0
    blob = engine_lowering.pack_blob(model.SerializeToString(), options)
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, blob)


def _dtypes(func) -> set:
    """The dtypes of ``func``'s parameters and of every value its bindings compute."""
    found = set()
    values = list(func.params) + [b.var for block in func.body.blocks for b in block.bindings]
    for value in values:
        try:
            found.add(tvm_compat.tensor_shape_dtype(value)[1])
        except (ValueError, AttributeError):
            pass  # tuples and other non-tensor values
    return found


def _whole_model(model: bytes, func, name: str):
    # The model file as its users run it, read by OpenVINO's ONNX frontend and compiled as every partition is
    # (latency hint, one stream, Collage's threads, f32 inference precision: a float32 file stays exact).
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, engine_lowering.pack_blob(model))


HOOKS = engine_hooks(
    BACKEND,
    engine="openvino",
    install_hint=INSTALL_HINT,
    describe=_describe,
    missing=_missing,
    target_kinds=("llvm", "c"),
    sixteen_bit=sixteen_bit,
    lowering=lambda mod, function_names, target: lower_function,
    whole_onnx_model=_whole_model,
    register_runtime=runtime.register,
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
