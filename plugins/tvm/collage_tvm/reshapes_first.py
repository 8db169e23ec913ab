"""A reshape after a norm over the last axis, done before the norm in TVM's partitions, so that what follows the norm
fuses with it.

TVM's FuseOps fuses a layer norm or a softmax with the elementwise operators right after it, but not past a reshape:
GPT-2 at bf16 normalizes, reshapes (batch, sequence) into rows and casts to 16 bits for the next product, and TVM
built that as two kernels, the norm and the cast (24 casts, 68 us of GPT-2's 1.47 ms at batch 8 on an H100). A norm
over the last axis computes each row of that axis on its own, so a reshape that keeps the last axis gives the same
values before the norm as after it; before it, the reshape is a view of the partition's input, and the norm and the
cast are one kernel. Only a norm the reshape alone reads is moved: one that something else reads too would be
computed twice.
"""

from __future__ import annotations

import collections

from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from collage_core.kit import tvm_compat

# Norms over the given axes of their first operand, with their operand counts.
NORMS = (("relax.nn.layer_norm", 3), ("relax.nn.rms_norm", 2), ("relax.nn.softmax", 1))


def _over_last_axis_only(norm) -> bool:
    rank = len(tvm_compat.tensor_shape_dtype(norm.args[0])[0])
    if tvm_compat.op_name(norm) == "relax.nn.softmax":
        axes = [int(norm.attrs.axis)]
    else:
        axes = [int(axis) for axis in norm.attrs.axes]
    return [axis % rank for axis in axes] == [rank - 1]


def reshapes_before_norms(func: relax.Function) -> relax.Function:
    """``func`` with every ``reshape(norm(x, ...), shape)`` whose norm is over the last axis only, is read by the
    reshape alone, and whose ``shape`` keeps that axis computed as ``norm(reshape(x, shape), ...)``."""
    read_once = _norms_read_once(func)
    shape = wildcard()
    norms = [is_op(name)(*[wildcard() for _ in range(arity)]) for name, arity in NORMS]
    normed = norms[0]
    for other in norms[1:]:
        normed = normed | other
    reshaped = is_op("relax.reshape")(normed, shape)

    def reshape_first(call, matches):
        norm = matches[normed]
        if not any(norm.same_as(once) for once in read_once):
            return call
        try:
            before, _ = tvm_compat.tensor_shape_dtype(norm.args[0])
            after, _ = tvm_compat.tensor_shape_dtype(call)
            if not _over_last_axis_only(norm) or after[-1] != before[-1]:
                return call
        except ValueError:  # a dimension of unknown extent
            return call
        return _norm_of(norm, relax.op.reshape(norm.args[0], matches[shape]))

    return rewrite_call(reshaped, reshape_first, func)


def _norms_read_once(func: relax.Function) -> list:
    """The norm calls of ``func`` whose results one binding (or the function's result) reads, and nothing else."""
    readers = collections.Counter()
    bound = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            readers.update(relax.analysis.free_vars(binding.value))
            if tvm_compat.is_op_call(binding.value) and tvm_compat.op_name(binding.value) in dict(NORMS):
                bound[binding.var] = binding.value
    readers.update(relax.analysis.free_vars(func.body.body))
    return [call for var, call in bound.items() if readers[var] == 1]


def _norm_of(norm, data):
    """``norm`` over the last axis of ``data``, with its other operands and attributes."""
    attrs, name = norm.attrs, tvm_compat.op_name(norm)
    if name == "relax.nn.softmax":
        return relax.op.nn.softmax(data, axis=-1)
    if name == "relax.nn.rms_norm":
        return relax.op.nn.rms_norm(data, norm.args[1], axes=[-1], epsilon=float(attrs.epsilon))
    return relax.op.nn.layer_norm(
        data, norm.args[1], norm.args[2], axes=[-1], epsilon=float(attrs.epsilon), center=bool(attrs.center), scale=bool(attrs.scale)
    )
