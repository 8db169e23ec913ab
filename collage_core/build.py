"""Lowering each backend's partitions and building the whole into one TVM executable."""

from __future__ import annotations

import tvm
from tvm import relax

from collage_core.errors import CollageError
from collage_core.partition import BACKEND_ATTR
from collage_core.plugins import first_result


class BuildError(CollageError):
    """A placed module could not be lowered or built."""


def partitions_by_backend(mod: tvm.IRModule) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and BACKEND_ATTR in func.attrs:
            found.setdefault(str(func.attrs[BACKEND_ATTR]), []).append(gvar.name_hint)
    return {backend: sorted(names) for backend, names in sorted(found.items())}


def lower_partitions(pm, mod: tvm.IRModule, backends: dict, target) -> tvm.IRModule:
    """Hand each backend its partitions; ``backends`` maps names to ``Backend`` records."""
    for backend_name, names in partitions_by_backend(mod).items():
        if backend_name not in backends:
            raise BuildError(f"partitions are placed on backend {backend_name!r}, which is not installed")
        lowered, errors = first_result(
            pm.hook.collage_lower_partitions, backend=backends[backend_name], mod=mod, function_names=names, target=target
        )
        if lowered is None and errors:
            raise BuildError(f"backend {backend_name}: lowering failed: {'; '.join(_last_line_of(e) for e in errors)}")
        if lowered is None:
            raise BuildError(f"no plugin lowers partitions of backend {backend_name}")
        mod = lowered
    return relax.transform.RunCodegen()(mod)


def replace_functions(mod: tvm.IRModule, function_names, lower) -> tvm.IRModule:
    """A copy of ``mod`` with each named function replaced by ``lower(function, name)``.

    What a plugin whose ``collage_lower_partitions`` rewrites each partition on its own returns.
    """
    lowered = mod.clone()
    for name in function_names:
        gvar = lowered.get_global_var(name)
        lowered.update_func(gvar, lower(lowered[gvar], name))
    return lowered


def build(pm, mod: tvm.IRModule, backends: dict, target):
    """Lower, then build with TVM's default pipeline for ``target``; returns a ``relax.Executable``."""
    lowered = lower_partitions(pm, mod, backends, target)
    try:
        return relax.build(lowered, target)
    except Exception as error:
        raise BuildError(f"TVM build failed: {type(error).__name__}: {_last_line(error)}") from None


def _last_line(error: BaseException) -> str:
    return _last_line_of(str(error))


def _last_line_of(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
