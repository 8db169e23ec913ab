"""Helpers for backend plugins' tests: small Relax functions, the candidate a pattern makes of them, TVM's own answer.

A plugin's pattern test builds a function its pattern should cover whole (``function_module``),
finds that candidate (``whole_candidate``), and compares what its kernel computes with what TVM's
build of the same Relax computes on the CPU (``run_on_cpu``); ``operand_arrays`` gives the arrays a
kernel's operands stand for. ``contract_problems`` runs a plugin's hooks against the contract on
a model and says, one line each, what is wrong.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.candidates import enumerate_candidates
from collage_core.fused_groups import as_dtype
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


def rounded_to(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` in ``dtype`` (``bfloat16`` is ml_dtypes', which TVM's tensors take): a 16-bit kernel's test input."""
    return as_dtype(array, dtype)


# A kernel that computes a 16-bit epilogue in float32 and rounds once may differ from TVM's build of the same
# Relax, which rounds after the cast, the bias and the residual add, by a few units in the last place.
LAST_PLACE = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def sixteen_bit_atol(expected: np.ndarray, dtype: str) -> float:
    """Four units in the last place of ``dtype`` at the largest magnitude of ``expected``: the tolerance
    for a kernel that writes ``dtype`` against a reference computed unrounded (or rounded step by step)."""
    return 4 * LAST_PLACE[dtype] * float(np.max(np.abs(np.asarray(expected, dtype=np.float64))))


def run_on_cpu(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """``main``'s first output for ``inputs``, built by TVM for this CPU."""
    vm = relax.VirtualMachine(relax.build(mod, tvm_compat.host_cpu_target()), tvm.cpu(0))
    result = vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu(0)) for x in inputs])
    return tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])


def operand_arrays(operands: Sequence, params: Sequence, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays a kernel's ``operands`` stand for: constants' values, and parameters' inputs (matched by name)."""
    by_name = {param.name: array for param, array in zip(params, inputs)}
    return [tvm_compat.constant_array(o) if tvm_compat.is_constant(o) else by_name[o.name] for o in operands]


def contract_problems(pm, backend_name: str, model, target=None, limit: int = 8, rtol: float = 1e-4,
                      atol: float = 1e-5) -> list[str]:
    """What a plugin's hooks do against the contract, on ``model`` (an ONNX path, a Relax IRModule or
    anything ``collage_core.optimize`` takes): one line per problem, none when all is well.

    The backend must be registered and answer availability with an ``Availability``; its pattern
    names must start with its name and a dot, and no check may raise anything but
    ``PatternRefused``; and, where it is available, the first candidate of each pattern (up to
    ``limit`` patterns) must lower, build and compute what TVM's own build of the same Relax
    computes on the CPU (within ``rtol``/``atol``), and ``collage_prepare_runtime`` must answer.
    Nothing is timed.
    """
    from collage_core.backends import contribute_patterns, discover_backends
    from collage_core.build import build
    from collage_core.model_import import load_model
    from collage_core.partition import placed_whole
    from collage_core.records import Availability
    from collage_core.worker import random_arguments

    target = tvm_compat.make_target(target)
    infos = discover_backends(pm)
    if backend_name not in infos:
        return [f"backend {backend_name!r} is not registered by any plugin (registered: {', '.join(infos) or 'none'})"]
    info = infos[backend_name]
    problems = [f"plugin {failure.name}: {failure.reason}" for failure in getattr(pm, "failures", [])]
    if not isinstance(info.availability, Availability):
        problems.append(f"collage_check_availability answered {info.availability!r}, not an Availability")
    elif not info.availability.available and "\n" in info.availability.reason:
        problems.append("the reason it is not available spans several lines; say it in one")
    patterns = contribute_patterns(pm, info.backend, target)
    problems += [f"pattern {p.name!r} does not start with {backend_name!r} and a dot"
                 for p in patterns if not p.name.startswith(f"{backend_name}.")]
    imported = load_model(model)
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    refusals: list = []
    candidates = enumerate_candidates(graph, patterns, refusals)
    problems += sorted({f"pattern {r.pattern}: {r.reason}" for r in refusals if r.broken})
    if not info.availability.available or target.kind.name != "llvm":
        return problems
    first = {}
    for candidate in candidates:
        first.setdefault(candidate.pattern, candidate)
    for pattern, candidate in list(first.items())[:limit]:
        standalone = graph.standalone_module(candidate.nodes)
        placed = placed_whole(standalone, backend_name, pattern)
        try:
            executable = build(pm, placed, {backend_name: info.backend}, target)
        except Exception as error:
            problems.append(f"pattern {pattern}: lowering or building failed: {error}")
            continue
        inputs = random_arguments(standalone["main"])
        device = tvm.cpu(0)
        result = relax.VirtualMachine(executable, device)["main"](*[tvm_compat.to_tensor(x, device) for x in inputs])
        got = tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])
        expected = run_on_cpu(standalone, inputs)
        if got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=atol):
            problems.append(f"pattern {pattern}: computes something else than TVM on operators {sorted(candidate.nodes)} "
                            f"(max abs difference {np.max(np.abs(got - expected)) if got.shape == expected.shape else 'shape'})")
    if pm.hook.collage_prepare_runtime(backend=info.backend) is None:
        problems.append("collage_prepare_runtime answered nothing for it (return True when there is nothing to prepare)")
    return problems
