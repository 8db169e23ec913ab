"""The floating-point work of a Relax model: what a latency is divided by to compare it with a device's peak.

A multiply-add counts as two FLOPs. Only the operators that carry nearly all of a network's arithmetic
are counted: matrix products (``relax.matmul``, which is also every dense layer and batched product),
convolutions (1-D, 2-D and 3-D, grouped and transposed) and fused attention (``relax.nn.attention``: its
two products). Element-wise operators, normalizations, softmax, reductions, pooling and data movement
are not counted (in ResNet-50 and BERT-base they are well under 1% of the multiply-adds), nor are
``call_tir`` kernels, whose work is not visible as an operator. A causal attention mask is counted
as the full product.
"""

from __future__ import annotations

import math

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat

COUNTED = "2 FLOPs per multiply-add of matrix products, convolutions and attention; other operators not counted"
_CONVOLUTIONS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_TRANSPOSED = ("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose")
_ATTENTION = ("relax.nn.attention", "relax.nn.attention_bias")


@attrs.frozen
class FlopCount:
    """FLOPs of one run of a model, in all and by operator (``{"relax.matmul": ...}``)."""

    flops: int
    by_op: dict = attrs.field(factory=dict, eq=False)


def count_flops(mod: tvm.IRModule, function: str = "main") -> FlopCount:
    """The FLOPs of one call of ``mod[function]``, following its calls of the module's other Relax functions."""
    by_op: dict = {}
    _add_function(mod, mod[function], by_op, depth=0)
    return FlopCount(sum(by_op.values()), dict(sorted(by_op.items())))


def multiply_adds(call, output) -> int:
    """The multiply-adds of one operator call whose result is ``output`` (a bound variable); 0 for an
    operator that is not counted or whose shapes are not static."""
    op = tvm_compat.op_name(call)
    try:
        out_shape, _ = tvm_compat.tensor_shape_dtype(output)
        if op == "relax.matmul":
            left, _ = tvm_compat.tensor_shape_dtype(call.args[0])
            return math.prod(out_shape) * left[-1]
        if op in _CONVOLUTIONS:  # each output element sums over its group's input channels and the window
            weight, _ = tvm_compat.tensor_shape_dtype(call.args[1])
            return math.prod(out_shape) * math.prod(weight) // weight[str(call.attrs.kernel_layout).index("O")]
        if op in _TRANSPOSED:  # each input element is scattered over its group's output channels and the window
            data, _ = tvm_compat.tensor_shape_dtype(call.args[0])
            weight, _ = tvm_compat.tensor_shape_dtype(call.args[1])
            return math.prod(data) * math.prod(weight) // weight[str(call.attrs.kernel_layout).index("I")]
        if op in _ATTENTION:  # query [B, S, N, H] against key [B, S_kv, N, H], then value [B, S_kv, N, H_v]
            query, _ = tvm_compat.tensor_shape_dtype(call.args[0])
            key, _ = tvm_compat.tensor_shape_dtype(call.args[1])
            value, _ = tvm_compat.tensor_shape_dtype(call.args[2])
            batch, length, heads, _ = query
            return batch * heads * length * key[1] * (query[3] + value[3])
    except (ValueError, IndexError, AttributeError):
        return 0
    return 0


def _add_function(mod, func, by_op: dict, depth: int) -> None:
    if depth > 16 or not isinstance(func.body, relax.SeqExpr):  # a module never nests calls this deep
        return
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if tvm_compat.is_op_call(call):
                work = multiply_adds(call, binding.var)
                if work:
                    op = tvm_compat.op_name(call)
                    by_op[op] = by_op.get(op, 0) + 2 * work
            elif isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar):
                callee = mod[call.op] if call.op in mod.functions else None
                if isinstance(callee, relax.Function):
                    _add_function(mod, callee, by_op, depth + 1)
