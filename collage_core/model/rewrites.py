"""Rewrites of an imported model that keep what it computes and let more backends take its operators.

- :func:`global_pooling`: a max or average pooling whose one window covers its whole input (a kernel as large as
  the input or larger, in ceil mode: EfficientNet's ``AvgPool2d(1280, ceil_mode=True)`` pooler) becomes the global
  pooling it computes, ``max`` or ``mean`` over the spatial axes with the axes kept. TVM's plain build of such a
  pooling loops over the whole kernel for each output (seconds on a 7x7 input); graph-level engines refuse it.
- :func:`importer_pads`: the ``call_tir`` kernels TVM's ONNX importer writes for ONNX ``Pad`` (TOPI's ``pad``,
  ``mirror_pad`` and ``replicate_pad``) become ``relax.nn.pad``, or nothing where they pad by zero. A callee is
  rewritten only where it is, structurally, the kernel TOPI makes for widths and a value read off its shapes.
- :func:`boolean_cumsums`: a running sum of booleans (PyTorch's ``mask.cumsum(-1)``, as GPT-2 numbers its positions)
  counts in int64, as PyTorch and numpy count; TVM's PyTorch importer keeps the booleans' type, which no backend
  builds (and which would count nothing). ONNX's CumSum takes no booleans, so an ONNX model never has one.
- :func:`scaled_operands`: a matrix product of two computed operands, each multiplied by a constant number first (the
  exporters' attention scales both Q and K by ``d ** -0.25``), becomes the product of the unscaled operands, scaled
  once after it (a dense layer's input keeps its scale: erf GELU ends in one, which libraries fuse before the layer). Libraries' products read transposed operands in place and scale their result in the epilogue, so
  the attention scores become one kernel instead of two transposes, two multiplications and the product.
- :func:`lone_concats`: a concatenation of one tensor (OPT's export writes one around each key and value, where a
  cache would be joined) is that tensor: a copy kernel less, and attention reads its keys and values in place.

:func:`for_backends` applies them all; :mod:`collage_core.model.model_import` calls it after the import, before constants
are folded.
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional

import numpy as np
import tvm
from tvm import relax, topi

from collage_core import tvm_compat
from collage_core.candidates.fused_groups import scalar

POOLINGS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d")
# Combinations of widths tried per kernel, at most (even ones, then one more before, then all at one end first).
MAX_PAD_CANDIDATES = 64

# A rule sees the module, the call (its arguments already rewritten) and ``producer``, which gives the call an
# argument is bound to (None for anything else); it returns what replaces the call, or None to keep it.
Rule = Callable[[tvm.IRModule, relax.Call, Callable[[relax.Expr], Optional[relax.Call]]], Optional[relax.Expr]]


def _window_covers(size: int, kernel: int, begin: int, dilation: int, length: int) -> bool:
    return length == 1 and (dilation == 1 or kernel == 1) and kernel - begin >= size


def _global_pooling(mod: tvm.IRModule, call: relax.Call, producer=None) -> Optional[relax.Expr]:
    if not tvm_compat.is_op_call(call) or tvm_compat.op_name(call) not in POOLINGS:
        return None
    attrs = call.attrs
    layout = str(attrs.layout)
    if str(attrs.out_layout) != layout or sorted(layout) != sorted("NCHW"):
        return None
    try:
        shape, dtype = tvm_compat.tensor_shape_dtype(call.args[0])
        out_shape = tvm_compat.tensor_shape_dtype(call)[0]
    except ValueError:  # a dynamic shape
        return None
    if not dtype.startswith(("float", "bfloat")):
        return None
    axes = [layout.index("H"), layout.index("W")]
    padding = [int(p) for p in attrs.padding]  # top, left, bottom, right
    counted = 1
    for index, axis in enumerate(axes):
        size, kernel, begin, end = shape[axis], int(attrs.pool_size[index]), padding[index], padding[index + 2]
        if not _window_covers(size, kernel, begin, int(attrs.dilation[index]), out_shape[axis]):
            return None
        # An average divides by the window's part inside the explicitly padded input (count_include_pad) or
        # inside the input, never by ceil mode's overhang.
        counted *= min(kernel, size + begin + end) if attrs.count_include_pad else size
    if tvm_compat.op_name(call) == "relax.nn.max_pool2d":
        return relax.op.max(call.args[0], axis=axes, keepdims=True)
    if counted == shape[axes[0]] * shape[axes[1]]:
        return relax.op.mean(call.args[0], axis=axes, keepdims=True)
    total = relax.op.sum(call.args[0], axis=axes, keepdims=True)
    return relax.op.divide(total, relax.const(np.asarray(counted, dtype=dtype)))


def _width_candidates(extra: int) -> list[int]:
    """Widths before an axis padded by ``extra`` in all, likeliest first."""
    return list(dict.fromkeys([extra // 2, extra - extra // 2, 0, extra, *range(extra + 1)]))


def _topi_pads():
    """Callee name -> (how Relax's nn.pad names the mode, the TOPI computation of (data, before, after))."""
    return {
        "pad": ("constant", lambda data, before, after: topi.nn.pad(data, before, after, 0.0)),
        "mirror_pad": ("reflect", lambda data, before, after: topi.nn.mirror_pad(data, before, after, "REFLECT")),
        "replicate_pad": ("replicate", lambda data, before, after: topi.nn.replicate_pad(data, before, after)),
    }


def _importer_pad(mod: tvm.IRModule, call: relax.Call, producer=None) -> Optional[relax.Expr]:
    parts = tvm_compat.tir_call(call)
    if parts is None or len(parts[1]) != 1:
        return None
    callee, (data,) = parts
    kind = _topi_pads().get(callee.name_hint.rstrip("0123456789"))
    if kind is None:
        return None
    mode, compute = kind
    try:
        shape, dtype = tvm_compat.tensor_shape_dtype(data)
        out_shape, out_dtype = tvm_compat.tensor_shape_dtype(call)
    except ValueError:
        return None
    extras = [out - size for size, out in zip(shape, out_shape)]
    if len(out_shape) != len(shape) or out_dtype != dtype or min(extras) < 0:
        return None
    candidates = itertools.islice(itertools.product(*[_width_candidates(extra) for extra in extras]), MAX_PAD_CANDIDATES)
    for before in candidates:
        after = [extra - width for extra, width in zip(extras, before)]
        made = tvm_compat.te_prim_func(lambda x: compute(x, list(before), after), [(shape, dtype)])
        if tvm_compat.structural_equal(mod[callee], made):
            if not any(extras):
                return data  # a copy
            widths = [width for pair in zip(before, after) for width in pair]
            return relax.op.nn.pad(data, widths, pad_mode=mode, pad_value=0.0)
    return None


def _lone_concat(mod: tvm.IRModule, call: relax.Call, producer=None) -> Optional[relax.Expr]:
    if tvm_compat.op_name(call) != "relax.concat" or not isinstance(call.args[0], relax.Tuple) or len(call.args[0].fields) != 1:
        return None
    return call.args[0].fields[0]


def _boolean_cumsum(mod: tvm.IRModule, call: relax.Call, producer=None) -> Optional[relax.Expr]:
    if not tvm_compat.is_op_call(call) or tvm_compat.op_name(call) != "relax.cumsum":
        return None
    if _dtype(call.args[0]) != "bool" or call.attrs.dtype not in (None, "", "bool"):
        return None
    return relax.op.cumsum(relax.op.astype(call.args[0], "int64"), axis=call.attrs.axis, exclusive=call.attrs.exclusive)


def _dtype(expr) -> Optional[str]:
    try:
        return tvm_compat.tensor_shape_dtype(expr)[1]
    except ValueError:
        return None


def _scalar(expr) -> Optional[float]:
    """The number a float32 constant of one element holds, or None."""
    return scalar(expr) if _dtype(expr) == "float32" else None


def _is_weight(expr, producer) -> bool:
    """A constant, or a rearrangement of constants alone (the importer's transpose of a Gemm's weight)."""
    if tvm_compat.is_constant(expr):
        return True
    made = producer(expr)
    return made is not None and all(tvm_compat.is_constant(arg) for arg in made.args if not isinstance(arg, relax.ShapeExpr))


def _scaled_operands(mod: tvm.IRModule, call: relax.Call, producer) -> Optional[relax.Expr]:
    if not tvm_compat.is_op_call(call) or tvm_compat.op_name(call) != "relax.matmul":
        return None
    if any(_dtype(arg) != "float32" for arg in call.args) or call.attrs.out_dtype not in (None, "", "void", "float32"):
        return None  # a scale of another type would change the product's
    if any(_is_weight(arg, producer) for arg in call.args):
        return None  # a dense layer: its input's scale (erf GELU's 0.5) belongs to the activation libraries fuse before it
    operands, scale = [], 1.0
    for arg in call.args:
        made = producer(arg)
        if made is not None and tvm_compat.is_op_call(made) and tvm_compat.op_name(made) == "relax.multiply":
            for tensor, factor in (made.args, reversed(made.args)):
                number = _scalar(factor)
                if number is not None and _scalar(tensor) is None:
                    if tvm_compat.tensor_shape_dtype(tensor) != tvm_compat.tensor_shape_dtype(arg):
                        return None  # the scale broadcasts the operand: not a scale alone
                    operands.append(tensor)
                    scale *= number
                    break
            else:
                operands.append(arg)
        else:
            operands.append(arg)
    if scale == 1.0 and all(new.same_as(old) for new, old in zip(operands, call.args)):
        return None
    product = relax.op.matmul(operands[0], operands[1], out_dtype=call.attrs.out_dtype)
    return relax.op.multiply(product, relax.const(np.float32(scale), "float32"))


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, rules: list[Rule]):
        super().__init__(mod)
        self.mod, self.rules = mod, rules

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        for rule in self.rules:
            rewritten = rule(self.mod, call, self._producer)
            if rewritten is not None:
                return rewritten
        return call

    def _producer(self, expr) -> Optional[relax.Call]:
        if not isinstance(expr, relax.Var):
            return None
        bound = self.lookup_binding(expr)
        return bound if isinstance(bound, relax.Call) else None

    def rewrite(self) -> tvm.IRModule:
        for global_var, func in self.mod.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(global_var, self.visit_expr(func))
        return self.builder_.get()


def _apply(mod: tvm.IRModule, rules: list[Rule]) -> tvm.IRModule:
    return _Rewriter(mod, rules).rewrite()


def global_pooling(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each pooling whose window covers its whole input written as the global pooling it is."""
    return _apply(mod, [_global_pooling])


def importer_pads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the importer's TOPI pad kernels written as ``relax.nn.pad`` (or dropped, padding by zero)."""
    return _apply(mod, [_importer_pad])


def boolean_cumsums(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each running sum of booleans counted in int64."""
    return _apply(mod, [_boolean_cumsum])


def lone_concats(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each concatenation of one tensor replaced by that tensor."""
    return _apply(mod, [_lone_concat])


def scaled_operands(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each matrix product of operands scaled by constant numbers scaling its result instead."""
    return _apply(mod, [_scaled_operands])


def for_backends(mod: tvm.IRModule) -> tvm.IRModule:
    """Every rewrite, in one pass over ``mod``; the TIR functions no call reads any more stay for dead-code
    elimination to remove."""
    return _apply(mod, [_importer_pad, _global_pooling, _boolean_cumsum, _lone_concat, _scaled_operands])
