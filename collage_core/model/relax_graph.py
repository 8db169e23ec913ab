"""A Relax ``main`` function seen as an operator graph, and groups of its operators cut out as functions."""

from __future__ import annotations

from typing import Iterable, Optional

import attrs
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.search.graph import OpGraph


class RegionError(CollageError):
    """A group of operators cannot become a function of its own."""


@attrs.frozen
class Region:
    """Operators cut out of ``main``: the bindings they need, the values they read and those read after them."""

    bindings: tuple[int, ...]
    inputs: tuple = attrs.field(eq=False)
    outputs: tuple = attrs.field(eq=False)


@attrs.frozen
class RelaxGraph:
    """``main``'s single dataflow block: operator calls are nodes, other bindings (tuples, items) are glue."""

    func: relax.Function = attrs.field(eq=False, repr=False)
    bindings: tuple = attrs.field(eq=False, repr=False)
    op_bindings: tuple[int, ...]
    graph: OpGraph
    producers: tuple[frozenset[int], ...] = attrs.field(repr=False)
    users: dict = attrs.field(eq=False, repr=False)
    definer: dict = attrs.field(eq=False, repr=False)
    others: tvm.IRModule = attrs.field(eq=False, repr=False)
    # Each glue binding (not an operator call) by the operators it reads, and the bindings it reads: what
    # ``region`` looks at, so that cutting out a group costs its size, not the model's.
    glue_by_node: dict = attrs.field(eq=False, repr=False)
    glue_reads: dict = attrs.field(eq=False, repr=False)

    @classmethod
    def from_function(cls, func: relax.Function, module: Optional[tvm.IRModule] = None) -> "RelaxGraph":
        """``func`` is ``main``; ``module``, when given, holds the functions it calls (``call_tir`` PrimFuncs)."""
        blocks = [block for block in func.body.blocks if block.bindings]
        if len(blocks) != 1:
            raise RegionError(f"main must hold exactly one dataflow block, found {len(blocks)}")
        bindings = tuple(blocks[0].bindings)
        definer = {binding.var: index for index, binding in enumerate(bindings)}
        users: dict = {}
        op_bindings, op_of_binding, producers = [], {}, []
        glue_by_node: dict = {}
        glue_reads: dict = {}
        for index, binding in enumerate(bindings):
            read, reads_bindings = set(), []
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, set()).add(index)
                if var in definer:
                    reads_bindings.append(definer[var])
                    read |= {op_of_binding[definer[var]]} if definer[var] in op_of_binding else producers[definer[var]]
            producers.append(frozenset(read))
            if tvm_compat.is_op_call(binding.value):
                op_of_binding[index] = len(op_bindings)
                op_bindings.append(index)
            elif read:
                for node in read:
                    glue_by_node.setdefault(node, []).append(index)
                glue_reads[index] = tuple(reads_bindings)
        for var in relax.analysis.free_vars(func.body.body):
            users.setdefault(var, set()).add(len(bindings))
        graph = OpGraph(ops=[tvm_compat.op_name(bindings[i].value) for i in op_bindings], preds=[producers[i] for i in op_bindings])
        others = tvm.IRModule({gvar: f for gvar, f in (module.functions.items() if module is not None else ()) if gvar.name_hint != "main"})
        return cls(
            func,
            bindings,
            tuple(op_bindings),
            graph,
            tuple(producers),
            users,
            definer,
            others,
            {node: tuple(found) for node, found in glue_by_node.items()},
            glue_reads,
        )

    def builder(self) -> relax.BlockBuilder:
        """A BlockBuilder over the functions ``main`` calls, so cut-out groups keep what they call."""
        return relax.BlockBuilder(tvm.IRModule(dict(self.others.functions.items())))

    def call(self, node: int):
        return self.bindings[self.op_bindings[node]].value

    def region(self, nodes: Iterable[int]) -> Region:
        """The bindings of ``nodes`` plus the glue between them; inputs in order of first use."""
        nodes = frozenset(nodes)
        included = {self.op_bindings[n] for n in nodes}
        # Glue joins when every operator it reads is in the group and every binding it reads is included;
        # in binding order, since glue may read glue.
        for index in sorted({glue for node in nodes for glue in self.glue_by_node.get(node, ())}):
            if self.producers[index] <= nodes and all(read in included for read in self.glue_reads[index]):
                included.add(index)
        ordered = tuple(sorted(included))
        inputs, seen = [], set()
        for index in ordered:
            for var in _ordered_free_vars(self.bindings[index].value):
                if self.definer.get(var) not in included and var not in seen:
                    if not isinstance(tvm_compat.value_type(var), relax.TensorType):
                        raise RegionError(f"operator group reads {var.name}, which is not a tensor")
                    seen.add(var)
                    inputs.append(var)
        outputs = tuple(
            self.bindings[i].var for i in ordered if any(user not in included for user in self.users.get(self.bindings[i].var, ()))
        )
        if not outputs:
            raise RegionError("operator group produces nothing that is used")
        return Region(ordered, tuple(inputs), outputs)

    def region_function(self, nodes: Iterable[int], attrs_: dict | None = None) -> tuple[relax.Function, Region]:
        """The group as a standalone function: inputs become parameters, weights stay constants."""
        region = self.region(nodes)
        bb = relax.BlockBuilder()
        params = [relax.Var(var.name, tvm_compat.value_type(var)) for var in region.inputs]
        mapping = dict(zip(region.inputs, params))
        with bb.function("main", params, attrs=attrs_ or None, private=False):
            with bb.dataflow():
                for index in region.bindings:
                    binding = self.bindings[index]
                    value = substitute(binding.value, mapping)
                    if binding.var in region.outputs:
                        mapping[binding.var] = bb.emit_output(value, name_hint=binding.var.name)
                    else:
                        mapping[binding.var] = bb.emit(value, name_hint=binding.var.name)
            result = [mapping[var] for var in region.outputs]
            bb.emit_func_output(result[0] if len(result) == 1 else relax.Tuple(result))
        return bb.get()["main"], region

    def standalone_module(self, nodes: Iterable[int]) -> tvm.IRModule:
        """The group as a module's ``main``, with the functions it calls."""
        func, _ = self.region_function(nodes)
        bb = self.builder()
        bb.add_func(func, "main")
        return relax.transform.DeadCodeElimination(["main"])(bb.get())


def _ordered_free_vars(expr) -> list:
    """Free variables in argument order (``free_vars`` gives no order guarantee we rely on)."""
    found: list = []

    def visit(node):
        if isinstance(node, relax.Var) and node not in found:
            found.append(node)

    relax.analysis.post_order_visit(expr, visit)
    return found


def substitute(expr, mapping: dict):
    """``expr`` with variables replaced per ``mapping``; handles what a normalized binding holds."""
    if isinstance(expr, relax.Var):
        return mapping.get(expr, expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute(arg, mapping) for arg in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(field, mapping) for field in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, mapping), expr.index)
    return expr
