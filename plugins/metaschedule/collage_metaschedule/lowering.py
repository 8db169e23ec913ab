"""A partition lowered as TVM's default pipeline lowers it, its kernels then replaced by their tuned schedules.

The TVM plugin lowers a partition to its fused TIR kernels as TVM's pipeline does (:mod:`collage_tvm.kernels`); each
kernel is replaced here by its best record in the device's database and kept by the outer build as it is.
"""

from __future__ import annotations

import tvm
from collage_tvm import kernels as tvm_kernels

from collage_core.kit import PatternRefused
from collage_metaschedule import database

class NotTuned(PatternRefused):
    """A partition some of whose kernels have no tuned record for this device."""


def scheduled_kernels(mod: tvm.IRModule, target: tvm.target.Target, db) -> dict:
    """Each kernel of ``mod`` (a legalized partition) by its global variable, scheduled by its tuned record;
    :class:`NotTuned` naming the first kernel without one."""
    if not tvm_kernels.kernels(mod):
        raise NotTuned("TVM's pipeline makes no kernel of it: there is nothing tuned to run")
    found = {}
    for gvar, func in tvm_kernels.kernels(mod):
        best = database.tuned(db, func, target)
        if best is None:
            count = len(tvm_kernels.kernels(mod))
            raise NotTuned(f"kernel {gvar.name_hint} (of {count}) has no tuned record for this device: `--tune-budget-s S` tunes it")
        found[gvar] = best
    return found


def lower_partitions(mod: tvm.IRModule, function_names, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` with each named partition calling its tuned kernels, which join the module under names of their own."""
    db = database.open_database(target)
    return tvm_kernels.lower_partitions(mod, function_names, target, lambda inner: scheduled_kernels(inner, target, db))
