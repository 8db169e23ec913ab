"""Every TVM access that moves between TVM releases, kept in one place (pinned: apache-tvm 0.27)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import socket
import struct
import threading
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import tvm
import tvm_ffi
from tvm import rpc
from tvm.base import _LOADED_LIBS
from tvm.rpc import base as rpc_base
from tvm.runtime.vm import VirtualMachine
from tvm.support import cc
from tvm_ffi.libinfo import load_lib_ctypes

from collage_core.build.cuda_libraries import gpu_description
from collage_core.errors import CollageError

try:
    from tvm import relax
except (ImportError, AttributeError):
    if "tvm_compiler" in tvm.base._LOADED_LIBS:
        raise  # a full TVM that is broken, not a runtime-only one
    relax = None  # runtime-only TVM (no libtvm_compiler loaded): load and run, nothing more

TargetSpec = Union[None, str, dict, "tvm.target.Target"]
# TVM's importers are patched while they run (to name a failing node): one import at a time per process.
_IMPORTER_PATCH = threading.Lock()


@functools.lru_cache(maxsize=None)
def host_cpu_target() -> tvm.target.Target:
    """This machine's CPU. ``{"kind": "llvm", "mcpu": "native"}`` would silently become a generic CPU.

    TVM names the CPU's model (``mcpu``), and LLVM takes every feature that model has; a virtual machine may hide
    some of them (an AMD EPYC "znver4" without AVX-512), and code using them dies of an illegal instruction. So
    the features the model implies and this CPU lacks are turned off (``mattr``), as LLVM reads them off the CPU.
    """
    found = tvm.target.Target.from_device(tvm.cpu())
    if "mcpu" not in found.attrs:
        return found
    try:
        features = dict(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")())
    except (AttributeError, ValueError, RuntimeError):  # a TVM without these functions: the model's features
        return found
    return tvm.target.Target(cpu_target_spec(str(found.attrs["mcpu"]), str(found.attrs.get("mtriple", "")), features))


def cpu_target_spec(cpu: str, triple: str, features: dict) -> dict:
    """The LLVM target of the CPU model LLVM calls ``cpu``, with the features that model implies and ``features``
    (name -> whether the CPU has it, as LLVM reads them off a CPU) says it lacks turned off."""
    spec = {"kind": "llvm", "mcpu": cpu, **({"mtriple": triple} if triple else {})}
    try:
        implied = tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(spec))
    except (AttributeError, ValueError, RuntimeError):
        return spec
    lacking = sorted(str(name) for name in implied if str(name) in features and not bool(features[str(name)]))
    return {**spec, "mattr": [f"-{feature}" for feature in lacking]} if lacking else spec


class TargetError(CollageError):
    """A target TVM cannot make; the message names it and says why."""


def make_target(spec: TargetSpec) -> tvm.target.Target:
    """A target from None or ``"cpu"`` (this CPU), a JSON/dict spec, or a ``Target``; anything else is
    a :class:`TargetError`."""
    if spec is None or (isinstance(spec, str) and spec in ("cpu", "llvm", "host")):
        return host_cpu_target()
    if isinstance(spec, tvm.target.Target):
        return spec
    given = spec
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)
        except (json.JSONDecodeError, RecursionError) as error:
            raise TargetError(f"target {given!r} is not JSON ({error})") from None
    elif isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise TargetError(f"a target is a name (llvm, cuda), a JSON object or a tvm.target.Target, not {given!r:.80}")
    try:
        return tvm.target.Target(spec)
    except Exception as error:  # TVM's message, in its first line
        hint = " (TVM 0.27 takes a target as JSON: '{\"kind\": \"llvm\", \"mcpu\": ...}')" if " " in str(spec.get("kind")) else ""
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise TargetError(f"target {given!r}: {first.split(' Target creation from config dict failed')[0]}{hint}") from None


def target_to_json(target: tvm.target.Target) -> str:
    """A canonical string for a target (cost-database keys and placement files)."""
    return json.dumps(_plain(target.export()), sort_keys=True)


def target_to_dict(target: tvm.target.Target) -> dict:
    return json.loads(target_to_json(target))


def _plain(value: Any):
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def has_compiler() -> bool:
    """Whether this TVM can compile (False where only TVM's runtime is installed, as on a deployment machine)."""
    return relax is not None


def ensure_device_runtime(device) -> None:
    """Load TVM's runtime for ``device``'s kind where runtime-only TVM does not load it by itself (CUDA)."""
    if device.dlpack_device_type() != tvm.cuda(0).dlpack_device_type() or has_compiler():
        return

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        directory = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[directory], mode="RTLD_GLOBAL"
        )


def virtual_machine(module, device):
    """A Relax VM over a loaded executable module; needs only TVM's runtime."""
    return VirtualMachine(module, device)


def device_from_name(name: str):
    """A device from its name as placements record it (``cpu``, ``cuda``, ``cuda:sm_90a``: the first of that kind)."""
    kind = name.split(":", 1)[0]
    return tvm.cpu(0) if kind in ("cpu", "llvm", "c") else tvm.device(kind, 0)


def device_for(target: tvm.target.Target):
    return device_from_name(target.kind.name)


def is_cuda(target: tvm.target.Target) -> bool:
    return target.kind.name == "cuda"


CUDA_GRAPH_CONFIG = {"relax.backend.use_cuda_graph": True}


def build_replaying_cuda_graphs(mod: tvm.IRModule, target: tvm.target.Target):
    """``relax.build`` for a CUDA target whose ``main`` replays as CUDA graphs where it can.

    TVM's CUDA pipeline with ``relax.backend.use_cuda_graph`` set, and one pass added: after each
    partition function is fused and scheduled on its own (so TVM's fusion still stops at partition
    boundaries, as it did when the partitions were measured), the partitions are inlined into
    ``main``, where ``RewriteCUDAGraph`` lifts every run of kernel launches on statically planned
    memory (TVM kernels and library calls alike) into one captured graph. What reads ``main``'s
    inputs or writes its outputs stays outside the graph.
    """

    @tvm.transform.module_pass(opt_level=0, name="CollageCUDAGraphPipeline")
    def replaying_pipeline(module, _context):
        with target:
            return tvm.transform.Sequential(_cuda_graph_passes(target))(module)

    with tvm.transform.PassContext(config=CUDA_GRAPH_CONFIG):
        return relax.build(mod, target, relax_pipeline=replaying_pipeline)


def lowered_for_cuda_graphs(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """What :func:`build_replaying_cuda_graphs` compiles, stopped before code generation (no GPU
    needed): its ``main`` calls ``vm.builtin.cuda_graph.run_or_capture`` once per captured graph."""
    with target, tvm.transform.PassContext(config=CUDA_GRAPH_CONFIG):
        return tvm.transform.Sequential(_cuda_graph_passes(target))(mod)


def _cuda_graph_passes(target: tvm.target.Target) -> list:
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline

    return (
        cuda_pipeline.library_dispatch_passes(target)
        + cuda_pipeline.legalize_passes(target)
        + [relax.transform.InlinePrivateFunctions()]
        + cuda_pipeline.dataflow_lower_passes(target)
        + cuda_pipeline.finalize_passes(target)
    )


def device_name(target: tvm.target.Target) -> str:
    """The device a target runs on, for cost keys and reports: the CPU model, or the GPU architecture
    and, where there is an NVIDIA GPU, its name, compute capability, CUDA and driver versions (so that
    costs measured on one GPU are never read on another)."""
    spec = target_to_dict(target)
    name = f"{spec.get('kind')}:{spec.get('mcpu') or spec.get('arch') or 'generic'}"
    if spec.get("kind") == "cuda":
        # A server's GPU (measured through RPC) is named in its target's "model"; else it is this machine's.
        gpu = spec.get("model") if spec.get("model") not in (None, "", "unknown") else gpu_description()
        name += f" ({gpu})" if gpu else ""
    return name


def value_type(expr):
    """The Relax type of a variable or expression (0.27 renamed ``struct_info`` to ``ty``)."""
    return expr.ty


def tensor_shape_dtype(expr) -> tuple[tuple[int, ...], str]:
    """Static shape and dtype of a tensor-typed expression; raises ValueError for dynamic shapes."""
    return type_shape_dtype(value_type(expr))


def type_shape_dtype(ty) -> tuple[tuple[int, ...], str]:
    """Static shape and dtype of a Relax tensor type; raises ValueError for other types and dynamic shapes."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise ValueError(f"not a tensor of known shape: {ty}")
    shape = []
    for dim in ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            raise ValueError(f"dynamic dimension {dim} in {ty}")
        shape.append(int(dim.value))
    return tuple(shape), str(ty.dtype)


def structural_key(func, with_values: bool = False) -> str:
    """Hex structural hash that ignores weight values but not their shapes (twelve BERT layers, one key); with
    ``with_values`` the constants' values count too (a scale of 0.125 and one of 3.0 legalize to different kernels)."""
    return format(tvm_ffi.structural_hash(func, map_free_vars=True, skip_tensor_content=not with_values) & (2**64 - 1), "016x")


def string_expr(text: str):
    """A Relax string literal (``R.str``), passed to packed functions as a host string on every device."""
    return relax.expr.String(text)


def op_name(call) -> str:
    return call.op.name


def is_op_call(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)


def llvm_target_has_any_feature(target, features) -> bool:
    """Whether LLVM's table for ``target``'s CPU (its ``mcpu``) lists any of ``features`` (LLVM's names: ``amx-bf16``)."""
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.target import codegen

    return any(bool(codegen.target_has_features([feature], make_target(target))) for feature in features)


def call_with_args(call, args):
    """``call`` (an operator call) on ``args`` instead, its attributes kept (0.27: ``ty_args`` for ``sinfo_args``)."""
    return relax.Call(call.op, args, call.attrs, call.ty_args)


def to_tensor(array: np.ndarray, device):
    array = np.asarray(array)
    # np.ascontiguousarray would turn a 0-d array into a 1-d one.
    return tvm.runtime.tensor(array if array.flags.c_contiguous else array.copy(order="C"), device)


def to_numpy(value) -> np.ndarray:
    return value.numpy()


def save_ir_json(mod) -> str:
    return tvm.ir.save_json(mod)


def load_ir_json(text: str):
    return tvm.ir.load_json(text)


def copy_with_new_vars(func):
    return relax.utils.copy_with_new_vars(func)


def structural_equal(first, second) -> bool:
    return bool(tvm_ffi.structural_equal(first, second))


def constant_array(expr):
    """The value of a tensor constant (``relax.const``) as numpy, or None for anything else.

    0.27 holds it as ``GenericConst.value``; older releases had ``relax.Constant.data``.
    """
    if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.ty, relax.TensorType):
        return expr.value.numpy()
    return None


def is_constant(expr) -> bool:
    return constant_array(expr) is not None


def scalar_constant(expr):
    """The number an ``IntImm``/``FloatImm`` argument holds (``R.clip``'s bounds), or None.

    0.27 passes them bare; older releases wrapped them in ``relax.PrimValue``.
    """
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return expr.value
    return None


def return_type(func):
    """A Relax function's declared return type (``ret_struct_info`` before 0.26)."""
    return func.ret_ty


def link_shared(output: str, objects: list[str]) -> None:
    """Link object files (as ``export_library`` writes them) into a shared library (``tvm.contrib.cc`` before 0.27)."""

    cc.create_shared(output, objects)


def host_objects(executable, target: tvm.target.Target, workspace: str) -> dict[str, bytes]:
    """The executable's host code as object files by name, unlinked: what ``export_library`` would
    link into a shared library (``lib0.o``, ...; ``devc.o`` holds the VM bytecode and constants).

    A placement with no TIR for the host (ONNX Runtime or OpenVINO alone) leaves TVM with a C source
    module (``lib0.c``), which is compiled here with TVM's compiler driver (``tvm.support.cc``;
    ``tvm.contrib.cc`` before 0.27). The VM bytecode and constants are always packed by LLVM for the
    target's host: TVM writes them as C source when no LLVM module gives it a triple, and a model's
    weights as a C array would take a compiler minutes.
    """

    objects = {}

    def compile_to_objects(_output, files, options=None, **_ignored):
        for path in map(Path, files):
            if path.suffix != ".o":
                source, path = path, path.with_suffix(".o")
                cc.create_executable(str(path), [str(source)], options=["-c", "-fPIC", *(options or [])])
            objects[path.name] = path.read_bytes()

    compile_to_objects.get_target_triple = lambda: _host_triple(target)
    executable.export_library(str(Path(workspace) / "host"), fcompile=compile_to_objects, workspace_dir=workspace)
    return objects


def _host_triple(target: tvm.target.Target) -> str:
    """The LLVM triple of ``target``'s host: its own for a CPU target, this machine's otherwise."""
    host = target.host if target.host is not None else target
    if host.kind.name == "llvm" and "mtriple" in host.attrs:
        return str(host.attrs["mtriple"])
    return str(tvm.target.codegen.llvm_get_system_triple())


def lowered_for_build(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """What ``relax.build`` compiles for ``target``, stopped before VM code generation: Relax functions
    that call TIR functions and packed functions. 0.27's build runs the target's own pipeline on
    GPUs (dlight schedules) and the generic one elsewhere."""
    pipeline = relax.get_default_pipeline(target) if "gpu" in target.keys else relax.get_pipeline("default")
    with target:
        return pipeline(mod)


def is_tir_function(func) -> bool:
    """Whether a module's function is TIR (``tvm.tir`` before 0.27)."""
    return isinstance(func, tvm.tirx.PrimFunc)


def tir_call(call):
    """``(callee, arguments)`` of a ``relax.call_tir`` (the callee a GlobalVar, the arguments its inline tuple's
    fields), or None for any other expression and for a call passing TIR variables too."""
    if not is_op_call(call) or op_name(call) != "relax.call_tir" or len(call.args) != 2:
        return None
    if not isinstance(call.args[1], relax.Tuple):
        return None
    return call.args[0], list(call.args[1].fields)


def te_prim_func(compute, specs):
    """The TIR function Relax's importers make of the TE ``compute`` (``bb.emit_te``) over placeholders of
    ``specs`` ((shape, dtype) each): int64 indices and no global symbol, so that ``structural_equal`` with a
    ``call_tir``'s callee says whether the callee is that computation."""
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm import te

    placeholders = [te.placeholder(shape, dtype, name=f"input_{index}") for index, (shape, dtype) in enumerate(specs)]
    return te.create_prim_func([*placeholders, compute(*placeholders)], "int64").without_attr("global_symbol")


def save_params(params: dict) -> bytes:
    """TVM's parameter serialization of name -> numpy array."""
    return bytes(tvm.runtime.save_param_dict({name: tvm.runtime.tensor(value) for name, value in params.items()}))


def load_params(data: bytes) -> dict:
    return {name: value.numpy() for name, value in tvm.runtime.load_param_dict(bytearray(data)).items()}


def onnx_convert_map() -> dict:
    """TVM's ONNX converters, with two of 0.27's replaced where they fall short.

    - ``Clip`` on constant bounds imports as ``R.clip``. 0.27 imports every Clip as two
      ``call_tir`` kernels (maximum, then minimum), which no backend's pattern can read; ONNX
      Runtime runs ``R.clip`` as Clip. Bounds that are not constants keep TVM's converter.
    - ``ConstantOfShape`` of a constant shape is a constant of that shape. 0.27 broadcasts the
      one-element value to the shape and fails on a scalar shape (GPT-2's causal mask).
    """
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.frontend.onnx import onnx_frontend

    return _with_fixes(onnx_frontend._get_convert_map())


class OnnxNodeFailure(Exception):
    """TVM's ONNX importer failed converting one node: its operator, its name and the error."""

    def __init__(self, op_type: str, node: str, cause: BaseException):
        super().__init__(f"{op_type} node {node!r}: {cause}")
        self.op_type, self.node, self.cause = op_type, node, cause


class TorchNodeFailure(Exception):
    """TVM's PyTorch importer failed converting one node of an exported program: its target, name and source line."""

    def __init__(self, target: str, node: str, source: str, cause: BaseException):
        super().__init__(f"{target} node {node!r}: {cause}")
        self.target, self.node, self.source, self.cause = target, node, source, cause


def from_exported_program(program):
    """TVM's importer of a ``torch.export`` program (weights as constants); a node it cannot convert
    raises :class:`TorchNodeFailure` naming it and the line of the module's source that made it."""
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.frontend.torch import exported_program_translator as translator

    def wrap(name, convert):
        def convert_naming_the_node(node, *rest):
            try:
                return convert(node, *rest)
            except Exception as error:
                trace = [line.strip() for line in (node.meta.get("stack_trace") or "").splitlines() if line.strip()]
                raise TorchNodeFailure(name, node.name, trace[-1] if trace else "", error) from error

        return convert_naming_the_node

    def naming_the_node(importer, *args, **kwargs):
        return {name: wrap(name, convert) for name, convert in original(importer, *args, **kwargs).items()}

    _skip_legacy_empty_cat_inputs(program)
    with _IMPORTER_PATCH:
        original = translator.ExportedProgramImporter.create_convert_map
        translator.ExportedProgramImporter.create_convert_map = naming_the_node
        try:
            return translator.from_exported_program(
                program,
                keep_params_as_input=False,
                unwrap_unit_return_tuple=True,
                custom_convert_map={name: wrap(name, convert) for name, convert in _TORCH_CONVERTERS.items()},
            )
        finally:
            translator.ExportedProgramImporter.create_convert_map = original


def _addmm_in_its_dtype(node, importer):
    """``aten.addmm`` (a ``Linear`` with a bias) as PyTorch computes it, in its operands' dtype: a 16-bit product
    accumulates in float32 and is rounded once. TVM 0.27's converter makes every product float32, so a float16,
    bfloat16 or float64 module's bias add mixed two dtypes and failed; a float32 module's is the same as TVM's."""
    bias, lhs, rhs = (importer.env[arg] for arg in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    dtype = str(value_type(lhs).dtype)
    accumulated = "float32" if dtype in ("float16", "bfloat16") else dtype
    builder = importer.block_builder
    result = None
    if alpha != 0:
        result = builder.emit(relax.op.matmul(lhs, rhs, out_dtype=accumulated))
        if accumulated != dtype:
            result = builder.emit(relax.op.astype(result, dtype))
        if alpha != 1:
            result = builder.emit(relax.op.multiply(result, relax.const(alpha, dtype)))
    if beta != 0:
        scaled = bias if beta == 1 else builder.emit(relax.op.multiply(bias, relax.const(beta, str(value_type(bias).dtype))))
        result = scaled if result is None else builder.emit(relax.op.add(scaled, result))
    return result


# Converters of ``torch.export`` nodes that replace TVM 0.27's (called with the node and the importer).
_TORCH_CONVERTERS = {"addmm.default": _addmm_in_its_dtype}


def _skip_legacy_empty_cat_inputs(program) -> None:
    """Drop 1-D empty tensors from ``aten.cat`` inputs, as PyTorch does (``torch.cat`` skips tensors of
    shape (0,)) and TVM's importer does not: a key/value cache that starts empty (``transformers``'
    DynamicCache) is concatenated with 4-D keys in every decoder."""
    # Deferred: PyTorch is optional and slow to import: loaded only for a PyTorch model.
    import torch

    def legacy_empty(value, dtype) -> bool:  # of the output's dtype: one of another dtype still promotes the result
        fake = getattr(value, "meta", {}).get("val")
        return getattr(fake, "shape", None) is not None and tuple(fake.shape) == (0,) and fake.dtype == dtype

    changed = False
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.cat.default and "val" in node.meta:
            kept = [tensor for tensor in node.args[0] if not legacy_empty(tensor, node.meta["val"].dtype)]
            if kept and len(kept) < len(node.args[0]):
                node.args = (kept, *node.args[1:])
                changed = True
    if changed:
        program.graph_module.recompile()


def from_onnx(proto):
    """TVM's ONNX importer (weights as constants) with the converters of :func:`onnx_convert_map`;
    a node it cannot convert raises :class:`OnnxNodeFailure` naming it. The caller has checked the
    model: the importer's own ``onnx.checker`` pass, which only warns, is skipped (a second
    serialization of the whole model: about a second for BERT-base's 440 MB)."""
    # Deferred: ONNX is optional: loaded only for an ONNX model.
    import onnx

    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx
    from tvm.relax.frontend.onnx import onnx_frontend

    def convert_naming_the_node(graph, op_name, inputs, attrs, opset):
        try:
            return original_convert(graph, op_name, inputs, attrs, opset)
        except Exception as error:
            raise OnnxNodeFailure(op_name, str(attrs.get("tvm_custom", {}).get("name", "?")), error) from error

    unnamed = [node for node in proto.graph.node if not node.name]
    if unnamed:  # a failure names its node: call unnamed ones after their first output
        named = type(proto)()
        named.CopyFrom(proto)
        for node in named.graph.node:
            node.name = node.name or (node.output[0] if node.output else node.op_type)
        proto = named
    with _IMPORTER_PATCH:
        original_map, original_convert = (onnx_frontend._get_convert_map, onnx_frontend.ONNXGraphImporter._convert_operator)
        original_check = onnx.checker.check_model
        onnx_frontend._get_convert_map = lambda: _with_fixes(original_map())
        onnx_frontend.ONNXGraphImporter._convert_operator = convert_naming_the_node
        onnx.checker.check_model = lambda *args, **kwargs: None
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # it prints a failing node's inputs
                # and warns of each name it changes to a valid Relax name (a model's own names are not Collage's to report)
                warnings.filterwarnings("ignore", message="Renaming name ", category=UserWarning)
                return tvm_from_onnx(proto, keep_params_in_input=False)
        finally:
            onnx_frontend._get_convert_map = original_map
            onnx_frontend.ONNXGraphImporter._convert_operator = original_convert
            onnx.checker.check_model = original_check


def _with_fixes(converters: dict) -> dict:
    return {**converters, "Clip": _constant_clip(), "ConstantOfShape": _constant_of_constant_shape()}


def _constant_of_constant_shape():
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.frontend.onnx import onnx_frontend

    tvm_converter = onnx_frontend.ConstantOfShape

    class ConstantOfConstantShape(tvm_converter):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            shape = constant_array(inputs[0])
            if shape is None:
                return tvm_converter._impl_v9(bb, inputs, attr, params)
            value = attr.get("value")
            value = onnx_frontend.get_numpy(value).reshape(()) if value is not None else np.float32(0)
            return relax.const(np.full([int(d) for d in shape.reshape(-1)], value, dtype=value.dtype))

    return ConstantOfConstantShape


def _constant_clip():
    # Deferred: TVM's compiler, which a runtime-only TVM lacks.
    from tvm.relax.frontend.onnx import onnx_frontend

    tvm_clip = onnx_frontend.Clip

    def bound(expr, default):
        if expr is None:
            return default
        value = constant_array(expr)
        if value is None or value.size != 1 or np.isnan(value).any():
            return None
        return float(value.reshape(()))

    def clip(bb, x, low, high):
        if low is None or high is None or low > high:  # ONNX gives high where low > high, R.clip low
            return None
        if not isinstance(x.ty, relax.TensorType) or not str(x.ty.dtype).startswith("float"):
            return None
        dtype = str(x.ty.dtype)
        finite = float(np.finfo(dtype).max)
        return bb.emit(relax.op.clip(x, tvm.tirx.FloatImm(dtype, max(low, -finite)), tvm.tirx.FloatImm(dtype, min(high, finite))))

    class ConstantClip(tvm_clip):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            result = clip(bb, inputs[0], float(attr.get("min", -np.inf)), float(attr.get("max", np.inf)))
            return result if result is not None else tvm_clip._impl_v1(bb, inputs, attr, params)

        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            low = bound(inputs[1] if len(inputs) > 1 else None, -np.inf)
            high = bound(inputs[2] if len(inputs) > 2 else None, np.inf)
            result = clip(bb, inputs[0], low, high)
            return result if result is not None else tvm_clip._impl_v13(bb, inputs, attr, params)

    return ConstantClip


# RPC: a tracker, its servers, and libraries run on them (tvm.rpc; moved between releases before).


def rpc_tracker_summary(host: str, port: int) -> dict:
    """The tracker's summary: ``{"server_info": [{"key": "server:KEY", "addr": [host, port]}, ...],
    "queue_info": {KEY: {"free": n, "pending": n}}}``; OSError or RuntimeError when it cannot be asked."""
    tracker = rpc.connect_tracker(host, port)
    try:
        return tracker.summary()
    finally:
        tracker.close()


def rpc_tracker_reachable(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TVM tracker answers at ``host:port`` within ``timeout_s`` (``connect_tracker`` alone
    retries for a minute)."""

    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<i", rpc_base.RPC_TRACKER_MAGIC))
            return struct.unpack("<i", rpc_base.recvall(sock, 4))[0] == rpc_base.RPC_TRACKER_MAGIC
    except (OSError, struct.error, RuntimeError):
        return False


def rpc_request(host: str, port: int, key: str, session_timeout_s: float = 0):
    """A session on a free server registered under ``key`` (waits for one), and that server's address
    ``host:port``: ``TrackerSession.request`` hides which server it gave."""

    tracker = rpc.connect_tracker(host, port)
    try:
        rpc_base.sendjson(tracker._sock, [rpc_base.TrackerCode.REQUEST, key, "", 1])
        value = rpc_base.recvjson(tracker._sock)
    finally:
        tracker.close()
    if value[0] != rpc_base.TrackerCode.SUCCESS:
        raise RuntimeError(f"the tracker refused a session for key {key!r}: {value!r}")
    url, server_port, match_key = value[1]
    return rpc.connect(url, server_port, match_key, session_timeout_s), f"{url}:{server_port}"


def rpc_system_cpu(session) -> tuple[str, str]:
    """The remote machine's CPU model and triple as LLVM names them (what ``Target.from_device`` reads
    here); KeyError-like failure when its TVM is runtime-only (no LLVM)."""
    return session.get_function("target.llvm_get_system_cpu")(), session.get_function("target.llvm_get_system_triple")()


def rpc_cpu_target_spec(session) -> dict:
    """The remote machine's CPU as a target (:func:`cpu_target_spec`: its model, with the features it lacks turned
    off, read from its LLVM); KeyError-like failure when its TVM is runtime-only (no LLVM)."""
    cpu, triple = rpc_system_cpu(session)
    try:  # the map of features comes back printed: `{"avx512f": T.bool(False), ...}`
        printed = str(session.get_function("ffi.ReprPrint")(session.get_function("tvm.codegen.llvm.GetHostCPUFeatures")()))
        features = {name: value == "True" for name, value in re.findall(r'"([\w.-]+)": T\.bool\((True|False)\)', printed)}
    except Exception:  # noqa: BLE001 - an older server: its model's features
        features = {}
    return cpu_target_spec(str(cpu), str(triple), features)


def rpc_load_module(session, path: os.PathLike, name: Optional[str] = None):
    """``path`` uploaded to the server (as ``name``) and loaded there: a TVM library, or a shared library
    whose static initializers register functions (a backend's native kernels)."""
    name = name or Path(path).name
    session.upload(str(path), target=name)
    return session.load_module(name)


def rpc_device(session, target: tvm.target.Target):
    """The server's device that ``target`` runs on: its first CUDA GPU, or its CPU."""
    return session.cuda(0) if is_cuda(target) else session.cpu(0)


def rpc_gpu(session) -> tuple[str, str]:
    """The server's first CUDA GPU: its architecture (``sm_90``) and a description: its name, compute capability
    and the CUDA version of its TVM runtime (the driver's, which a local GPU's description gives, is not told
    through RPC); RuntimeError when the server has none."""
    device = session.cuda(0)
    if not device.exist:
        raise RuntimeError("it has no CUDA GPU (or its TVM runtime was built without CUDA)")
    try:
        capability = str(device.compute_version)
    except Exception as error:  # noqa: BLE001 - the RPC error's text says why
        if "initialization error" in str(error) or "NOT_INITIALIZED" in str(error):
            raise RuntimeError("CUDA cannot initialize in its forked session: start the server with --no-fork") from None
        raise
    runtime = device.api_version  # cudaRuntimeGetVersion: 13000 for CUDA 13.0
    cuda = f", CUDA runtime {int(runtime) // 1000}.{int(runtime) % 1000 // 10}" if runtime else ""
    return "sm_" + capability.replace(".", ""), f"{device.device_name}, compute capability {capability}{cuda}"


def rpc_is_alive(session) -> bool:
    """Whether the server still answers."""
    try:
        session.get_function("tvm.rpc.server.workpath")
        return True
    except Exception:
        return False
