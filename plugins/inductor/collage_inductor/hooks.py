"""TorchInductor (torch.compile) as a Collage backend, graph level, on the CPU and on NVIDIA GPUs.

Each partition is converted to a PyTorch program (``relax_to_torch``), traced by ``torch.export``
and replaced by a call to the packed function ``collage_inductor.run`` that carries the exported
program as a constant, so the built executable is self-contained: running it needs only
``import collage_inductor``. When it first runs on a machine, the program is compiled by AOTInductor
(C++ on the CPU, Triton on CUDA) for the device it runs on into a package that later processes load
in milliseconds (``runtime`` says how, and how it runs on TVM's CUDA stream and inside Collage's CUDA
graphs). Chosen by default on CUDA only: compiling a new region takes seconds, small beside a GPU
run's other costs, too slow for the default CPU run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
from pathlib import Path
from typing import Optional

from tvm import relax

from collage_core.kit import (
    GRAPH_LEVEL,
    Backend,
    backend_hooks,
    cuda_libraries,
    engine_lowering,
    engine_operators,
    engine_patterns,
    packed_call_function,
)
from collage_inductor import runtime

BACKEND = "inductor"
INSTALL_HINT = "pip install torch==2.13.0"
CUDA_INSTALL_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cu130"
TRITON_INSTALL_HINT = "pip install triton"
# How partitions are lowered and run. Part of the backend's version, so costs measured with other
# code are never reused.
LOWERING_REVISION = 3


def _torch_version() -> str:
    """The installed torch's version, read without importing it (an import costs 1.5 s in every
    process that loads the plugins, inductor chosen or not)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from its files without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    return any((Path(spec.origin).parent / "lib").glob("libtorch_cuda*.so*"))


def _cuda_refusal() -> Optional[str]:
    """Why inductor cannot run on this machine's NVIDIA GPU, or None (also where there is no GPU)."""
    try:
        cuda_libraries.first_gpu()
    except cuda_libraries.CudaUnavailable:
        return None
    if not _torch_has_cuda():
        return f"this machine has an NVIDIA GPU but torch {_torch_version()} is built without CUDA: {CUDA_INSTALL_HINT}"
    if importlib.util.find_spec("triton") is None:
        return f"TorchInductor's CUDA kernels are Triton's and triton is not installed: {TRITON_INSTALL_HINT}"
    return None


def _cpp_compiler() -> Optional[str]:
    """The C++ compiler inductor would use (``$CXX``, else ``g++``), or None when none is on the PATH."""
    return shutil.which(os.environ.get("CXX") or "g++")


def _torch_only_refusal(call) -> Optional[str]:
    from collage_inductor import relax_to_torch

    check = relax_to_torch.TORCH_REFUSALS.get(call.op.name)
    return check(call) if check is not None else None


def _describe() -> Backend:
    return Backend(
        name=BACKEND,
        kind=GRAPH_LEVEL,
        device_kinds=("cpu", "cuda"),
        version=f"torch-{_torch_version()}+lowering-{LOWERING_REVISION}",
        description="TorchInductor: torch.compile of partitions converted to PyTorch programs "
        "(C++ kernels on the CPU, Triton kernels on CUDA; fp32, and bf16/fp16 on CUDA)",
        runtime_needs=f"the collage-inductor plugin (pip install -e plugins/inductor), torch ({INSTALL_HINT}; "
        f"on CUDA a CUDA build, {CUDA_INSTALL_HINT}, and triton) and a C++ compiler",
        lowering_uses_device=False,  # converts and traces only; AOTInductor compiles when the partition first runs
        # Inductor compiles each region for seconds: by default on CUDA, where that is small beside the
        # run's other costs; on the CPU only when named.
        chosen_by_default=("cuda",),
    )


def _missing() -> Optional[str]:
    """What this machine lacks to run inductor (torch, a C++ compiler, on a GPU torch's CUDA build and
    triton), asked without importing torch; None when it runs."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed: {INSTALL_HINT}"
    if _cpp_compiler() is None:
        return f"TorchInductor needs a C++ compiler and {os.environ.get('CXX') or 'g++'} is not on the PATH: apt-get install g++"
    return _cuda_refusal()


def sixteen_bit(target) -> frozenset:
    """The 16-bit types partitions may hold besides float32 on ``target``: bfloat16 and float16 on CUDA (tensor
    cores), none on the CPU."""
    return engine_operators.SIXTEEN_BIT if target.kind.name == "cuda" else frozenset()


def _patterns(target, precision) -> list:
    return engine_patterns.operator_patterns(BACKEND, _torch_only_refusal, sixteen_bit(target))


def lower_function(func, name: str, taken: frozenset = frozenset()):
    """``func`` with its body replaced by one ``collage_inductor.run`` call on its exported program (taking
    the 16-bit types ``taken``): ``run(key, program, *params)``, the key a string that stays on the host."""
    import torch

    from collage_inductor import relax_to_torch

    buffer = io.BytesIO()
    torch.export.save(relax_to_torch.exported(func, taken), buffer)
    blob = engine_lowering.pack_blob(buffer.getvalue())
    return packed_call_function(func, name, runtime.RUN_FUNCTION, runtime.key_of(blob), [relax.const(blob), *func.params])


def _lowering(mod, function_names, target):
    taken = sixteen_bit(target)
    return lambda func, name: lower_function(func, name, taken)


def _prepare_runtime() -> None:
    try:
        importlib.import_module("torch")
    except ImportError as error:
        raise RuntimeError(f"torch cannot be imported ({error}): {INSTALL_HINT}") from error
    runtime.register()


HOOKS = backend_hooks(
    BACKEND,
    describe=_describe,
    missing=_missing,
    target_kinds=("llvm", "c", "cuda"),
    patterns=_patterns,
    lowering=_lowering,
    prepare_runtime=_prepare_runtime,
)
globals().update(HOOKS.hookimpls())  # collage_register_backends, collage_check_availability, ...
