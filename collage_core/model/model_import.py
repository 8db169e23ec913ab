"""Turning ONNX files, PyTorch modules and Relax IRModules into one canonical Relax module."""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import attrs
import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError, one_line
from collage_core.model import import_cache, rewrites
from collage_core.model.original_model import ONNX, OriginalModel
from collage_core.model.precision import FP32, tolerance_for_outputs
from collage_core.model.torch_onnx import in_eval_mode, onnx_original
from collage_core.model.torch_outputs import Flattened, NotATensor, flatten, forward_input_names
from collage_core.model.verify import compare_outputs

log = logging.getLogger("collage")

Reference = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


class ModelImportError(CollageError):
    """The model cannot be read, or uses something Collage cannot handle."""


class UncheckableModel(ModelImportError):
    """Collage cannot compare the imported model's outputs with its reference's: the reference fails on
    inputs of the model's shapes or gives different outputs for the same inputs, an output is not a
    tensor, or the two disagree in how many outputs there are or in their shapes or dtypes."""


class ImportNumericsError(ModelImportError):
    """TVM's plain build of the imported model computes other numbers than its reference."""


@attrs.frozen
class TensorSpec:
    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@attrs.frozen
class ImportedModel:
    """A model as Relax (``mod["main"]`` holds one dataflow block), with what checks its numerics.

    ``reference`` computes the outputs the original framework gives (ONNX Runtime for ONNX,
    PyTorch for torch modules), or is None for a Relax module given directly.
    """

    name: str
    source: str
    mod: Any = attrs.field(eq=False, repr=False)
    inputs: tuple[TensorSpec, ...]
    fingerprint: str
    reference: Optional[Reference] = attrs.field(default=None, eq=False, repr=False)
    reference_name: str = "none"
    # What ``mod`` computes in (see collage_core.model.precision); the reference stays the framework's float32.
    precision: str = "fp32"
    # The units of the converted model given back float32 arithmetic (see collage_core.model.widening).
    float32_units: tuple[int, ...] = ()
    # The layout of its convolutions (see collage_core.model.layout): "model" as written, or "nhwc".
    layout: str = "model"
    # Where each output comes from, in order (a PyTorch module's: ``output['logits']``); empty when unnamed.
    output_names: tuple[str, ...] = ()
    # The model file as given (an ONNX file's or ModelProto's bytes), which engines' own sessions run whole
    # (see collage_core.model.original_model); None for a PyTorch or Relax module.
    original: Optional[OriginalModel] = attrs.field(default=None, eq=False, repr=False)
    # A PyTorch module's: its ONNX export, made when called, to stand for the original file (see
    # collage_core.model.torch_onnx); None for a model that has a file or cannot be exported.
    onnx_export: Optional[Callable[[], OriginalModel]] = attrs.field(default=None, eq=False, repr=False)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Inputs for checks: uniform floats, and small non-negative integers (valid token ids)."""
        rng = np.random.default_rng(seed)
        arrays = []
        for spec in self.inputs:
            if spec.dtype.startswith(("int", "uint")):
                arrays.append(rng.integers(0, 2, size=spec.shape).astype(spec.dtype))
            elif spec.dtype == "bool":
                arrays.append(np.ones(spec.shape, dtype=bool))
            else:
                arrays.append(rng.uniform(-1.0, 1.0, size=spec.shape).astype(spec.dtype))
        return arrays


def load_model(model: Any, example_inputs: Optional[Sequence[Any]] = None, name: Optional[str] = None) -> ImportedModel:
    """Import an ONNX path, an ``onnx.ModelProto``, a ``torch.nn.Module`` (with example inputs) or a Relax
    IRModule; a model already imported is returned as it is.

    A PyTorch module's outputs are the tensors it returns, flattened in the order ``torch.export``
    gives them (see :mod:`collage_core.model.torch_outputs`): tuple and list items by index, dict entries
    in insertion order, dataclass and ``ModelOutput`` fields in declaration order, nested containers
    depth first, None left out. An output that is not a tensor is refused (:class:`UncheckableModel`).
    """
    if isinstance(model, ImportedModel):
        return model
    imported = _imported(model, example_inputs, name)
    shown = printable(imported.name)
    return imported if shown == imported.name else attrs.evolve(imported, name=shown)


def printable(name: str) -> str:
    """``name`` (from a model file, a graph or a class) as reports and the terminal show it: control characters
    (newlines, escape sequences) written as escapes, so a name cannot forge report lines or colour a terminal."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in name)


def _imported(model: Any, example_inputs: Optional[Sequence[Any]], name: Optional[str]) -> ImportedModel:
    if isinstance(model, (str, os.PathLike)):
        return _from_onnx_file(Path(model), name)
    if isinstance(model, tvm.IRModule):
        return _from_relax(model, name or "relax_module")
    if type(model).__module__.startswith("onnx"):
        return _from_onnx_proto(model, name or (model.graph.name or "onnx_model"), model.SerializeToString())
    if is_torch_module(model):
        if example_inputs is None:
            raise ModelImportError("a PyTorch module needs example_inputs (a tuple of tensors) to be exported")
        return _from_torch(model, tuple(example_inputs), name or type(model).__name__)
    raise ModelImportError(f"cannot import a {type(model).__name__}: pass an ONNX file, a torch.nn.Module or a Relax IRModule")


# Collage makes an array of each input's shape to check and time a model: a larger input is refused before any is made.
MAX_INPUT_BYTES = 4 * 2**30


def _checked_size(spec: TensorSpec, origin: str) -> TensorSpec:
    """``spec``, an input of a size Collage can make: no negative dimension, at most :data:`MAX_INPUT_BYTES`."""
    shown = f"{spec.dtype}{list(spec.shape)}"
    if any(dim < 0 for dim in spec.shape):
        raise ModelImportError(f"{origin}: input {spec.name!r} is {shown}, with a negative dimension")
    elements = math.prod(spec.shape)
    size = elements * np.dtype(spec.dtype).itemsize
    if size > MAX_INPUT_BYTES:
        raise ModelImportError(
            f"{origin}: input {spec.name!r} is {shown}, {elements:.3g} elements ({size / 2**30:.3g} GiB); "
            f"Collage makes inputs of at most {MAX_INPUT_BYTES / 2**30:g} GiB to check and time a model"
        )
    return spec


def is_torch_module(model) -> bool:
    """Whether ``model`` is a ``torch.nn.Module`` (read from its classes: PyTorch is not imported)."""
    return any(cls.__module__ == "torch.nn.modules.module" and cls.__name__ == "Module" for cls in type(model).__mro__)


def _from_onnx_file(path: Path, name: Optional[str]) -> ImportedModel:
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx

    if not path.exists():
        raise ModelImportError(f"{path}: no such file")
    if not path.is_file():  # a folder, or a device such as /dev/zero that reads without end
        raise ModelImportError(f"{path}: {'a folder' if path.is_dir() else 'not a regular file'}, not an ONNX file")
    data = path.read_bytes()
    try:
        proto = onnx.load_from_string(data)
        onnx.checker.check_model(data if len(data) < 2**31 else path)  # the bytes in hand: no second serialization
    except Exception as error:
        raise ModelImportError(f"{path}: not a valid ONNX model ({one_line(error)})") from None
    return _from_onnx_proto(proto, name or path.stem, data, origin=str(path))


# Operators that compute shapes at run time; a model with any is folded before TVM imports it.
SHAPE_ARITHMETIC = ("Shape", "Size")
TRY_INSTEAD = (
    "try exporting with static shapes (or another opset), or pass the PyTorch module with example "
    "inputs to collage_core.optimize, which imports it through torch.export"
)


def fold_static_shapes(data: bytes, origin: str):
    """The model after ONNX Runtime's basic graph optimizations, written back out: shape computations
    that static input shapes make constant are folded (Shape -> Gather -> Concat -> Reshape becomes a
    Reshape to a constant shape), and nothing is fused into operators ONNX lacks."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="collage-fold-") as scratch:
        options.optimized_model_filepath = str(Path(scratch) / "folded.onnx")
        try:
            onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            return onnx.load(options.optimized_model_filepath)
        except Exception as error:
            raise ModelImportError(f"{origin}: folding its shape computations failed ({one_line(error)})") from None


def _from_onnx_proto(proto, name: str, data: bytes, origin: str = "ONNX model", advise: bool = True) -> ImportedModel:
    """``advise``: end an import failure with what to try (off where the caller says it)."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx
    import onnxruntime

    initializers = {init.name for init in proto.graph.initializer}
    inputs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not dim.HasField("dim_value") for dim in dims):
            shown = [dim.dim_param or "?" if not dim.HasField("dim_value") else dim.dim_value for dim in dims]
            raise ModelImportError(
                f"{origin}: input {value.name!r} has a dynamic shape {shown}; list the shapes to optimize for "
                f"(--shapes, e.g. {_shapes_example(shown)}) or export it with static shapes"
            )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        if any(dim.dim_value == 0 for dim in dims):  # TVM's importer would take it for a dynamic dimension
            raise ModelImportError(
                f"{origin}: input {value.name!r} is {dtype}{[dim.dim_value for dim in dims]}, zero-sized: "
                "it holds no data to place a model on; export it with every dimension at least 1"
            )
        inputs.append(_checked_size(TensorSpec(value.name, [dim.dim_value for dim in dims], dtype), origin))
    outputs = tuple(value.name for value in proto.graph.output)  # the graph's own names, which the export keeps
    fingerprint = hashlib.sha256(data).hexdigest()
    original = OriginalModel(ONNX, data, fingerprint)
    reference = onnx_reference(data, inputs)
    reference_name = f"onnxruntime {onnxruntime.__version__}"
    cache_name = import_cache.key(fingerprint)
    cached = import_cache.load(cache_name)
    if cached is not None:
        return ImportedModel(
            name, "onnx", cached.mod, tuple(inputs), cached.fingerprint, reference, reference_name, output_names=outputs, original=original
        )
    fold_failure = ""
    if any(node.op_type in SHAPE_ARITHMETIC for node in proto.graph.node):
        try:  # what TVM imports; the original stays the numerics reference
            proto = fold_static_shapes(data, origin)
            fingerprint = hashlib.sha256(f"{fingerprint}|folded by onnxruntime {onnxruntime.__version__}".encode()).hexdigest()
        except ModelImportError as failed:  # TVM may still take the model as exported
            fold_failure = f" (folding its shape computations failed first: {str(failed).split(': ', 1)[-1]})"
    supported = tvm_compat.onnx_convert_map()
    unsupported = sorted({node.op_type for node in proto.graph.node} - set(supported))
    if unsupported:
        raise ModelImportError(f"{origin}: unsupported ONNX operator(s): {', '.join(unsupported)}")
    advice = f"; {TRY_INSTEAD}" if advise else ""
    try:
        mod = tvm_compat.from_onnx(proto)
    except tvm_compat.OnnxNodeFailure as failure:
        raise ModelImportError(
            f"{origin}: TVM's ONNX importer cannot convert {failure.op_type} node {failure.node!r} "
            f"({one_line(failure.cause)}){fold_failure}{advice}"
        ) from None
    except Exception as error:
        raise ModelImportError(f"{origin}: TVM's ONNX importer failed: {one_line(error)}{fold_failure}{advice}") from None
    canonical = canonicalize(mod, origin)
    import_cache.store(cache_name, canonical, fingerprint, len(data))
    return ImportedModel(
        name, "onnx", canonical, tuple(inputs), fingerprint, reference, reference_name, output_names=outputs, original=original
    )


def _shapes_example(dims) -> str:
    named = [dim for dim in dims if isinstance(dim, str) and dim != "?"]
    return repr(" ".join(f"{dim}=1,8" for dim in dict.fromkeys(named))) if named else "'INPUT=1x128,8x128'"


def onnx_reference(data: bytes, inputs: Sequence) -> Reference:
    """ONNX Runtime's outputs for the model's bytes, fed in the order of ``inputs`` (anything with a ``name``); its
    session is made on the first run (a run that reuses its verification needs none)."""
    # Deferred: ONNX Runtime is optional and slow to import: loaded only where it runs.
    import onnxruntime

    sessions = []

    def reference(arrays):
        if not sessions:
            quiet = onnxruntime.SessionOptions()
            quiet.log_severity_level = 3  # ONNX Runtime warns about unused initializers, which exporters leave
            sessions.append(onnxruntime.InferenceSession(data, quiet, providers=["CPUExecutionProvider"]))
        feeds = {spec.name: array for spec, array in zip(inputs, arrays)}
        return sessions[0].run(None, feeds)

    return reference


def as_tensor(array: np.ndarray, torch):
    """``array`` as a PyTorch tensor; a bfloat16 one (ml_dtypes', which numpy has none of) through its bits."""
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def as_array(tensor, torch) -> np.ndarray:
    """A PyTorch tensor as a numpy array; a bfloat16 one as ml_dtypes' bfloat16, through its bits."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        # Deferred: ml_dtypes is optional: only for bfloat16 tensors.
        import ml_dtypes

        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


TENSORS_ONLY = (
    "a module's outputs must be tensors, or tuples, lists, dicts, dataclasses or transformers ModelOutputs of them (None is left out)"
)


def _from_torch(module, example_inputs: tuple, name: str) -> ImportedModel:
    # Deferred: PyTorch is optional and slow to import: loaded only for a PyTorch model.
    import torch

    with in_eval_mode(module, name):
        return _from_torch_in_eval(module, example_inputs, name, torch)


def _from_torch_in_eval(module, example_inputs: tuple, name: str, torch) -> ImportedModel:
    names = forward_input_names(module, len(example_inputs))
    flattened = Flattened(module, names)
    try:
        with torch.no_grad():
            program = torch.export.export(flattened, example_inputs)
            mod = tvm_compat.from_exported_program(program)
    except NotATensor as output:
        raise UncheckableModel(f"PyTorch module {name}: Collage cannot check its outputs: {output}; {TENSORS_ONLY}") from None
    except tvm_compat.TorchNodeFailure as failure:
        verdict = _onnx_route_verdict(module, example_inputs, name)
        where = f" (made by {failure.source})" if failure.source else ""
        raise ModelImportError(
            f"PyTorch module {name}: TVM's importer cannot convert {failure.target} node {failure.node!r}{where}: "
            f"{one_line(failure.cause)}; {verdict}"
        ) from None
    except Exception as error:
        verdict = _onnx_route_verdict(module, example_inputs, name)
        raise ModelImportError(f"PyTorch module {name}: export or import failed: {one_line(error)}; {verdict}") from None

    def reference(arrays):
        with in_eval_mode(module), torch.no_grad():
            returned = module(*[as_tensor(a, torch) for a in arrays])
        return [as_array(tensor, torch) for _, tensor in flatten(returned)]

    canonical = canonicalize(mod, f"PyTorch module {name}")
    params = canonical["main"].params
    if len(params) == len(example_inputs):  # as the library names them (the importer makes names of other letters identifiers)
        names = [param.name for param in params]
    inputs = tuple(
        TensorSpec(input_name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for input_name, t in zip(names, example_inputs)
    )

    def onnx_export() -> OriginalModel:
        return onnx_original(module, example_inputs, [spec.name for spec in inputs], len(flattened.last.names))

    return ImportedModel(
        name=name,
        source="torch",
        mod=canonical,
        inputs=inputs,
        fingerprint=tvm_compat.structural_key(canonical["main"]),
        reference=reference,
        reference_name=f"pytorch {torch.__version__}",
        output_names=flattened.last.names,
        onnx_export=onnx_export,
    )


def _onnx_route_verdict(module, example_inputs: tuple, name: str) -> str:
    """Whether the other frontend takes ``module``: exported by the TorchScript ONNX exporter, imported, and its outputs
    checked as ``optimize`` checks a model's before measuring (a dynamic output shape, ``x[x > 0]``, imports but
    cannot be checked)."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx
    import torch

    buffer = io.BytesIO()
    try:
        with torch.no_grad():
            torch.onnx.export(module, example_inputs, buffer, opset_version=17, dynamo=False)
        exported = _from_onnx_proto(
            onnx.load_from_string(buffer.getvalue()), name, buffer.getvalue(), origin="its ONNX export", advise=False
        )
        check_against_reference(exported)
    except Exception as error:
        return f"the ONNX route fails too ({one_line(error)})"
    return (
        "the ONNX route takes it: export it with torch.onnx.export(module, inputs, path, opset_version=17, "
        "dynamo=False) and optimize the file (a trace: branches on input values follow the example inputs)"
    )


def _from_relax(mod, name: str) -> ImportedModel:
    canonical = canonicalize(mod, f"Relax module {name}")
    inputs = []
    for param in canonical["main"].params:
        try:
            shape, dtype = tvm_compat.tensor_shape_dtype(param)
        except ValueError as error:
            raise ModelImportError(f"Relax module {name}: parameter {param.name}: {error}") from None
        inputs.append(_checked_size(TensorSpec(param.name, shape, dtype), f"Relax module {name}"))
    return ImportedModel(name, "relax", canonical, tuple(inputs), tvm_compat.structural_key(canonical["main"]))


def canonicalize(mod, origin: str):
    """Inference form: batch norm decomposed, constants folded, one dataflow block in ``main``."""
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ModelImportError(f"{origin}: the module has no 'main' function")
    # What the importer writes as opaque kernels (pads) or as a pathological window (a pooling over the
    # whole input) becomes the operator it computes, which backends and their converters can take; a scale of a
    # product's operands moves after the product, where libraries fuse it.
    mod = rewrites.for_backends(mod)
    passes = tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.ConvertToDataflow(),
            relax.transform.FoldConstant(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination(["main"]),
        ]
    )
    mod = passes(mod)
    body = mod["main"].body
    blocks = [block for block in body.blocks if block.bindings]
    if not blocks:  # an Identity, a constant output, a Shape of a static input: all folded away on import
        raise ModelImportError(
            f"{origin}: the model computes nothing once imported (its outputs are its inputs or constants): nothing to place"
        )
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise ModelImportError(f"{origin}: main must be a single dataflow block after import (found {len(blocks)} blocks)")
    for param in mod["main"].params:
        try:
            tvm_compat.tensor_shape_dtype(param)
        except ValueError as error:
            raise ModelImportError(f"{origin}: input {param.name}: {error}; only static shapes are supported") from None
    return mod


# TVM's plain build (tvm.compile's CPU pipeline, nothing scheduled) ran ResNet-50's 4.1 G multiply-adds in 3.6 s
# and BERT-base's 11 G (128 tokens) in 50 s on 2 cores: up to this many, checking its numerics first takes seconds.
CHECK_BUILD_MULTIPLY_ADDS = 10**9


def check_against_reference(imported: ImportedModel) -> str:
    """Compare the imported model with its reference on the inputs the verification at the end uses,
    before anything is measured; says, in a line, what was checked.

    The reference's outputs are compared with ``main``'s declared outputs in count, shapes and dtypes,
    then with the outputs of TVM's plain build of ``main`` within float32's tolerance (a 16-bit model's own precision's), for a model of
    at most :data:`CHECK_BUILD_MULTIPLY_ADDS` multiply-adds (a larger one's numbers are checked at the
    end only). Raises :class:`UncheckableModel` or :class:`ImportNumericsError`, naming the model and
    the output.
    """
    label = _label(imported)
    if imported.reference is None:
        return f"{label}: no reference to check against"
    inputs = imported.random_inputs()
    try:
        expected = [np.asarray(array) for array in imported.reference(inputs)]
    except Exception as error:
        raise UncheckableModel(
            f"{label}: its reference ({imported.reference_name}) fails on inputs of the model's shapes: {one_line(error)}"
        ) from None
    declared = tvm_compat.return_type(imported.mod["main"])
    declared = list(declared.fields) if isinstance(declared, relax.TupleType) else [declared]
    if len(declared) != len(expected):
        raise UncheckableModel(f"{label}: {imported.reference_name} gives {len(expected)} outputs, the imported model {len(declared)}")
    for index, (ty, array) in enumerate(zip(declared, expected)):
        try:
            shape, dtype = tvm_compat.type_shape_dtype(ty)
        except ValueError as error:
            raise UncheckableModel(f"{label}: {_output(imported, index)} of the imported model is {error}") from None
        if (shape, dtype) != (array.shape, array.dtype.name):
            raise UncheckableModel(
                f"{label}: {_output(imported, index)} is {dtype}{list(shape)} in the imported model, "
                f"{array.dtype.name}{list(array.shape)} from {imported.reference_name}"
            )
    outputs_agree = "its output agrees" if len(expected) == 1 else f"its {len(expected)} outputs agree"
    agree = f"{label}: {outputs_agree} with {imported.reference_name}'s in shape and dtype"
    work = _multiply_adds(imported.mod["main"])
    if work > CHECK_BUILD_MULTIPLY_ADDS:
        return (
            f"{agree}; numerics are verified at the end only ({work / 1e9:.1f} G multiply-adds, too many to run "
            f"TVM's unscheduled build first)"
        )
    try:
        outputs = _run_plain_build(imported.mod, inputs)
    except Exception as error:
        return f"{agree}; numerics are verified at the end only (TVM's plain build failed: {one_line(error)})"
    held_to = tolerance_for_outputs(FP32, expected)
    verification = compare_outputs(outputs, expected, imported.reference_name, held_to.rtol, held_to.atol)
    if verification.passed:
        return f"{agree}; TVM's plain build: {verification.describe()}"
    again = compare_outputs(imported.reference(inputs), expected, imported.reference_name, held_to.rtol, held_to.atol)
    if not again.passed:
        raise UncheckableModel(
            f"{label}: {imported.reference_name} gives other outputs each time on the same inputs "
            f"(max error relative to output scale {again.max_rel_error:.3g} between two runs)"
        )
    off = next(
        index
        for index, (out, ref) in enumerate(zip(outputs, expected))
        if not compare_outputs([out], [ref], "", held_to.rtol, held_to.atol).passed
    )
    raise ImportNumericsError(
        f"{label}: TVM's plain build of the imported model disagrees with {imported.reference_name} at "
        f"{_output(imported, off)} (max abs error {verification.max_abs_error:.3g}, max error relative to output "
        f"scale {verification.max_rel_error:.3g}; tolerance atol {held_to.atol:g} + rtol {held_to.rtol:g} x "
        f"max|reference|): every placement of it would fail the verification"
    )


def _label(imported: ImportedModel) -> str:
    kind = {"torch": "PyTorch module", "onnx": "ONNX model", "relax": "Relax module"}.get(imported.source, "model")
    return f"{kind} {imported.name}"


def _output(imported: ImportedModel, index: int) -> str:
    named = f" ({imported.output_names[index]})" if index < len(imported.output_names) else ""
    return f"output {index}{named}"


def _multiply_adds(func) -> int:
    """The multiply-adds of ``func``'s products and convolutions: what a build left unscheduled spends its time on."""
    total = 0
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not tvm_compat.is_op_call(call):
                continue
            op = tvm_compat.op_name(call)
            if op != "relax.matmul" and not op.startswith("relax.nn.conv"):
                continue
            try:
                out_shape, _ = tvm_compat.tensor_shape_dtype(binding.var)
                operand_shape, _ = tvm_compat.tensor_shape_dtype(call.args[0 if op == "relax.matmul" else 1])
            except ValueError:
                continue
            if op == "relax.matmul":
                summed = operand_shape[-1]
            else:  # over the weight but its output channels (a transposed convolution's overcounted by the stride)
                summed = math.prod(operand_shape) // operand_shape[str(call.attrs.kernel_layout).index("O")]
            total += math.prod(out_shape) * summed
    return total


def _run_plain_build(mod, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    device = tvm.cpu(0)
    vm = tvm_compat.virtual_machine(relax.build(mod, tvm_compat.host_cpu_target()), device)
    result = vm["main"](*[tvm_compat.to_tensor(array, device) for array in inputs])
    return [tvm_compat.to_numpy(value) for value in ([result] if hasattr(result, "numpy") else result)]
