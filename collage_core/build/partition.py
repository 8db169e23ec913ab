"""Applying a placement: each chosen group of operators becomes a function annotated with its backend."""

from __future__ import annotations

import heapq
from typing import Sequence

import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.errors import CollageError
from collage_core.model.relax_graph import RelaxGraph, substitute
from collage_core.records import Candidate, Partition

BACKEND_ATTR = "collage.backend"
PATTERN_ATTR = "collage.pattern"


class PartitionError(CollageError):
    """A placement cannot be applied to the model."""


def pattern_of(func: relax.Function) -> str:
    """The name of the pattern whose match a partition function holds ("" when it carries none)."""
    attrs = func.attrs
    return str(attrs[PATTERN_ATTR]) if attrs is not None and PATTERN_ATTR in attrs else ""


def partition_function_name(backend: str, index: int) -> str:
    return f"collage_{backend}_{index}"


def placed_whole(mod: tvm.IRModule, backend: str, pattern: str) -> tvm.IRModule:
    """``mod`` (one candidate cut out as a module) placed whole on ``backend`` as one partition."""
    graph = RelaxGraph.from_function(mod["main"], mod)
    return partition_module(graph, [Candidate(backend, pattern, range(len(graph.graph)), key="")])


def partition_module(graph: RelaxGraph, parts: Sequence[Candidate | Partition]) -> tvm.IRModule:
    """``main`` rewritten to call one function per part (each part has ``backend``, ``pattern``, ``nodes``).

    Glue bindings that no part takes stay in ``main``. Parts and glue are emitted in dependency
    order, lowest binding first, so the result is deterministic.
    """
    owner = {}
    for index, part in enumerate(parts):
        for node in part.nodes:
            if node in owner:
                raise PartitionError(f"operator {node} ({graph.graph.ops[node]}) is placed twice")
            owner[node] = index
    missing = [n for n in range(len(graph.graph)) if n not in owner]
    if missing:
        raise PartitionError(f"operator {missing[0]} ({graph.graph.ops[missing[0]]}) is not placed")

    functions, regions = [], []
    for index, part in enumerate(parts):
        func, region = graph.region_function(part.nodes, {BACKEND_ATTR: part.backend, PATTERN_ATTR: part.pattern})
        functions.append(func.without_attr("global_symbol"))
        regions.append(region)

    items = _schedule(graph, regions)
    bb = graph.builder()
    params = [relax.Var(param.name, tvm_compat.value_type(param)) for param in graph.func.params]
    mapping = dict(zip(graph.func.params, params))
    with bb.function("main", params):
        with bb.dataflow():
            for kind, index in items:
                if kind == "glue":
                    binding = graph.bindings[index]
                    mapping[binding.var] = bb.emit(substitute(binding.value, mapping), name_hint=binding.var.name)
                    continue
                part, region = parts[index], regions[index]
                gvar = bb.add_func(functions[index], partition_function_name(part.backend, index))
                call = relax.Call(gvar, [mapping[var] for var in region.inputs])
                result = bb.emit(call, name_hint=f"{part.backend}_{index}")
                if len(region.outputs) == 1:
                    mapping[region.outputs[0]] = result
                else:
                    for position, var in enumerate(region.outputs):
                        mapping[var] = bb.emit(relax.TupleGetItem(result, position), name_hint=var.name)
            output = bb.emit_output(substitute(graph.func.body.body, mapping))
        bb.emit_func_output(output)
    mod = bb.get()
    return relax.transform.DeadCodeElimination(["main"])(mod)


def _schedule(graph: RelaxGraph, regions) -> list[tuple[str, int]]:
    """Parts and leftover glue bindings in an order where each reads only what is defined before it."""
    taken = {index: part for part, region in enumerate(regions) for index in region.bindings}
    items = [("part", part) for part in range(len(regions))]
    items += [("glue", index) for index in range(len(graph.bindings)) if index not in taken]

    def needs(item):
        kind, index = item
        reads = regions[index].inputs if kind == "part" else relax.analysis.free_vars(graph.bindings[index].value)
        return {graph.definer[var] for var in reads if var in graph.definer}

    def first_binding(item):
        kind, index = item
        return regions[index].bindings[0] if kind == "part" else index

    producer_item = {}
    for item in items:
        kind, index = item
        for binding in regions[index].bindings if kind == "part" else (index,):
            producer_item[binding] = item
    waiting_on = {item: {producer_item[b] for b in needs(item)} - {item} for item in items}
    dependents: dict = {}
    for item, deps in waiting_on.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(item)
    ready = [(first_binding(item), item) for item, deps in waiting_on.items() if not deps]
    heapq.heapify(ready)
    order = []
    while ready:
        _, item = heapq.heappop(ready)
        order.append(item)
        for dependent in dependents.get(item, ()):
            waiting_on[dependent].discard(item)
            if not waiting_on[dependent]:
                heapq.heappush(ready, (first_binding(dependent), dependent))
    if len(order) != len(items):
        raise PartitionError("the placement's partitions depend on each other in a cycle")
    return order
