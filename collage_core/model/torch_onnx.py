"""A PyTorch module exported to ONNX by the TorchScript exporter: the file its engines' own sessions run.

An ONNX file's engines (ONNX Runtime, OpenVINO) each run it whole in their own session, a contender Collage
returns when it is the fastest (:mod:`collage_core.model.original_model`). A PyTorch module has no file, so it
had none: on a RoFormer its searched placement took 0.478 ms where OpenVINO's own session over its ONNX export
took 0.334. :func:`onnx_original` exports the module as the single-shape ONNX route would have it
(opset 17, a trace: branches on input values follow the example inputs; where that exporter fails and
``onnxscript`` is installed, from the program ``torch.export`` makes, at opset 18), its inputs named after ``forward``'s
parameters, its outputs the tensors it returns flattened as the import flattens them (``output0``, ...), each
dimension the example's. A run exports it only when it has such a contender to measure, or replays a placement
that runs one; the export is then the original file, so a placement running it records its digest, and a
replay on a module of other weights is refused as another model. Like every contender, what is returned is
verified against the module itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
import warnings
from typing import Any, Iterator, Optional, Sequence

import attrs

from collage_core.errors import CollageError, one_line
from collage_core.model.original_model import ONNX, OriginalModel
from collage_core.model.torch_outputs import Flattened, flatten

# The ONNX opset of the exports, as the ONNX route's advice names it; PyTorch's exporter from ``torch.export``
# programs starts at 18.
OPSET = 17
DYNAMO_OPSET = 18
log = logging.getLogger("collage")


@contextlib.contextmanager
def in_eval_mode(module, name: Optional[str] = None) -> Iterator[None]:
    """``module`` in eval mode (dropout off, batch norm on its running statistics) for the block, then in its own
    mode: Collage optimizes inference, so a module in training mode is exported and checked as ``module.eval()``
    computes, and given back in training mode; with ``name``, a module in training mode is warned about."""
    was_training = module.training
    if was_training and name is not None:
        log.warning(
            "model %s: the module is in training mode; Collage optimizes it as in eval mode (dropout off, batch norm on "
            "its running statistics), so the result computes what module.eval() does; call module.eval() first to say so",
            name,
        )
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


class TorchExportError(CollageError):
    """A module's ONNX export failed, or does not take and give what the module does."""


def export_flattened(
    flat: Flattened, example_inputs: Sequence[Any], input_names: Sequence[str], dynamic_axes: Optional[dict] = None
) -> bytes:
    """``flat`` (a :class:`Flattened` module, or a module PyTorch traced or scripted, whose tensors are returned in
    order already) exported by the TorchScript exporter at OPSET, inputs named ``input_names``, outputs ``output0``,
    ``output1``, ..., with ``dynamic_axes`` (``{input: {axis: name}}``); the exporter's own error when it fails."""
    # Deferred: PyTorch is optional and slow to import: loaded only for a PyTorch module.
    import torch

    with torch.no_grad():
        outputs = [f"output{index}" for index in range(len(flatten(flat(*example_inputs))))]
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings(), _native_output_dropped(), _without_fused_attention(torch):
        # The exporter's notices about its own future, not about the module; and the tracer's that a trace follows
        # the example inputs, which is what a static export is (the docstrings say so).
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            flat,
            tuple(example_inputs),
            buffer,
            input_names=list(input_names),
            output_names=outputs,
            opset_version=OPSET,
            dynamic_axes=dynamic_axes or None,
            dynamo=False,
        )
    return buffer.getvalue()


@contextlib.contextmanager
def _without_fused_attention(torch) -> Iterator[None]:
    """PyTorch's fused ("fast path") attention off for the block: in eval mode without gradients, ``nn.TransformerEncoder``
    and ``nn.MultiheadAttention`` call fused kernels the exporter has no ONNX for; their plain path computes the same."""
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(was)


@contextlib.contextmanager
def _native_output_dropped() -> Iterator[None]:
    """What native code writes to this process's standard output and error, dropped for the block: the exporter
    prints its whole graph when it fails (PyTorch 2.13), hundreds of lines above the one line that says why."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "wb") as sink:
            for fd in saved:
                os.dup2(sink.fileno(), fd)
            yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _exported_from_program(module, example_inputs: Sequence[Any], input_names: Sequence[str]) -> Optional[bytes]:
    """``module`` exported by PyTorch's other exporter, from the program ``torch.export`` makes (as Collage imports the
    module), at opset DYNAMO_OPSET; None where it is not installed (it needs ``onnxscript``) or fails. It takes what the
    TorchScript exporter has no ONNX for (transformers' GPT-2 masks call ``aten::diff``), in seconds more."""
    # Deferred: PyTorch is optional and slow to import: loaded only for a PyTorch module.
    import torch

    if importlib.util.find_spec("onnxscript") is None:
        return None
    flat = Flattened(module, input_names).eval()  # a wrapper starts in training mode, which this exporter passes on
    with torch.no_grad():
        outputs = [f"output{index}" for index in range(len(flatten(flat(*example_inputs))))]
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [logger.level for logger in quiet]
    try:
        for logger in quiet:  # its notices (torchvision's operators skipped, each step taken): nothing about the module
            logger.setLevel(logging.ERROR)
        with torch.no_grad(), warnings.catch_warnings(), _native_output_dropped(), _without_fused_attention(torch):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                flat,
                tuple(example_inputs),
                input_names=list(input_names),
                output_names=outputs,
                opset_version=DYNAMO_OPSET,
                dynamo=True,
                verbose=False,
            )
        return program.model_proto.SerializeToString()
    except Exception:  # noqa: BLE001 - the TorchScript exporter's failure is the one reported
        return None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)


def onnx_original(module: Any, example_inputs: Sequence[Any], input_names: Sequence[str], outputs: int) -> OriginalModel:
    """``module`` exported as the module's docstring says, as the original file of a run: it must take the
    ``input_names`` in order and give ``outputs`` tensors, as the imported module does; else one line saying what."""
    # Deferred: ONNX and PyTorch are optional: loaded only for an ONNX model or a PyTorch module's export.
    import onnx
    import torch

    name = type(module).__name__
    # A traced or scripted module returns its tensors flat already, and cannot be traced again inside another module.
    flat = module if isinstance(module, torch.jit.ScriptModule) else Flattened(module)
    with in_eval_mode(module):
        try:
            data = export_flattened(flat, example_inputs, input_names)
        except Exception as error:  # noqa: BLE001 - one line naming the module
            data = None if isinstance(flat, torch.jit.ScriptModule) else _exported_from_program(module, example_inputs, input_names)
            if data is None:
                raise TorchExportError(f"PyTorch module {name}: its ONNX export failed: {one_line(error)}") from None
    graph = onnx.load_from_string(data).graph
    initializers = {init.name for init in graph.initializer}
    taken = [value.name for value in graph.input if value.name not in initializers]
    if taken != list(input_names):
        raise TorchExportError(
            f"PyTorch module {name}: its ONNX export takes {', '.join(taken) or 'no inputs'}, not {', '.join(input_names)} "
            "(the exporter drops an input forward does not use)"
        )
    if len(graph.output) != outputs:
        raise TorchExportError(f"PyTorch module {name}: its ONNX export gives {len(graph.output)} outputs, the module {outputs}")
    return OriginalModel.from_bytes(ONNX, data)


def with_onnx_original(model, wanted: bool, say) -> Any:
    """``model`` (an :class:`~collage_core.model.model_import.ImportedModel`) with its ONNX export as its original
    file, when ``wanted`` and it is a PyTorch module (:attr:`onnx_export`) without one; else as it is. A failed
    export leaves it as it is, and ``say`` tells why no engine's own session is a contender."""
    if not wanted or model.original is not None or model.onnx_export is None:
        return model
    try:
        original = model.onnx_export()
    except TorchExportError as error:
        say(f"no engine's own session over the module is a contender: {error}")
        return model
    say(
        f"{model.name}: exported to ONNX for the engines' own sessions ({len(original.data) / 1e6:.1f} MB, SHA-256 {original.digest[:12]}...)"
    )
    return attrs.evolve(model, original=original)
