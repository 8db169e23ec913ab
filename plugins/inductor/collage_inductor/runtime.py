"""The packed function a lowered partition calls: run its PyTorch program compiled by TorchInductor.

A lowered partition is ``R.call_dps_packed("collage_inductor.run", [key, program, *inputs], ...)``:
``program`` is a uint8 constant (``collage_core.kit.engine_lowering.pack_blob``: a digest, an options
byte, none defined yet, then the partition as a ``torch.export`` program, ``torch.export.save``) and
``key`` is its digest in hexadecimal, a string. The VM copies constant tensors to the device it runs
on, so on a GPU the program arrives in device memory; reading it there would be a copy to the host
and a synchronization on every call, so the host-side key names it and the program is read only the
first time a process meets the key on a device. Compiled programs are kept by key and device.

Compiling: the program was traced on the CPU with the partition's dtypes and holds no device; it is
moved to the device of the tensors it is called with (``torch.export.passes.move_to_device_pass``:
weights, constants and every device an operator names) and compiled by ``torch.compile`` (inductor,
static shapes, one graph; C++ kernels on the CPU, Triton kernels on CUDA) when it first runs.
Inductor's caches under ``$COLLAGE_CACHE_DIR/inductor`` keep the generated kernels across processes.

Inputs reach PyTorch through DLPack without copies (the views are made once per set of addresses);
the results PyTorch allocates are copied into the VM's output tensors (torch.compile has no
destination-passing form).

On CUDA, TVM's stream and CUDA graphs decide the rest:

- Every kernel runs on TVM's current stream (``tvm_ffi.get_raw_stream``), made PyTorch's current
  stream for the call (``torch.cuda.ExternalStream``), so it is ordered with TVM's kernels and, while
  TVM captures ``main`` (``vm.builtin.cuda_graph.run_or_capture`` swaps in its capture stream), it
  is captured with them. Inductor's own CUDA graphs are off (``triton.cudagraphs``): Collage captures
  the whole ``main``, and a graph cannot be launched inside a capture.
- Compiling, Triton's autotuning and loading the program (a copy from the device) must not happen
  inside a capture. TVM runs each graph's function once before capturing it, so every program has
  run by then; a program that has not (a capture without that warm-up) is refused with an error
  saying so, which ends the capture instead of corrupting it, and a recompilation inside a capture
  (a guard that fails) is refused likewise (``torch.compiler.set_stance("fail_on_recompile")``).
- PyTorch's caching allocator must not serve a capturing stream from its ordinary pools: it would
  query events (illegal while capturing) and hand the captured kernels memory it later gives to
  others. Each call inside a capture allocates from a private pool of its own
  (``torch.cuda.MemPool`` with ``torch.cuda.use_mem_pool``, both in torch 2.11 and 2.13), and the
  program holds that pool and the results allocated in it for as long as it lives: the captured
  graph writes and reads that memory every time it is replayed, without calling this function
  again. A program that ran inside a capture is therefore never dropped from the cache (the graph
  may be replayed until the process ends; the process cannot know when TVM drops it). Its
  intermediate buffers, freed back into its pool during the capture, stay reserved there.
- Convolutions and float32 products run without TF32 (``allow_tf32`` off for cuDNN and cuBLAS),
  so float32 partitions compute what TVM and the reference compute.
"""

from __future__ import annotations

import collections
import io
import os
import threading
from pathlib import Path

import tvm

from collage_core.kit import backend_threads, engine_caches, engine_lowering

RUN_FUNCTION = "collage_inductor.run"
OWNER = "collage_inductor"
# Compiled programs kept alive besides those a CUDA graph captured: far more than the Inductor partitions of one model.
MAX_PROGRAMS = 256
# DLPack views kept per program and thread, by the addresses they view.
VIEWS_PER_THREAD = 16
CPU = tvm.cpu(0).dlpack_device_type()
CUDA = tvm.cuda(0).dlpack_device_type()
# Collage captures the whole main as CUDA graphs; inductor's own graphs would be launched inside that capture.
COMPILE_OPTIONS = {"triton.cudagraphs": False}


def cache_dir() -> Path:
    """Where inductor keeps its generated kernels and compiled graphs across processes."""
    root = os.environ.get("COLLAGE_CACHE_DIR") or Path.home() / ".cache" / "collage"
    return Path(root) / "inductor"


def threads() -> int:
    """PyTorch's intra-op threads for Inductor's kernels (``collage_core.kit.backend_threads``)."""
    return backend_threads()


def key_of(blob) -> str:
    """The key a lowered partition names its program by: the blob's digest in hexadecimal."""
    return engine_lowering.blob_key(blob).hex()


class CaptureError(RuntimeError):
    """A program was asked to compile or load while TVM captures a CUDA graph."""


class _Program:
    """A compiled program on one device, how many inputs and outputs it has, whether it has run, per
    thread the torch views of a set of tensor addresses (valid only while the tensors at those
    addresses are the ones passed), and what every CUDA-graph capture it ran in allocated."""

    def __init__(self, compiled, inputs: int, outputs: int, device):
        self.compiled, self.inputs, self.outputs, self.device = compiled, inputs, outputs, device
        self.has_run = False
        self.captures: list = []  # (pool, results): memory a captured graph replays into
        self._views = engine_caches.BindingsByAddress(VIEWS_PER_THREAD, self._view)

    def _view(self, tensors, _dropped):
        import torch

        views = []
        for index, tensor in enumerate(tensors):
            device = tensor.device
            if not tensor.is_contiguous() or (device.dlpack_device_type(), device.index) != self.device:
                kind = "CPU" if self.device[0] == CPU else f"cuda:{self.device[1]}"
                raise ValueError(f"{RUN_FUNCTION}: tensor {index} is not a contiguous {kind} tensor")
            views.append(torch.from_dlpack(tensor))
        return views

    def run(self, tensors, capturing: bool = False) -> None:
        import torch

        if len(tensors) != self.inputs + self.outputs:
            raise ValueError(
                f"{RUN_FUNCTION}: the program takes {self.inputs} inputs and gives {self.outputs} outputs, "
                f"but {len(tensors)} tensors were passed"
            )
        if capturing and not self.has_run:
            raise CaptureError(f"{RUN_FUNCTION}: a program's first run (where inductor compiles and Triton tunes) "
                               "is inside a CUDA graph capture; run the function once before capturing it")
        views = self._views.get(tensors)
        with torch.inference_mode():
            if capturing:
                pool = torch.cuda.MemPool()
                with torch.cuda.use_mem_pool(pool), torch.compiler.set_stance("fail_on_recompile"):
                    results = self._run(views)
                self.captures.append((pool, results))
            else:
                self._run(views)
                self.has_run = True

    def _run(self, views):
        results = self.compiled(*views[: self.inputs])
        for target, result in zip(views[self.inputs:], results):
            target.copy_(result)
        return results


class Programs:
    """Compiled programs by key and device, least recently used dropped first beyond ``capacity``;
    a program that ran inside a CUDA-graph capture is kept for good (its graph may be replayed)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._programs: collections.OrderedDict = collections.OrderedDict()
        self._captured: dict = {}
        self._lock = threading.Lock()

    def find(self, key: str, device):
        """The compiled program of ``key`` on ``device`` ((DLPack device type, index)), or None."""
        with self._lock:
            program = self._captured.get((key, device))
            if program is None:
                program = self._programs.get((key, device))
                if program is not None:
                    self._programs.move_to_end((key, device))
            return program

    def load(self, key: str, blob, device) -> _Program:
        """Compile the program ``blob`` carries for ``device`` (the blob is read from wherever it is) and keep it."""
        host = blob.numpy()
        serialized, _options = engine_lowering.unpack_blob(host, OWNER)
        if key_of(host) != key:
            raise ValueError(f"{OWNER}: the program does not match its key {key}")
        program = _compile(serialized, device)
        with self._lock:
            self._programs[(key, device)] = program
            while len(self._programs) > self.capacity:
                self._programs.popitem(last=False)
        return program

    def keep(self, key: str, device, program: _Program) -> None:
        """Never drop ``program``: a CUDA graph captured its kernels."""
        with self._lock:
            self._captured[(key, device)] = program
            self._programs.pop((key, device), None)

    def clear(self) -> None:
        """Drop every program no capture holds."""
        with self._lock:
            self._programs.clear()

    def __len__(self) -> int:
        return len(self._programs) + len(self._captured)


def _compile(serialized: bytes, device) -> _Program:
    import torch
    import torch.export.passes

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))
    program = torch.export.load(io.BytesIO(serialized))
    if device[0] == CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        program = torch.export.passes.move_to_device_pass(program, torch.device("cuda", device[1]))
    elif torch.get_num_threads() != threads():
        torch.set_num_threads(threads())
    signature = program.graph_signature
    compiled = torch.compile(program.module(), backend="inductor", dynamic=False, fullgraph=True,
                             options=COMPILE_OPTIONS)
    return _Program(compiled, len(signature.user_inputs), len(signature.user_outputs), device)


PROGRAMS = Programs(MAX_PROGRAMS)


def _program(key: str, blob, device, capturing: bool) -> _Program:
    program = PROGRAMS.find(key, device)
    if program is not None:
        return program
    if capturing:
        raise CaptureError(f"{RUN_FUNCTION}: program {key[:16]} is met for the first time inside a CUDA graph "
                           "capture, where it can be neither read from the device nor compiled; run the function "
                           "once before capturing it")
    return PROGRAMS.load(key, blob, device)


def run(key: str, blob, *tensors) -> None:
    """DPS entry point: ``key`` names the program ``blob`` carries; ``tensors`` are the partition's inputs,
    then the outputs to fill, all on one device."""
    if not tensors:
        raise ValueError(f"{RUN_FUNCTION}: no tensors were passed")
    device = (tensors[0].device.dlpack_device_type(), tensors[0].device.index)
    if device[0] != CUDA:
        _program(key, blob, device, False).run(tensors)
        return
    import torch
    import tvm_ffi

    stream = tvm_ffi.get_raw_stream(tensors[0].device)
    with torch.cuda.device(device[1]):
        torch_stream = torch.cuda.ExternalStream(stream) if stream else torch.cuda.default_stream()
        with torch.cuda.stream(torch_stream):
            capturing = torch.cuda.is_current_stream_capturing()
            program = _program(key, blob, device, capturing)
            program.run(tensors, capturing)
            if capturing:
                PROGRAMS.keep(key, device, program)


def register() -> None:
    """Make :func:`run` the global ``collage_inductor.run`` (again, if already registered)."""
    tvm.register_global_func(RUN_FUNCTION, run, override=True)
