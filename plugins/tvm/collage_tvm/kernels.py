"""A partition lowered to TIR kernels as TVM's pipeline lowers it, each kernel scheduled before the outer build sees it.

TVM's pipeline (``tvm/relax/backend/{cpu_generic,cuda}/pipeline.py``) dispatches sorts, scans and sampling to library
kernels, legalizes the operators into TIR kernels and fuses them (LegalizeOps, AnnotateTIROpPattern, FoldConstant,
FuseOps, FuseTIR); on GPUs it then schedules each kernel with dlight. Run on one partition, the same passes give that
partition's kernels. A scheduler (the TVM plugin's dlight rules on GPUs, tvm-tuned's tuned records) schedules each; they
join the outer module under names of their own, marked so that the outer build keeps them as they are: an opaque
operator pattern (FuseOps fuses them with nothing) and ``tirx.is_scheduled`` (dlight leaves them alone).
"""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax

from collage_tvm import prepare

# tvm/relax/op_attr_types.h: kOpaque. AnnotateTIROpPattern keeps a nonzero op_pattern it finds.
OPAQUE = 8
SCHEDULED = "tirx.is_scheduled"

# A partition's kernels by their global variables in its own module -> each scheduled (it may raise PatternRefused).
Scheduler = Callable[[tvm.IRModule], dict]


def legalized(func: relax.Function, target: tvm.target.Target) -> tvm.IRModule:
    """The partition ``func`` as ``main`` of a module of its own, lowered to fused TIR kernels as TVM's pipeline does
    (rewritten first as the TVM plugin rewrites its partitions: :mod:`collage_tvm.prepare`)."""
    dispatch = [relax.backend.DispatchSampling(), relax.backend.DispatchSortScan()] if "gpu" in target.keys else []
    passes = tvm.transform.Sequential(
        [
            *dispatch,
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


def kept_as_scheduled(kernel: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``kernel`` marked so that the outer build neither fuses nor schedules it again."""
    return kernel.with_attr("op_pattern", OPAQUE).with_attr(SCHEDULED, True)


def lower_partitions(mod: tvm.IRModule, function_names, target: tvm.target.Target, schedule: Scheduler) -> tvm.IRModule:
    """``mod`` with each named partition calling its kernels as ``schedule`` scheduled them, which join the module under
    names of their own."""
    builder = relax.BlockBuilder(mod.clone())
    for name in function_names:
        inner = legalized(mod[name], target)
        renamed = {}
        for gvar, kernel in schedule(inner).items():
            unique = f"{name}_{gvar.name_hint}".replace("-", "_")  # a C symbol: a backend's name may have a dash
            renamed[gvar.name_hint] = builder.add_func(kept_as_scheduled(kernel).with_attr("global_symbol", unique), unique)
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
