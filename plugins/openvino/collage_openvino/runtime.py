"""The packed function a lowered partition calls: run its model in OpenVINO, in place.

A lowered partition is ``R.call_dps_packed("collage_openvino.run", [model, *inputs], ...)`` where
``model`` is a uint8 constant (``collage_core.kit.engine_lowering.pack_blob``): a digest, an
options byte (none are defined yet), then the partition as an ONNX model. The model is read and
compiled for the CPU once per process (OpenVINO's own model cache, under
``$COLLAGE_CACHE_DIR/openvino``, keeps the compiled form across processes). Each call's tensors
are wrapped as OpenVINO tensors over the VM's buffers (no copies): OpenVINO reads the inputs and
writes the outputs where the VM allocated them.

Compiled with the latency hint (one stream), one thread per core this process may use, and
``INFERENCE_PRECISION_HINT`` f32: on CPUs with bf16 units OpenVINO would otherwise compute in
bf16 by itself, and an fp32 model must stay fp32.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tvm

from collage_core.kit import backend_threads, engine_caches

RUN_FUNCTION = "collage_openvino.run"
# Compiled models kept alive: far more than the OpenVINO partitions of one model, yet a measurement
# worker going through thousands of candidates stays bounded.
MAX_MODELS = 1024
# Infer requests kept per model and thread, each bound to one set of tensor addresses. A request
# holds its own intermediate buffers, so fewer are kept than ONNX Runtime's bindings; beyond
# them, the least recently used request is bound again (a few microseconds a tensor).
REQUESTS_PER_THREAD = 4
CPU = tvm.cpu(0).dlpack_device_type()


def compile_config(threads: int | None = None, precision: str = "f32") -> dict:
    """The CPU plugin's settings for a partition: latency, one stream, ``threads`` (default:
    ``collage_core.kit.backend_threads()``) and ``precision`` arithmetic (f32 unless the partition holds bf16)."""
    return {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_NUM_THREADS": threads or backend_threads(),
        "INFERENCE_PRECISION_HINT": precision,
    }


# The options byte's flag: compile with OpenVINO's bf16 inference precision (a partition of a model converted with
# --precision bf16); otherwise f32, and a float32 partition stays exact.
BF16_INFERENCE = 1


def inference_precision(options: int) -> str:
    return "bf16" if options & BF16_INFERENCE else "f32"


def cache_dir() -> Path:
    """Where OpenVINO keeps compiled models across processes."""
    root = os.environ.get("COLLAGE_CACHE_DIR") or Path.home() / ".cache" / "collage"
    return Path(root) / "openvino"


_CORE = None


def core():
    """The process's one ``openvino.Core``, its model cache under :func:`cache_dir`."""
    global _CORE
    if _CORE is None:
        import openvino  # here, not at import: the plugin loads, and says why it is unavailable, without it

        _CORE = openvino.Core()
        try:
            cache_dir().mkdir(parents=True, exist_ok=True)
            _CORE.set_property({"CACHE_DIR": str(cache_dir())})
        except OSError:
            pass  # no writable cache: compile each time
    return _CORE


class _Model:
    """A compiled model and, per thread, infer requests bound to the tensors at a set of
    addresses. A request is run only while the tensors at those addresses are the ones passed."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.inputs = len(compiled.inputs)
        self.outputs = len(compiled.outputs)
        self._requests = engine_caches.BindingsByAddress(REQUESTS_PER_THREAD, self._bind)

    def run(self, tensors) -> None:
        if len(tensors) != self.inputs + self.outputs:
            raise ValueError(
                f"{RUN_FUNCTION}: the model takes {self.inputs} inputs and gives {self.outputs} outputs, "
                f"but {len(tensors)} tensors were passed"
            )
        self._requests.get(tensors).infer()

    def _bind(self, tensors, dropped):
        import openvino

        request = dropped if dropped is not None else self.compiled.create_infer_request()
        for index, tensor in enumerate(tensors):
            if not tensor.is_contiguous() or tensor.device.dlpack_device_type() != CPU:
                raise ValueError(f"{RUN_FUNCTION}: tensor {index} is not a contiguous CPU tensor")
            shared = _shared(openvino, tensor)
            if index < self.inputs:
                request.set_input_tensor(index, shared)
            else:
                request.set_output_tensor(index - self.inputs, shared)
        return request


def _shared(openvino, tensor):
    """An OpenVINO tensor over ``tensor``'s memory; bfloat16 through a uint16 view (NumPy has no bfloat16 over DLPack)."""
    if str(tensor.dtype) == "bfloat16":
        bits = np.from_dlpack(tensor._create_view(tensor.shape, "uint16"))
        return openvino.Tensor(bits, list(tensor.shape), openvino.Type.bf16)
    return openvino.Tensor(np.from_dlpack(tensor), shared_memory=True)


def _compile(serialized: bytes, options: int) -> _Model:
    model = core().read_model(model=serialized, weights=b"")
    return _Model(core().compile_model(model, "CPU", compile_config(precision=inference_precision(options))))


MODELS = engine_caches.CompiledModels(MAX_MODELS, _compile, "collage_openvino")


def run(blob, *tensors) -> None:
    """DPS entry point: ``tensors`` are the partition's inputs, then the outputs to fill."""
    MODELS.get(np.from_dlpack(blob)).run(tensors)


def register() -> None:
    """Make :func:`run` the global ``collage_openvino.run`` (again, if already registered)."""
    tvm.register_global_func(RUN_FUNCTION, run, override=True)
