"""The packed function a lowered partition calls: run its ONNX model in ONNX Runtime, in place.

A lowered partition is ``R.call_dps_packed("collage_onnxruntime.run", [model, *inputs], ...)``
where ``model`` is a uint8 constant holding :func:`pack_model`'s blob: the SHA-256 digest of
what follows, an options byte (whether idle threads spin), then the serialized ONNX model. The
VM hands over the blob, the input tensors and the output tensors it allocated; ONNX Runtime reads
the inputs and writes the outputs in place, through an IOBinding of the tensors' addresses (no
copies).
"""

from __future__ import annotations

import numpy as np
import tvm

from collage_core.kit import backend_threads, engine_caches, engine_lowering

RUN_FUNCTION = "collage_onnxruntime.run"
# Sessions kept alive: far more than the ONNX Runtime partitions of one model, so none is rebuilt
# while a model runs, yet a measurement worker going through thousands of candidates stays bounded.
MAX_SESSIONS = 1024
# IOBindings kept per model and thread, by the addresses they bind. Identical partitions (the
# head reshapes of every BERT layer) share one model, each with its own buffers.
BINDINGS_PER_THREAD = 64
CPU = tvm.cpu(0).dlpack_device_type()
SPINNING = 1  # the options byte's flag: the session's idle threads spin


def pack_model(serialized: bytes, spinning: bool = False) -> np.ndarray:
    """The blob a lowered partition carries (``collage_core.kit.engine_lowering.pack_blob``); its
    options byte says whether the session's idle threads spin."""
    return engine_lowering.pack_blob(serialized, SPINNING if spinning else 0)


def unpack_blob(blob: np.ndarray) -> tuple[bytes, bool]:
    """The serialized model and whether its session's idle threads spin."""
    serialized, options = engine_lowering.unpack_blob(blob, "collage_onnxruntime")
    return serialized, bool(options & SPINNING)


def unpack_model(blob: np.ndarray) -> bytes:
    return unpack_blob(blob)[0]


def session_options(spinning: bool = False):
    """All graph optimizations, ``collage_core.kit.backend_threads()`` threads, and no spinning
    unless ``spinning``.

    ONNX Runtime's worker threads spin while waiting for work by default. Between two ONNX
    Runtime partitions, TVM's kernels run in the same process on the same cores, and spinning
    threads would steal those cores from them; so both pools block instead of spinning. When
    ONNX Runtime runs the whole executable there is nothing to steal from, and spinning is
    faster: MobileNetV2 took 4.7 ms instead of 5.0 ms on 2 quiet cores.
    """
    import onnxruntime  # here, not at import: the plugin loads, and says why it is unavailable, without it

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = backend_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3  # errors only: no warnings about unused initializers
    return options


class _Model:
    """A session, its input and output names, and each thread's IOBindings by the addresses they
    hold. A binding holds only addresses, and is run only while the tensors at those addresses are
    the ones just passed."""

    def __init__(self, session):
        self.session = session
        self.input_names = [value.name for value in session.get_inputs()]
        self.output_names = [value.name for value in session.get_outputs()]
        self.arity = len(self.input_names) + len(self.output_names)
        self._bindings = engine_caches.BindingsByAddress(BINDINGS_PER_THREAD, self._bind)

    def run(self, tensors) -> None:
        if len(tensors) != self.arity:
            raise ValueError(
                f"{RUN_FUNCTION}: the model takes {len(self.input_names)} inputs and gives {len(self.output_names)} "
                f"outputs, but {len(tensors)} tensors were passed"
            )
        self.session.run_with_iobinding(self._bindings.get(tensors))

    def _bind(self, tensors, _dropped):
        binding = self.session.io_binding()
        for index, (name, tensor) in enumerate(zip(self.input_names + self.output_names, tensors)):
            if not tensor.is_contiguous() or tensor.device.dlpack_device_type() != CPU:
                raise ValueError(f"{RUN_FUNCTION}: tensor {name} is not a contiguous CPU tensor")
            bind = binding.bind_input if index < len(self.input_names) else binding.bind_output
            bind(name, "cpu", 0, np.dtype(str(tensor.dtype)), tuple(tensor.shape), tensor.data_ptr())
        return binding


def _compile(serialized: bytes, options: int) -> _Model:
    import onnxruntime  # here, not at import: the plugin loads, and says why it is unavailable, without it

    spinning = bool(options & SPINNING)
    return _Model(onnxruntime.InferenceSession(serialized, session_options(spinning), providers=["CPUExecutionProvider"]))


SESSIONS = engine_caches.CompiledModels(MAX_SESSIONS, _compile, "collage_onnxruntime")


def session_for(serialized: bytes, spinning: bool = False):
    """The cached session for a serialized model (what a lowered partition would run)."""
    return SESSIONS.get(pack_model(serialized, spinning)).session


def run(blob, *tensors) -> None:
    """DPS entry point: ``tensors`` are the partition's inputs, then the outputs to fill."""
    SESSIONS.get(np.from_dlpack(blob)).run(tensors)


def register() -> None:
    """Make :func:`run` the global ``collage_onnxruntime.run`` (again, if already registered)."""
    tvm.register_global_func(RUN_FUNCTION, run, override=True)
