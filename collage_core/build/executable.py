"""Lowering each backend's partitions and building the whole into one TVM executable."""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build.partition import BACKEND_ATTR
from collage_core.errors import CollageError
from collage_core.model.original_model import is_lowered_already
from collage_core.plugins import CollagePluginManager, first_result
from collage_core.records import Backend


class BuildError(CollageError):
    """A placed module could not be lowered or built."""


def partitions_by_backend(mod: tvm.IRModule) -> dict[str, list[str]]:
    """The names of ``mod``'s partition functions, sorted, by the backend each is placed on (``collage.backend``)."""
    found: dict[str, list[str]] = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and BACKEND_ATTR in func.attrs:
            found.setdefault(str(func.attrs[BACKEND_ATTR]), []).append(gvar.name_hint)
    return {backend: sorted(names) for backend, names in sorted(found.items())}


def lower_partitions(
    pm: CollagePluginManager, mod: tvm.IRModule, backends: Mapping[str, Backend], target: tvm.target.Target
) -> tvm.IRModule:
    """Hand each backend its partitions; ``backends`` maps names to ``Backend`` records. An engine's own
    session over the original model file was lowered where the file was (``collage_core.model.original_model``):
    its backend's runtime is only prepared here."""
    for backend_name, names in partitions_by_backend(mod).items():
        if backend_name not in backends:
            raise BuildError(f"partitions are placed on backend {backend_name!r}, which is not installed")
        sessions = [name for name in names if is_lowered_already(mod[name])]
        if sessions:
            ready, errors = first_result(pm.hook.collage_prepare_runtime, backend=backends[backend_name])
            if not ready:
                reason = "; ".join(_last_line_of(e) for e in errors) or "no plugin prepares its runtime"
                raise BuildError(f"backend {backend_name}: its own session cannot run here: {reason}")
            names = [name for name in names if name not in sessions]
            if not names:
                continue
        lowered, errors = first_result(
            pm.hook.collage_lower_partitions, backend=backends[backend_name], mod=mod, function_names=names, target=target
        )
        if lowered is None and errors:
            raise BuildError(f"backend {backend_name}: lowering failed: {'; '.join(_last_line_of(e) for e in errors)}")
        if lowered is None:
            raise BuildError(f"no plugin lowers partitions of backend {backend_name}")
        mod = lowered
    return relax.transform.RunCodegen()(mod)


def replace_functions(
    mod: tvm.IRModule, function_names: Sequence[str], lower: Callable[[relax.Function, str], relax.Function]
) -> tvm.IRModule:
    """A copy of ``mod`` with each named function replaced by ``lower(function, name)``.

    What a plugin whose ``collage_lower_partitions`` rewrites each partition on its own returns.
    """
    lowered = mod.clone()
    for name in function_names:
        gvar = lowered.get_global_var(name)
        lowered.update_func(gvar, lower(lowered[gvar], name))
    return lowered


def build(
    pm: CollagePluginManager, mod: tvm.IRModule, backends: Mapping[str, Backend], target: tvm.target.Target, cuda_graphs: bool = False
) -> relax.Executable:
    """Lower, then build with TVM's default pipeline for ``target``; returns a ``relax.Executable``.

    With ``cuda_graphs`` on a CUDA target, ``main`` replays its kernels and library calls as CUDA
    graphs (see :func:`tvm_compat.build_replaying_cuda_graphs`): one launch instead of hundreds.
    Library calls must then run on TVM's current stream and allocate nothing after their first call.
    """
    lowered = lower_partitions(pm, mod, backends, target)
    try:
        if cuda_graphs and tvm_compat.is_cuda(target):
            return tvm_compat.build_replaying_cuda_graphs(lowered, target)
        return relax.build(lowered, target)
    except Exception as error:
        raise BuildError(f"TVM build failed: {type(error).__name__}: {_last_line(error)}") from None


def _last_line(error: BaseException) -> str:
    return _last_line_of(str(error))


def _last_line_of(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def packed_call_function(
    func: relax.Function,
    name: str,
    packed_function: str,
    spec: str | np.ndarray,
    operands: Sequence[relax.Expr],
    before: Optional[Mapping[int, Callable[[relax.Expr], relax.Expr]]] = None,
    out_type: Optional[relax.TensorType] = None,
    after: Optional[Callable[[relax.Expr], relax.Expr]] = None,
) -> relax.Function:
    """``func`` (a partition) with its body replaced by ``R.call_dps_packed(packed_function, [spec, *operands])``.

    What a native backend's lowering returns: ``spec`` is what the kernel reads to know what to
    compute: an int64 numpy array (a constant tensor; the VM copies constants to the target's
    device, so this suits CPU kernels), a uint8 array (a serialized model, as the graph-level
    backends carry theirs) or a string (stays on the host on every device: GPU kernels take their
    spec so). ``operands`` are ``func``'s parameters or constants in the order the kernel takes
    them; the outputs are allocated by the VM with ``func``'s return type (each field of a tuple).

    Relax operators around the call, which TVM compiles with the rest of the partition (CUTLASS's
    layout changes): ``before`` maps an operand's index to a function making the expression passed in
    its place, ``out_type`` is then what the call writes, and ``after`` makes the partition's output
    from it.
    """
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in func.params]
    mapping = dict(zip(func.params, params))
    if isinstance(spec, str):
        spec_expr = tvm_compat.string_expr(spec)
    else:
        spec_expr = relax.const(spec, "uint8" if getattr(spec, "dtype", None) == np.uint8 else "int64")
    operands = [mapping.get(operand, operand) for operand in operands]
    return_type = tvm_compat.return_type(func)
    out_types = list(return_type.fields) if isinstance(return_type, relax.TupleType) else return_type
    bb = relax.BlockBuilder()
    before = before or {}
    with bb.function(name, params, attrs=dict(func.attrs) if func.attrs is not None else None, private=True):
        with bb.dataflow():
            operands = [bb.emit(before[i](operand)) if i in before else operand for i, operand in enumerate(operands)]
            call = relax.call_dps_packed(packed_function, [spec_expr, *operands], out_types if out_type is None else out_type)
            output = bb.emit_output(call if after is None else after(bb.emit(call)))
        bb.emit_func_output(output)
    return bb.get()[name]
