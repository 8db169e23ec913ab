"""TVM without PyTorch until something needs PyTorch.

TVM's FFI (``tvm_ffi``) imports PyTorch as the first thing it does whenever PyTorch is installed
(a workaround for a symbol clash its authors saw on Windows) and then looks for PyTorch's DLPack
extension. That made ``import tvm`` take 2.6-3.5 s instead of 0.9 s on 2 cores, in Collage's own
process and in every zygote, though most runs never touch PyTorch. While ``tvm_ffi``, ``tvm`` and
``tvm.relax`` initialise, :class:`DeferTorch` answers ``import torch`` with ImportError (each of
them carries on without it: the imports are optional), so TVM loads without PyTorch;
PyTorch imports normally afterwards, for whoever needs it (a PyTorch model, the Inductor plugin),
and tensors still pass between the two through the DLPack protocol.
"""

from __future__ import annotations

import importlib.abc
import sys

# Modules whose loading imports PyTorch though they run without it.
LOADING_WITHOUT_TORCH = ("tvm_ffi", "tvm", "tvm.relax")


class DeferTorch(importlib.abc.MetaPathFinder):
    """Refuses ``torch`` while TVM's FFI, TVM or TVM Relax initialises; steps aside once Relax has."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] != "torch":
            return None
        if any(_initialising(sys.modules.get(module)) for module in LOADING_WITHOUT_TORCH):
            raise ImportError("PyTorch is imported when needed, not while TVM loads (collage_core.model.torch_deferral)")
        if "tvm.relax" in sys.modules:
            remove()
        return None


def _initialising(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def install() -> None:
    """Defer PyTorch while TVM loads, unless TVM or PyTorch is loaded already."""
    if "tvm_ffi" in sys.modules or "torch" in sys.modules:
        return
    if not any(isinstance(finder, DeferTorch) for finder in sys.meta_path):
        sys.meta_path.insert(0, DeferTorch())


def remove() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, DeferTorch)]
