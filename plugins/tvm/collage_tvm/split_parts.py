"""The parts of a ``split`` as slices in TVM's partitions, so that each part fuses with what reads it.

TVM's FuseOps does not fuse past an operator with a tuple result: a ``split`` becomes a kernel of its own, which
copies every part out, and the views each part goes through next (GPT-2's q, k and v: a reshape into heads and a
transpose) become kernels of their own that copy it again. Each part read by index is the ``strided_slice`` of
its extent along the split's axis; a slice is an injective operator, so FuseOps fuses it with those views into one
kernel per part. GPT-2's attention at fp32 then takes three kernels where it took six (three for the split, one
per transpose). The values are the same: a slice copies what the split's part copies.
"""

from __future__ import annotations

from tvm import relax

from collage_core.kit import tvm_compat


def part_bounds(split) -> tuple[int, list[tuple[int, int]]] | None:
    """The axis of a ``split`` call and where each part begins and ends along it; None when a part's extent is
    not a known number."""
    bounds, start, axis = [], 0, 0
    for part in tvm_compat.value_type(split).fields:
        try:
            shape, _ = tvm_compat.type_shape_dtype(part)
        except ValueError:
            return None
        axis = int(split.attrs.axis) % len(shape)
        bounds.append((start, start + shape[axis]))
        start += shape[axis]
    return axis, bounds


@relax.expr_functor.mutator
class _SplitsAsSlices(relax.PyExprMutator):
    """Binds each part of a split read by index to its slice; the split itself is left for ``remove_all_unused``."""

    def __init__(self):
        super().__init__()
        self.splits = {}  # the split's variable: (its input, its axis, its parts' bounds), in the block being visited

    # A part read in another block than its split's stays a part: its slice would read a dataflow variable there.
    def visit_dataflow_block_(self, block):
        self.splits = {}
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block):
        self.splits = {}
        return super().visit_binding_block_(block)

    def visit_var_binding_(self, binding):
        value = binding.value
        if tvm_compat.is_op_call(value) and tvm_compat.op_name(value) == "relax.split":
            found = part_bounds(value)
            if found is not None:
                self.splits[binding.var] = (self.visit_expr(value.args[0]), *found)
        elif isinstance(value, relax.TupleGetItem) and value.tuple_value in self.splits:
            source, axis, bounds = self.splits[value.tuple_value]
            start, end = bounds[value.index]
            part = relax.op.strided_slice(source, axes=[axis], begin=[start], end=[end])
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(part)))
            return
        super().visit_var_binding_(binding)


def as_slices(func: relax.Function) -> relax.Function:
    """``func`` with every part of a ``split`` that is read by index computed as a ``strided_slice`` of the split's
    input; a split none of whose results is read any more is dropped."""
    if not any(tvm_compat.op_name(call) == "relax.split" for call in _calls(func)):
        return func
    return relax.analysis.remove_all_unused(_SplitsAsSlices().visit_expr(func))


def _calls(func: relax.Function) -> list:
    found = []
    relax.analysis.post_order_visit(func, lambda node: found.append(node) if tvm_compat.is_op_call(node) else None)
    return found
