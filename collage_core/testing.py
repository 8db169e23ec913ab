"""Helpers for backend plugins' tests: small Relax functions, the candidate a pattern makes of them, TVM's own answer.

A plugin's pattern test builds a function its pattern should cover whole (``function_module``),
finds that candidate (``whole_candidate``), and compares what its kernel computes with what TVM's
build of the same Relax computes on the CPU (``run_on_cpu``); ``operand_arrays`` gives the arrays a
kernel's operands stand for.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.candidates import enumerate_candidates
from collage_core.relax_graph import RelaxGraph


def function_module(make: Callable, *shapes, dtype: str = "float32") -> tvm.IRModule:
    """A module whose ``main`` takes tensors ``x0, x1, ...`` of ``shapes`` and returns ``make(bb, x0, x1, ...)``."""
    params = [relax.Var(f"x{i}", relax.TensorType(shape, dtype)) for i, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    return bb.get()


def whole_candidate(mod: tvm.IRModule, patterns: Sequence, pattern_name: str):
    """``(graph, candidate)``: the graph of ``main`` and the candidate of ``pattern_name`` covering all of it (or None)."""
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    found = [c for c in enumerate_candidates(graph, patterns) if c.pattern == pattern_name and frozenset(c.nodes) == everything]
    return graph, (found[0] if found else None)


def run_on_cpu(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """``main``'s first output for ``inputs``, built by TVM for this CPU."""
    vm = relax.VirtualMachine(relax.build(mod, tvm_compat.host_cpu_target()), tvm.cpu(0))
    result = vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu(0)) for x in inputs])
    return tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])


def operand_arrays(operands: Sequence, params: Sequence, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays a kernel's ``operands`` stand for: constants' values, and parameters' inputs (matched by name)."""
    by_name = {param.name: array for param, array in zip(params, inputs)}
    return [tvm_compat.constant_array(o) if tvm_compat.is_constant(o) else by_name[o.name] for o in operands]
