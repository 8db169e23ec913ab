"""The packed function a lowered partition calls: run its PyTorch program compiled by TorchInductor.

A lowered partition is ``R.call_dps_packed("collage_inductor.run", [program, *inputs], ...)`` where
``program`` is a uint8 constant (``collage_core.relax_onnx.lowering.pack_blob``): a digest, an
options byte (none are defined yet), then the partition as a ``torch.export`` program
(``torch.export.save``). The program is loaded and compiled by ``torch.compile`` (inductor, static
shapes, one graph) once per process; inductor's own caches under ``$COLLAGE_CACHE_DIR/inductor``
keep the generated kernels across processes, so a second process compiles in seconds.

The VM's input tensors reach PyTorch through DLPack (no copies); the results PyTorch allocates
are copied into the VM's output tensors (torch.compile has no destination-passing form).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import tvm

from collage_core.relax_onnx import runtime_caches
from collage_core.threads import backend_threads

RUN_FUNCTION = "collage_inductor.run"
# Compiled programs kept alive: far more than the Inductor partitions of one model.
MAX_PROGRAMS = 256
# DLPack views kept per program and thread, by the addresses they view.
VIEWS_PER_THREAD = 16
CPU = tvm.cpu(0).dlpack_device_type()


def cache_dir() -> Path:
    """Where inductor keeps its generated kernels and compiled graphs across processes."""
    root = os.environ.get("COLLAGE_CACHE_DIR") or Path.home() / ".cache" / "collage"
    return Path(root) / "inductor"


def threads() -> int:
    """PyTorch's intra-op threads for Inductor's kernels (``collage_core.threads.backend_threads``)."""
    return backend_threads()


class _Program:
    """A compiled program, how many inputs it takes, and per thread the torch views of a set of
    tensor addresses (valid only while the tensors at those addresses are the ones passed)."""

    def __init__(self, compiled, inputs: int, outputs: int):
        self.compiled, self.inputs, self.outputs = compiled, inputs, outputs
        self._views = runtime_caches.BindingsByAddress(VIEWS_PER_THREAD, self._view)

    @staticmethod
    def _view(tensors, _dropped):
        import torch

        views = []
        for index, tensor in enumerate(tensors):
            if not tensor.is_contiguous() or tensor.device.dlpack_device_type() != CPU:
                raise ValueError(f"{RUN_FUNCTION}: tensor {index} is not a contiguous CPU tensor")
            views.append(torch.from_dlpack(tensor))
        return views

    def run(self, tensors) -> None:
        import torch

        if len(tensors) != self.inputs + self.outputs:
            raise ValueError(
                f"{RUN_FUNCTION}: the program takes {self.inputs} inputs and gives {self.outputs} outputs, "
                f"but {len(tensors)} tensors were passed"
            )
        views = self._views.get(tensors)
        with torch.inference_mode():
            results = self.compiled(*views[: self.inputs])
            for target, result in zip(views[self.inputs:], results):
                target.copy_(result)


def _compile(serialized: bytes, options: int) -> _Program:
    import torch

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))
    if torch.get_num_threads() != threads():
        torch.set_num_threads(threads())
    program = torch.export.load(io.BytesIO(serialized))
    signature = program.graph_signature
    compiled = torch.compile(program.module(), backend="inductor", dynamic=False, fullgraph=True)
    return _Program(compiled, len(signature.user_inputs), len(signature.user_outputs))


PROGRAMS = runtime_caches.CompiledModels(MAX_PROGRAMS, _compile, "collage_inductor")


def run(blob, *tensors) -> None:
    """DPS entry point: ``tensors`` are the partition's inputs, then the outputs to fill."""
    PROGRAMS.get(np.from_dlpack(blob)).run(tensors)


def register() -> None:
    """Make :func:`run` the global ``collage_inductor.run`` (again, if already registered)."""
    tvm.register_global_func(RUN_FUNCTION, run, override=True)
