"""The packed function a lowered partition calls: run its PyTorch program compiled by TorchInductor.

A lowered partition is ``R.call_dps_packed("collage_inductor.run", [key, program, *inputs], ...)``:
``program`` is a uint8 constant (``collage_core.kit.engine_lowering.pack_blob``: a digest, an options
byte, none defined yet, then the partition as a ``torch.export`` program, ``torch.export.save``) and
``key`` is its digest in hexadecimal, a string. The VM copies constant tensors to the device it runs
on, so on a GPU the program arrives in device memory; reading it there would be a copy to the host
and a synchronization on every call, so the host-side key names it and the program is read only the
first time a process meets the key on a device, and only when no package of it is there to load.
Compiled programs are kept by key and device.

Compiling: the program was traced on the CPU with the partition's dtypes and holds no device; it is
moved to the device of the tensors it is called with (``torch.export.passes.move_to_device_pass``:
weights, constants and every device an operator names) and compiled once per machine by AOTInductor
(``torch._inductor.aoti_compile_and_package``: inductor, static shapes; C++ kernels on the CPU, Triton
kernels on CUDA) into a package, ``$COLLAGE_CACHE_DIR/inductor/aoti/<key>-<build>.pt2``, where
``<build>`` is a digest of what else decides the compiled code (:func:`build_signature`: torch's
version, the device, on the CPU the processor and the thread count inductor writes into its C++, on
CUDA the GPU and triton's version, the C++ compiler, :data:`PACKAGE_REVISION` and the options). Every
later process loads the package (``torch._C._aoti.AOTIModelPackageLoader``, as
``torch._inductor.aoti_load_package`` does, without importing dynamo) in milliseconds, where
``torch.compile`` took seconds per region and process even with inductor's caches warm (dynamo's
tracing, AOT autograd, the cache lookups), and Collage measures every placement in a fresh process.
A package is written whole: compiled into a temporary file in the same folder, then renamed into
place, so two processes compiling the same key at once both end with a whole package (the last
rename wins; both are the same program's). A package that does not pass its zip CRC checks
or that AOTInductor cannot load (truncated, corrupt) is compiled again, with a one-line warning. A
program AOTInductor cannot compile (an operator it does not take) runs through ``torch.compile`` as
before, with a one-line warning, and a marker beside the package path makes later processes go there
directly. Inductor's caches under ``$COLLAGE_CACHE_DIR/inductor`` keep the generated kernels for both.

Inputs reach PyTorch through DLPack without copies (the views are made once per set of addresses);
the results PyTorch allocates are copied into the VM's output tensors (neither AOTInductor's runner
nor torch.compile has a destination-passing form).

On CUDA, TVM's stream and CUDA graphs decide the rest:

- Every kernel runs on TVM's current stream (``tvm_ffi.get_raw_stream``), made PyTorch's current
  stream for the call (``torch.cuda.ExternalStream``), so it is ordered with TVM's kernels and, while
  TVM captures ``main`` (``vm.builtin.cuda_graph.run_or_capture`` swaps in its capture stream), it
  is captured with them. AOTInductor's runner launches on PyTorch's current stream when it is given
  none, as :meth:`_Package.__call__` does: ``AOTIModelContainerRunnerCuda::run_impl`` takes
  ``c10::cuda::getCurrentCUDAStream()`` when ``stream_handle`` is null
  (``torch/csrc/inductor/aoti_runner/model_container_runner_cuda.cpp`` in pytorch/pytorch; earlier
  versions' ``AOTIModelContainerRunnerCuda::run`` did the same), and the generated code launches every
  kernel on the stream it is handed. The package is loaded single-threaded
  (``run_single_threaded``, which ``aoti_load_package`` documents as the way to avoid conflicts with
  CUDA graphs): the threaded runner records a CUDA event after
  each run and queries or waits on it before the next (``AOTInductorModelContainer::run``,
  ``reclaim_finished_models``), both illegal inside a capture; a lock keeps one call at a time
  instead. Inductor's own CUDA graphs are off (``triton.cudagraphs``, for the ``torch.compile``
  fallback; AOTInductor makes none): Collage captures the whole ``main``, and a graph cannot be
  launched inside a capture.
- Compiling, Triton's autotuning and loading the program (a copy from the device, a package's
  kernels loaded on its first run) must not happen inside a capture. TVM runs each graph's function
  once before capturing it, so every program has run by then; a program that has not (a capture
  without that warm-up) is refused with an error saying so, which ends the capture instead of
  corrupting it, and a recompilation inside a capture of the ``torch.compile`` fallback (a guard that
  fails) is refused likewise (``torch.compiler.set_stance("fail_on_recompile")``).
- PyTorch's caching allocator must not serve a capturing stream from its ordinary pools: it would
  query events (illegal while capturing) and hand the captured kernels memory it later gives to
  others. Each call inside a capture allocates from a private pool of its own
  (``torch.cuda.MemPool`` with ``torch.cuda.use_mem_pool``, both in torch 2.11 and 2.13), and the
  program holds that pool and the results allocated in it for as long as it lives: the captured
  graph writes and reads that memory every time it is replayed, without calling this function
  again. A program that ran inside a capture is therefore never dropped from the cache (the graph
  may be replayed until the process ends; the process cannot know when TVM drops it). Its
  intermediate buffers, freed back into its pool during the capture, stay reserved there.
- Convolutions and float32 products run without TF32 (``allow_tf32`` off for cuDNN and cuBLAS in
  every process that runs a program: a package calls ATen's products and convolutions, which read
  the flags when they run), so float32 partitions compute what TVM and the reference compute.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import threading
import zipfile
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
# AOTInductor's options besides the package itself (none: its defaults make no CUDA graphs).
PACKAGE_OPTIONS: dict = {}
# How packages are compiled and named: a new revision compiles every program again.
PACKAGE_REVISION = 1
FAILED_SUFFIX = ".failed"
log = logging.getLogger("collage.inductor")
# Inductor's cache folder when the user chose one; else ours. Read before torch can set it: inductor writes its
# default into the environment the first time it looks (during torch.export, in the processes that lower).
_CHOSEN_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def cache_dir() -> Path:
    """Where inductor keeps its generated kernels and compiled graphs across processes."""
    root = os.environ.get("COLLAGE_CACHE_DIR") or Path.home() / ".cache" / "collage"
    return Path(root) / "inductor"


def package_dir() -> Path:
    """Where AOTInductor's compiled packages are kept, one per program and build (:func:`package_path`)."""
    return cache_dir() / "aoti"


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
            raise CaptureError(
                f"{RUN_FUNCTION}: a program's first run (where inductor compiles and Triton tunes) "
                "is inside a CUDA graph capture; run the function once before capturing it"
            )
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
        for target, result in zip(views[self.inputs :], results):
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
        """The program ``blob`` carries, for ``device``, loaded from its package or compiled, and kept. The blob is
        read (from wherever it is) only when there is no package to load."""

        def read() -> bytes:
            host = blob.numpy()
            serialized, _options = engine_lowering.unpack_blob(host, OWNER)
            if key_of(host) != key:
                raise ValueError(f"{OWNER}: the program does not match its key {key}")
            return serialized

        program = _compile(key, read, device)
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


def _processor() -> str:
    """This CPU as the C++ code inductor generates depends on it: its model and the instruction sets it offers."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    fields = [line.split(":", 1) for line in lines if ":" in line]
    return " / ".join(dict.fromkeys(value.strip() for name, value in fields if name.strip() in ("model name", "flags")))


def build_signature(device) -> dict:
    """What decides a package's compiled code besides the program: torch's version, the device (on the CPU, the
    processor and the threads; on CUDA, the GPU, CUDA's and triton's versions), the compiler, the options."""
    import torch

    signature = {"revision": PACKAGE_REVISION, "torch": torch.__version__, "options": PACKAGE_OPTIONS, "machine": platform.machine()}
    if device[0] == CUDA:
        import triton

        properties = torch.cuda.get_device_properties(device[1])
        signature.update(
            device=f"cuda {properties.name} sm_{properties.major}{properties.minor}", cuda=torch.version.cuda, triton=triton.__version__
        )
    else:
        # Inductor writes the thread count into the C++ it generates (``omp parallel num_threads``).
        signature.update(device="cpu", processor=_processor(), threads=threads())
    signature["compiler"] = shutil.which(os.environ.get("CXX") or "g++") or ""
    return signature


def package_path(key: str, device) -> Path:
    """The package of program ``key`` compiled for ``device`` on this machine (which may not exist yet)."""
    build = hashlib.sha256(json.dumps(build_signature(device), sort_keys=True).encode()).hexdigest()[:16]
    return package_dir() / f"{key}-{build}.pt2"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class _Package:
    """A program compiled by AOTInductor, called with its inputs as a list of tensors (its outputs, a list)."""

    def __init__(self, loader, single_threaded: bool):
        self.loader = loader
        self._lock = threading.Lock() if single_threaded else None

    def __call__(self, *inputs):
        # No stream is given: the runner launches on PyTorch's current one (TVM's, see the module's docstring).
        if self._lock is None:
            return self.loader.boxed_run(list(inputs))
        with self._lock:
            return self.loader.boxed_run(list(inputs))


def _loader(path: Path, device):
    """AOTInductor's loader of the package at ``path`` for ``device``: made directly, as
    ``torch._inductor.aoti_load_package`` makes it (whose import, dynamo's, costs 0.9 s in every process), in one
    thread on CUDA (see the module's docstring)."""
    import torch

    single_threaded = device[0] == CUDA
    index = device[1] if device[0] == CUDA else -1
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", single_threaded, 1, index)
    except TypeError:  # another torch's constructor: ask the public function
        import torch._inductor

        return torch._inductor.aoti_load_package(str(path), run_single_threaded=single_threaded, device_index=index).loader


def _load_package(path: Path, device):
    """The package at ``path`` loaded for ``device``, or None when there is none or it is unreadable (then a
    warning says so, and the caller compiles it again over it)."""
    if not path.is_file():
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
        if broken is not None:
            raise ValueError(f"{broken} fails its CRC check")
        return _Package(_loader(path, device), single_threaded=device[0] == CUDA)
    except Exception as error:  # whatever a truncated or corrupt file raises, it is compiled again
        log.warning("%s: the compiled package %s cannot be read (%s); compiling it again", OWNER, path.name, _first_line(error))
        return None


def _write_whole(path: Path, write) -> None:
    """``write(temporary)`` makes the file; it is then renamed to ``path``, so no reader sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _compile_package(program, path: Path, device):
    """``program`` compiled by AOTInductor into the package at ``path`` and loaded, or None when AOTInductor cannot
    compile it (then a marker beside ``path`` says why, and a warning)."""
    import torch._inductor

    try:
        _write_whole(
            path,
            lambda temporary: torch._inductor.aoti_compile_and_package(
                program, package_path=str(temporary), inductor_configs=dict(PACKAGE_OPTIONS)
            ),
        )
    except Exception as error:
        why = _first_line(error)
        log.warning("%s: AOTInductor cannot compile program %s (%s); torch.compile runs it in each process", OWNER, path.name[:16], why)
        try:
            _write_whole(path.with_name(path.name + FAILED_SUFFIX), lambda temporary: temporary.write_text(why + "\n"))
        except OSError:  # an unwritable cache: the next process tries AOTInductor again
            pass
        return None
    return _load_package(path, device)


def _prepare(device) -> None:
    """This process's settings for running on ``device``: inductor's cache, no TF32 on CUDA, threads on the CPU."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _CHOSEN_INDUCTOR_CACHE or str(cache_dir())
    if device[0] == CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif torch.get_num_threads() != threads():
        torch.set_num_threads(threads())


def _exported(serialized: bytes, device):
    import torch
    import torch.export.passes

    program = torch.export.load(io.BytesIO(serialized))
    if device[0] == CUDA:
        program = torch.export.passes.move_to_device_pass(program, torch.device("cuda", device[1]))
    return program


def _counts(package: _Package) -> tuple[int, int]:
    """How many tensors the package takes and gives, from its call spec (no program read)."""
    from torch.utils import _pytree as pytree

    inputs, outputs = (pytree.treespec_loads(spec) for spec in package.loader.get_call_spec())
    return inputs.num_leaves, outputs.num_leaves


def _compile(key: str, read, device) -> _Program:
    """Program ``key`` for ``device``: its package loaded, or compiled once for this machine and loaded, or
    where AOTInductor cannot compile it, ``torch.compile``'d for this process. ``read()`` gives the program
    serialized, read only when there is no package to load."""
    import torch

    _prepare(device)
    path = package_path(key, device)
    failed = path.with_name(path.name + FAILED_SUFFIX)
    package = _load_package(path, device) if not failed.exists() else None
    if package is None and not failed.exists():
        package = _compile_package(_exported(read(), device), path, device)
    if package is not None:
        return _Program(package, *_counts(package), device)
    program = _exported(read(), device)
    signature = program.graph_signature
    compiled = torch.compile(program.module(), backend="inductor", dynamic=False, fullgraph=True, options=COMPILE_OPTIONS)
    return _Program(compiled, len(signature.user_inputs), len(signature.user_outputs), device)


PROGRAMS = Programs(MAX_PROGRAMS)


def _program(key: str, blob, device, capturing: bool) -> _Program:
    program = PROGRAMS.find(key, device)
    if program is not None:
        return program
    if capturing:
        raise CaptureError(
            f"{RUN_FUNCTION}: program {key[:16]} is met for the first time inside a CUDA graph "
            "capture, where it can be neither read from the device nor compiled; run the function "
            "once before capturing it"
        )
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
