"""A partition lowered as TVM's default pipeline lowers it, its kernels then replaced by their tuned schedules.

TVM's pipeline legalizes a function's operators into TIR kernels and fuses them (LegalizeOps, AnnotateTIROpPattern,
FoldConstant, FuseOps, FuseTIR: ``tvm/relax/backend/{cpu_generic,cuda}/pipeline.py``). Run on the partition alone,
the same passes give the kernels MetaSchedule tunes; each is replaced by its best record in the device's database,
added to the outer module under a name of its own, and marked so that the outer build keeps it as it is: an opaque
operator pattern (FuseOps fuses it with nothing) and ``tirx.is_scheduled`` (dlight leaves it alone on CUDA).
"""

from __future__ import annotations

import tvm
from collage_tvm import prepare
from tvm import relax

from collage_core.kit import PatternRefused
from collage_metaschedule import database

# tvm/relax/op_attr_types.h: kOpaque. AnnotateTIROpPattern keeps a nonzero op_pattern it finds.
OPAQUE = 8
SCHEDULED = "tirx.is_scheduled"


class NotTuned(PatternRefused):
    """A partition some of whose kernels have no tuned record for this device."""


def legalized(func: relax.Function, target: tvm.target.Target) -> tvm.IRModule:
    """The partition ``func`` as ``main`` of a module of its own, lowered to fused TIR kernels as TVM's pipeline does
    (rewritten first as the TVM plugin rewrites its partitions: ``collage_tvm.prepare``)."""
    passes = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(["main"]),
        ]
    )
    # A partition is private (no global symbol): the passes would drop it as unreachable.
    with target:
        return passes(tvm.IRModule({"main": prepare.prepared(func).with_attr("global_symbol", "main")}))


def kernels(mod: tvm.IRModule) -> list[tuple[tvm.ir.GlobalVar, tvm.tirx.PrimFunc]]:
    """The TIR kernels of a legalized partition, in name order."""
    found = [(gvar, func) for gvar, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc)]
    return sorted(found, key=lambda item: item[0].name_hint)


def scheduled_kernels(mod: tvm.IRModule, target: tvm.target.Target, db) -> dict:
    """Each kernel of ``mod`` (a legalized partition) by its global variable, scheduled by its tuned record and
    marked as such; :class:`NotTuned` naming the first kernel without one."""
    if not kernels(mod):
        raise NotTuned("TVM's pipeline makes no kernel of it: there is nothing tuned to run")
    found = {}
    for gvar, func in kernels(mod):
        best = database.tuned(db, func, target)
        if best is None:
            count = len(kernels(mod))
            raise NotTuned(f"kernel {gvar.name_hint} (of {count}) has no tuned record for this device: `--tune-budget-s S` tunes it")
        found[gvar] = best.with_attr("op_pattern", OPAQUE).with_attr(SCHEDULED, True)
    return found


def lower_partitions(mod: tvm.IRModule, function_names, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` with each named partition calling its tuned kernels, which join the module under names of their own."""
    db = database.open_database(target)
    builder = relax.BlockBuilder(mod.clone())
    for name in function_names:
        inner = legalized(mod[name], target)
        renamed = {}
        for gvar, kernel in scheduled_kernels(inner, target, db).items():
            unique = f"{name}_{gvar.name_hint}".replace("-", "_")  # a C symbol: the backend's name has a dash
            renamed[gvar.name_hint] = builder.add_func(kernel.with_attr("global_symbol", unique), unique)
        body = _Rename(renamed).visit_expr(inner["main"]).without_attr("global_symbol")
        builder.update_func(builder.get().get_global_var(name), body)
    return builder.get()


@relax.expr_functor.mutator
class _Rename(relax.PyExprMutator):
    """Calls of kernels by their new global variables (``renamed``: by their names in the partition's own module)."""

    def __init__(self, renamed: dict):
        super().__init__()
        self.renamed = renamed

    def visit_global_var_(self, op):
        return self.renamed.get(op.name_hint, op)
