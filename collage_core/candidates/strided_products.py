"""A matrix product read in place (``matmul`` of strided operands, as :class:`~collage_core.candidates.fused_groups.StridedOperand`
gives them): its batch loops and its rows, merged where strides allow, so that a kernel library can run it as one
strided batch of matrix products and at most a loop around it. Shared by the GPU backends that run products.
"""

from __future__ import annotations

import attrs

from collage_core.candidates.fused_groups import Refused, StridedOperand, plain_strides


@attrs.frozen
class Axis:
    """One loop of the product: its size and each tensor's stride along it (lhs, rhs, out)."""

    size: int
    strides: tuple[int, int, int]


def _mergeable(outer: Axis, inner: Axis) -> bool:
    return all(o == i * inner.size for o, i in zip(outer.strides, inner.strides))


def _merged(outer: Axis, inner: Axis) -> Axis:
    return Axis(outer.size * inner.size, inner.strides)


def batch_axes(lhs: StridedOperand, rhs: StridedOperand, out_shape) -> tuple[list[Axis], Axis]:
    """The batch loops (outermost first, size-1 loops dropped) and the rows loop M, merged where strides allow."""
    rank = len(out_shape)
    out_strides = plain_strides(out_shape)

    def padded(operand: StridedOperand):
        missing = rank - len(operand.dims)
        return [1] * missing + list(operand.dims), [0] * missing + list(operand.strides)

    (lhs_dims, lhs_strides), (rhs_dims, rhs_strides) = padded(lhs), padded(rhs)
    axes = []
    for axis in range(rank - 2):
        size = out_shape[axis]
        strides = []
        for dims, operand_strides in ((lhs_dims, lhs_strides), (rhs_dims, rhs_strides)):
            if dims[axis] == size:
                strides.append(operand_strides[axis] if size > 1 else 0)
            elif dims[axis] == 1:
                strides.append(0)  # broadcast along this batch axis
            else:
                raise Refused("matmul batch dimensions that do not broadcast")
        axes.append(Axis(size, (strides[0], strides[1], out_strides[axis] if size > 1 else 0)))
    rows = Axis(out_shape[-2], (lhs_strides[-2], 0, out_strides[-2]))
    axes = [axis for axis in axes if axis.size > 1]
    while axes and _mergeable(axes[-1], rows):  # the right operand is shared by every row: fold batches into M
        rows = _merged(axes.pop(), rows)
    merged: list[Axis] = []
    for axis in axes:
        if merged and _mergeable(merged[-1], axis):
            merged[-1] = _merged(merged[-1], axis)
        else:
            merged.append(axis)
    return merged, rows


NO_BATCH = Axis(1, (0, 0, 0))


def batch_loops(lhs: StridedOperand, rhs: StridedOperand, out_shape, max_outer: int) -> tuple[Axis, Axis, Axis]:
    """The product as one strided batch (``inner``) looped at most ``max_outer`` times (``outer``) over its rows:
    ``(inner, outer, rows)``, a missing loop of size 1; :class:`Refused` saying why a kernel library cannot run it so."""
    if len(lhs.dims) < 2 or len(rhs.dims) < 2:
        raise Refused("matmul of a vector")
    batches, rows = batch_axes(lhs, rhs, out_shape)
    if len(batches) > 2:
        raise Refused("more batch dimensions than one strided batch and one loop can cover")
    inner = batches[-1] if batches else NO_BATCH
    outer = batches[0] if len(batches) == 2 else NO_BATCH
    if outer.size > max_outer:
        raise Refused(f"an outer batch of {outer.size} looped launches")
    return inner, outer, rows
