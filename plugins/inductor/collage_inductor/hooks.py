"""TorchInductor (torch.compile) as a Collage backend, graph level, on the CPU.

Each partition is converted to a PyTorch program (``relax_to_torch``), traced by ``torch.export``
and replaced by a call to the packed function ``collage_inductor.run`` that carries the exported
program as a constant, so the built executable is self-contained: running it needs only
``import collage_inductor``, and the program is compiled by inductor when it first runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
from typing import Optional

from collage_core.build import replace_functions
from collage_core.hookspecs import hookimpl
from collage_core.records import GRAPH_LEVEL, Availability, Backend
from collage_core.relax_onnx import lowering, patterns
from collage_inductor import runtime

BACKEND = "inductor"
INSTALL_HINT = "pip install torch==2.13.0"
# How partitions are lowered and run. Part of the backend's version, so costs measured with other
# code are never reused.
LOWERING_REVISION = 2


def _import_torch():
    """The torch module, or the error importing it raised (the backend is then unavailable)."""
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        return error


def _torch_version() -> str:
    """The installed torch's version, read without importing it (an import costs 1.5 s in every
    process that loads the plugins, inductor chosen or not)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpp_compiler() -> Optional[str]:
    """The C++ compiler inductor would use (``$CXX``, else ``g++``), or None when none is on the PATH."""
    return shutil.which(os.environ.get("CXX") or "g++")


def _torch_only_refusal(call) -> Optional[str]:
    from collage_inductor import relax_to_torch

    check = relax_to_torch.TORCH_REFUSALS.get(call.op.name)
    return check(call) if check is not None else None


@hookimpl
def collage_register_backends(register):
    register(
        Backend(
            name=BACKEND,
            kind=GRAPH_LEVEL,
            device_kinds=("cpu",),
            version=f"torch-{_torch_version()}+lowering-{LOWERING_REVISION}",
            description="TorchInductor: torch.compile of partitions converted to PyTorch programs (CPU)",
            runtime_needs=f"the collage-inductor plugin (pip install -e plugins/inductor), torch ({INSTALL_HINT}) "
                          "and a C++ compiler",
            lowering_uses_device=False,  # converts and traces only; inductor compiles when the partition first runs
            chosen_by_default=False,  # inductor compiles each region for seconds: only when named
        )
    )


@hookimpl
def collage_check_availability(backend):
    if backend.name != BACKEND:
        return None
    if importlib.util.find_spec("torch") is None:
        return Availability.no(f"torch is not installed: {INSTALL_HINT}")
    if _cpp_compiler() is None:
        return Availability.no(f"TorchInductor needs a C++ compiler and {os.environ.get('CXX') or 'g++'} is not on "
                               "the PATH: apt-get install g++")
    return Availability.yes()


@hookimpl
def collage_contribute_patterns(backend, target):
    if backend.name != BACKEND:
        return None
    if target.kind.name not in ("llvm", "c"):
        return []
    return patterns.operator_patterns(BACKEND, _torch_only_refusal)


def lower_function(func, name: str):
    """``func`` with its body replaced by one ``collage_inductor.run`` call on its exported program."""
    import torch

    from collage_inductor import relax_to_torch

    buffer = io.BytesIO()
    torch.export.save(relax_to_torch.exported(func), buffer)
    return lowering.packed_call_function(func, name, runtime.RUN_FUNCTION, lowering.pack_blob(buffer.getvalue()))


@hookimpl
def collage_lower_partitions(backend, mod, function_names, target):
    if backend.name != BACKEND:
        return None
    return replace_functions(mod, function_names, lower_function)


@hookimpl
def collage_prepare_runtime(backend):
    if backend.name != BACKEND:
        return None
    torch = _import_torch()
    if isinstance(torch, ImportError):
        raise RuntimeError(f"torch cannot be imported ({torch}): {INSTALL_HINT}")
    runtime.register()
    return True
