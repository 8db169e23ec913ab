"""The TVM plugin's schedules for its kernels on GPUs: TVM's own dlight rules, with one more tried first for short rows.

TVM's CUDA pipeline schedules each kernel with the first of dlight's Matmul, GEMV, Reduction, GeneralReduction and
Fallback rules that takes it (``tvm/relax/backend/cuda/pipeline.py``). GeneralReduction gives every row of a softmax or
a norm a block of 256 threads: a row of 128 (an attention softmax at sequence 128) leaves half of them idle and still
reduces across eight warps, twice. :class:`ShortRows` gives such a row one warp instead, several rows to a block, so each
reduction is a warp's shuffles.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

WARP = 32
# Rows per block of ShortRows (a warp each).
ROWS_PER_BLOCK = 4
# The longest row ShortRows takes: 8 elements a lane. Longer rows keep GeneralReduction's 256 threads.
MAX_ROW = 256


class ShortRows(dlight.gpu.GeneralReduction):
    """A kernel of reductions along the last axis (a softmax, a norm), each row at most ``MAX_ROW`` long and known when
    compiled, ending in an elementwise block over the same rows: one warp per row, ``ROWS_PER_BLOCK`` rows per block,
    each lane reading every 32nd element (coalesced). Any other kernel is left to the next rule (None)."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        infos = try_inline_contiguous_spatial(sch, infos) if infos else None
        if not infos or len(infos) < 2 or not _rows_reduced_then_written(sch, infos):
            return None
        try:
            _schedule(sch, infos)
        except s_tir.ScheduleError:  # a form the checks let through that the steps cannot take: dlight's rules try it
            return None
        return sch


def _schedule(sch: s_tir.Schedule, infos) -> None:
    leading = len(infos[0].dom_kind()) - 1
    loops = sch.get_loops(infos[-1].block_rv)
    block, row = sch.split(sch.fuse(*loops[:leading]), [None, ROWS_PER_BLOCK])
    strided, lane = sch.split(loops[-1], [None, WARP])
    sch.reorder(block, row, lane, strided)
    sch.bind(block, "blockIdx.x")
    sch.bind(row, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    for info in reversed(infos[:-1]):
        # Each reduction's result is the row's own, in every lane's registers: the warp's all-reduce broadcasts it.
        for index, _ in enumerate(sch.get(info.block_rv).writes):
            sch.set_scope(info.block_rv, buffer_index=index, storage_scope="local")
        sch.compute_at(info.block_rv, row, preserve_unit_loops=True)
        strided, lane = sch.split(sch.get_loops(info.block_rv)[-1], [None, WARP])
        sch.reorder(lane, strided)
        sch.bind(lane, "threadIdx.x")


def _rows_reduced_then_written(sch: s_tir.Schedule, infos) -> bool:
    """Whether the blocks are reductions over the last axis alone (``S..SR``) then one elementwise block over the same
    rows (``S..SS``) that reads each reduction's result at its own row, the row no longer than ``MAX_ROW`` and known
    when compiled. (A softmax over another axis of a square tensor has the same kinds and extents, but its written
    block reads the reductions across its rows.)"""
    kind = infos[0].dom_kind()
    leading = len(kind) - 1
    if leading == 0 or kind != "S" * leading + "R" or any(info.dom_kind() != kind for info in infos[:-1]):
        return False
    if infos[-1].dom_kind() != "S" * len(kind):
        return False
    row = _static(infos[0].iters[-1].dom)
    if row is None or row > MAX_ROW or any(_static(info.iters[-1].dom) != row for info in infos):
        return False
    written = sch.get(infos[-1].block_rv)
    rows = [iter_var.var for iter_var in written.iter_vars[:leading]]
    reduced = {region.source for info in infos[:-1] for region in sch.get(info.block_rv).writes}
    return all(_read_at(region, rows) for region in written.reads if region.source in reduced)


def _read_at(region, variables) -> bool:
    """Whether a buffer region is the one element at ``variables``."""
    if len(region.region) != len(variables):
        return False
    return all(
        isinstance(axis.min, tirx.Var) and axis.min.same_as(var) and _static(axis.extent) == 1
        for axis, var in zip(region.region, variables)
    )


def _static(extent):
    """An extent known when compiled, as an int; None for a symbolic one."""
    if isinstance(extent, int):
        return extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def rules() -> list:
    """The rules the TVM plugin schedules its GPU kernels with, in order: ShortRows, then TVM's own."""
    gpu = dlight.gpu
    return [ShortRows(), gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def scheduled(mod: tvm.IRModule, target: tvm.target.Target) -> dict:
    """Each TIR kernel of ``mod`` (a legalized partition) by its global variable, scheduled by the first rule that
    takes it."""
    with target:
        done = dlight.ApplyDefaultSchedule(*rules())(mod)
    return {gvar: func for gvar, func in done.functions_items() if isinstance(func, tirx.PrimFunc)}
