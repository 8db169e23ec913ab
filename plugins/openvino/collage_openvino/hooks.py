"""OpenVINO's CPU plugin as a Collage backend (graph level; fp32, and bf16 on CPUs with AMX or AVX512-BF16).

Each partition is converted to an ONNX model (``collage_core.kit.relax_to_onnx``), which OpenVINO reads
and compiles, and replaced by a call to the packed function ``collage_openvino.run`` that carries
the model as a constant, so the built executable is self-contained: running it needs only
``import collage_openvino``. With ``collage optimize --precision bf16`` on a CPU with bf16 units, regions
holding bfloat16 tensors are taken too and compiled with OpenVINO's bf16 inference precision.
"""

from __future__ import annotations

import importlib

from collage_core.kit import (
    GRAPH_LEVEL,
    Availability,
    Backend,
    engine_lowering,
    engine_patterns,
    has_fast_bf16,
    hookimpl,
    hookimpl_for,
    relax_to_onnx,
    replace_functions,
    tvm_compat,
)
from collage_openvino import runtime

BACKEND = "openvino"
INSTALL_HINT = "pip install openvino"
# How partitions are lowered and run. Part of the backend's version, so costs measured with other
# code are never reused.
LOWERING_REVISION = 4


def sixteen_bit() -> frozenset:
    """The 16-bit types partitions may hold: bfloat16 where this CPU computes it fast, else none."""
    return frozenset({"bfloat16"}) if has_fast_bf16() else frozenset()


def _import_openvino():
    """The openvino module, or the error importing it raised (the backend is then unavailable)."""
    try:
        return importlib.import_module("openvino")
    except ImportError as error:
        return error


@hookimpl
def collage_register_backends(register):
    openvino = _import_openvino()
    version = getattr(openvino, "__version__", "not installed").split("-")[0]
    register(
        Backend(
            name=BACKEND,
            kind=GRAPH_LEVEL,
            device_kinds=("cpu",),
            version=f"{version}+lowering-{LOWERING_REVISION}",
            description="OpenVINO, CPU plugin in fp32, and bf16 for bf16 partitions (converted to ONNX opset 17)",
            runtime_needs=f"the collage-openvino plugin (pip install -e plugins/openvino) and openvino ({INSTALL_HINT})",
            lowering_uses_device=False,  # converts only; OpenVINO compiles when the partition first runs
        )
    )


@hookimpl_for(BACKEND)
def collage_check_availability(backend):
    openvino = _import_openvino()
    if isinstance(openvino, ImportError):
        return Availability.no(f"openvino cannot be imported ({openvino}): {INSTALL_HINT}")
    try:
        devices = runtime.core().available_devices
    except Exception as error:  # noqa: BLE001 - OpenVINO raises its own RuntimeError subclasses
        return Availability.no(f"openvino cannot start ({error}): {INSTALL_HINT}")
    if "CPU" not in devices:
        return Availability.no(f"this openvino has no CPU plugin (devices: {', '.join(devices) or 'none'}): {INSTALL_HINT}")
    return Availability.yes()


@hookimpl_for(BACKEND)
def collage_contribute_patterns(backend, target):
    if target.kind.name not in ("llvm", "c"):
        return []
    return engine_patterns.operator_patterns(BACKEND, sixteen_bit=sixteen_bit())


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


@hookimpl_for(BACKEND)
def collage_lower_partitions(backend, mod, function_names, target):
    return replace_functions(mod, function_names, lower_function)


@hookimpl_for(BACKEND)
def collage_lower_whole_model(backend, model, model_format, func, name, target):
    if model_format != "onnx" or target.kind.name not in ("llvm", "c"):
        return None
    # The model file as its users run it, read by OpenVINO's ONNX frontend and compiled as every partition is
    # (latency hint, one stream, Collage's threads, f32 inference precision: a float32 file stays exact).
    return engine_lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, engine_lowering.pack_blob(model))


@hookimpl_for(BACKEND)
def collage_prepare_runtime(backend):
    openvino = _import_openvino()
    if isinstance(openvino, ImportError):
        raise RuntimeError(f"openvino cannot be imported ({openvino}): {INSTALL_HINT}")
    runtime.register()
    return True
