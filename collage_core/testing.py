"""Helpers for backend plugins' tests: small Relax functions, the candidate a pattern makes of them, TVM's own answer.

A plugin's pattern test builds a function its pattern should cover whole (``function_module``),
finds that candidate (``whole_candidate``), and compares what its kernel computes with what TVM's
build of the same Relax computes on the CPU (``run_on_cpu``); ``operand_arrays`` gives the arrays a
kernel's operands stand for. ``contract_problems`` runs a plugin's hooks against the contract on
a model (its kernels built, run, and timed beside TVM's) and says, one line each, what is wrong.
``product_case`` builds the function a GPU backend's product pattern covers, from the pattern's name.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.backends import contribute_patterns, discover_backends
from collage_core.build.executable import BuildError, _last_line, lower_partitions, partitions_by_backend
from collage_core.build.partition import placed_whole
from collage_core.build.plugin_calls import counting_calls, outside_calls
from collage_core.candidates.enumeration import enumerate_candidates
from collage_core.candidates.fused_groups import as_dtype
from collage_core.measure.contention import confirmed_contention, parallel_tvm_kernel, times_beside_tvm
from collage_core.measure.worker import random_arguments
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import call_each, first_result
from collage_core.records import Availability, Candidate, Pattern


def function_module(make: Callable[..., relax.Expr], *shapes: Sequence[int], dtype: str = "float32") -> tvm.IRModule:
    """A module whose ``main`` takes tensors ``x0, x1, ...`` of ``shapes`` (all of ``dtype``) and returns
    ``make(bb, x0, x1, ...)``.

    ``make`` is called inside ``main``'s dataflow block with its ``relax.BlockBuilder`` and the parameters; it
    emits the calls it needs (``bb.emit(...)``) and returns the output's expression, which is emitted as
    the block's output.
    """
    params = [relax.Var(f"x{i}", relax.TensorType(shape, dtype)) for i, shape in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            output = bb.emit_output(make(bb, *params))
        bb.emit_func_output(output)
    return bb.get()


class WholeCandidate(NamedTuple):
    """What :func:`whole_candidate` finds: the graph of ``main``, and the candidate covering all of it (None
    when the pattern makes none). A pair, so ``graph, candidate = whole_candidate(...)`` reads it too."""

    graph: RelaxGraph
    candidate: Optional[Candidate]


def whole_candidate(mod: tvm.IRModule, patterns: Sequence[Pattern], pattern_name: str) -> WholeCandidate:
    """The candidate of ``pattern_name`` (one of ``patterns``) covering every operator of ``mod``'s ``main``.

    ``partition_module(found.graph, [found.candidate])`` places it whole on its backend, as a model with that
    one partition, for ``build``.
    """
    graph = RelaxGraph.from_function(mod["main"])
    everything = frozenset(range(len(graph.graph)))
    found = [c for c in enumerate_candidates(graph, patterns) if c.pattern == pattern_name and frozenset(c.nodes) == everything]
    return WholeCandidate(graph, found[0] if found else None)


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


def tf32_atol(k: int, scale: float = 1.0) -> float:
    """The tolerance for a sum of ``k`` products of float32 operands of magnitude at most ``scale`` each (their
    product's magnitude at most ``scale``), computed on tensor cores that round each operand to TF32 (10
    mantissa bits, truncated at worst: each product off by at most 2 * 2**-10 of its magnitude)."""
    return 2 * 2.0**-10 * k * scale


# What an exact float32 product of a few dozen terms in [-1, 1] errs by at most, against float64: a
# TF32 kernel that errs by less did not round its operands.
EXACT_FLOAT32_ATOL = 1e-5


def cuda_source(module) -> str:
    """The CUDA code TVM generated for a built library (``executable.mod``) and what it imports, joined: a CUDA
    build is checked here by its code, without a GPU."""
    found, stack = [], [module]
    while stack:
        current = stack.pop()
        if current.kind == "cuda":
            found.append(current.inspect_source())
        stack.extend(current.imports)
    return "\n".join(found)


def run_on_cpu(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """``main``'s first output for ``inputs``, built by TVM for this CPU."""
    vm = relax.VirtualMachine(relax.build(mod, tvm_compat.host_cpu_target()), tvm.cpu(0))
    result = vm["main"](*[tvm_compat.to_tensor(x, tvm.cpu(0)) for x in inputs])
    return tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])


def inputs_and_answer(standalone: tvm.IRModule, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """Random inputs in [-1, 1) for ``main``'s parameters (rounded to their dtypes), and what TVM's CPU build of
    ``standalone`` answers for them, in float64: what a kernel's numpy reference of the same operators is held to."""
    inputs = [
        rounded_to(rng.uniform(-1, 1, size=shape).astype("float32"), dtype)
        for shape, dtype in map(tvm_compat.tensor_shape_dtype, standalone["main"].params)
    ]
    return inputs, run_on_cpu(standalone, inputs).astype(np.float64)


def assert_matches(got: np.ndarray, expected: np.ndarray, out_dtype: str, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """``got`` equals ``expected`` within ``rtol`` and ``atol`` for a float32 result, and within a few units in the
    last place (``sixteen_bit_atol``) for a 16-bit one: TVM's build rounds after each step."""
    if out_dtype == "float32":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=sixteen_bit_atol(expected, out_dtype))


def operand_arrays(operands: Sequence[relax.Expr], params: Sequence[relax.Var], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays a kernel's ``operands`` stand for: constants' values, and parameters' inputs (matched by name)."""
    by_name = {param.name: array for param, array in zip(params, inputs)}
    return [tvm_compat.constant_array(o) if tvm_compat.is_constant(o) else by_name[o.name] for o in operands]


def contract_problems(
    pm, backend_name: str, model, target=None, limit: int = 8, rtol: float = 1e-4, atol: float = 1e-5, timed: bool = True
) -> list[str]:
    """What a plugin's hooks do against the contract, on ``model`` (an ONNX path, a Relax IRModule or
    anything ``collage_core.optimize`` takes): one line per problem, none when all is well.

    The backend must be registered and answer availability with an ``Availability`` (a reason in one
    line); its pattern names must start with its name and a dot. A check may only take a match or
    refuse it (``False``, or ``PatternRefused`` with a reason in one line): any other exception is a
    broken check. Where the backend is available on a CPU target, the first candidate of each pattern
    (up to ``limit`` patterns) is placed whole on it, and:

    - its lowering must take what the check took (a lowering that raises should have refused in the
      check, where ``collage inspect`` shows the reason), saying why in one line if it fails;
    - the lowered partition must call the plugin's own code (a packed function it registers, or an
      external function of a ``Codegen``), not stay plain Relax that TVM compiles with its own kernels,
      unless the backend says TVM compiles its partitions (``collage_runtime_libraries`` answers ``[]``);
    - it must build, and running it must call each packed function the partition calls (counted
      through wrappers registered under their names) and compute what TVM's own build of the same
      Relax computes on the CPU (within ``rtol``/``atol``);
    - with ``timed``, a run right after a parallel kernel of TVM's must not be many times slower than
      a run alone (:mod:`collage_core.measure.contention`: the two pools spinning for the same cores).

    Last, ``collage_prepare_runtime`` must answer.
    """
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
    problems += [
        f"pattern {p.name!r} does not start with {backend_name!r} and a dot" for p in patterns if not p.name.startswith(f"{backend_name}.")
    ]
    imported = load_model(model)
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    refusals: list = []
    candidates = enumerate_candidates(graph, patterns, refusals)
    problems += sorted({f"pattern {r.pattern}: {r.reason}" for r in refusals if r.broken})
    problems += _refusal_reason_problems(refusals)
    if not info.availability.available or target.kind.name != "llvm":
        return problems
    first = {}
    for candidate in candidates:
        first.setdefault(candidate.pattern, candidate)
    run_tvm_kernel = parallel_tvm_kernel(target) if timed and first else None
    for pattern, candidate in list(first.items())[:limit]:
        found = _candidate_problems(pm, info.backend, graph, candidate, target, rtol, atol, run_tvm_kernel)
        problems += [f"pattern {pattern}: {problem}" for problem in found]
    if pm.hook.collage_prepare_runtime(backend=info.backend) is None:
        problems.append("collage_prepare_runtime answered nothing for it (return True when there is nothing to prepare)")
    return problems


def _refusal_reason_problems(refusals) -> list[str]:
    """One line per pattern whose check refuses with an empty reason or one of several lines (``collage
    inspect`` and the closing summary show a reason as one line)."""
    problems = set()
    for refusal in refusals:
        if refusal.broken:
            continue
        if not refusal.reason.strip():
            problems.add(f"pattern {refusal.pattern}: its check refuses with an empty reason; say why")
        elif "\n" in refusal.reason.strip():
            first_line = refusal.reason.strip().splitlines()[0]
            problems.add(f"pattern {refusal.pattern}: its check refuses with a reason of several lines ({first_line!r} ...); say it in one")
    return sorted(problems)


def _candidate_problems(pm, backend, graph, candidate, target, rtol, atol, run_tvm_kernel) -> list[str]:
    """What is wrong with ``candidate`` placed whole on ``backend``: lowered, built, run and (with
    ``run_tvm_kernel``) timed beside TVM's pool; see :func:`contract_problems`."""
    operators = sorted(candidate.nodes)
    standalone = graph.standalone_module(candidate.nodes)
    placed = placed_whole(standalone, backend.name, candidate.pattern)
    try:
        lowered = lower_partitions(pm, placed, {backend.name: backend}, target)
    except BuildError as error:
        refused = (
            f"its check took operators {operators} but the lowering refused them ({error}); refuse in the "
            "check with PatternRefused, whose reason collage inspect shows"
        )
        return [refused, *_multiline_lowering_errors(pm, backend, placed, target)]
    except Exception as error:
        return [f"TVM's codegen failed on what the lowering returned: {type(error).__name__}: {_last_line(error)}"]
    own_calls = outside_calls(lowered) - outside_calls(placed)
    if not own_calls and not _compiled_by_tvm(pm, backend):
        (name,) = partitions_by_backend(placed)[backend.name]
        unchanged = name in lowered and tvm_compat.structural_equal(lowered[name], placed[name])
        left = "left the partition as it was" if unchanged else "left the partition plain Relax"
        return [
            f"the lowering {left}: TVM compiles it with its own kernels and the plugin's code never runs (call a "
            "packed function the plugin registers, or give the partition a Codegen attribute)"
        ]
    try:
        executable = relax.build(lowered, target)
    except Exception as error:
        return [f"TVM cannot build what the lowering returned: {type(error).__name__}: {_last_line(error)}"]
    inputs = random_arguments(standalone["main"])
    device = tvm.cpu(0)
    tensors = [tvm_compat.to_tensor(x, device) for x in inputs]
    try:
        with counting_calls(own_calls) as calls:
            result = relax.VirtualMachine(executable, device)["main"](*tensors)
    except Exception as error:
        return [f"running the built partition failed: {type(error).__name__}: {_last_line(error)}"]
    problems = [f"the built partition never called {name} when it ran" for name, count in sorted(calls.items()) if not count]
    got = tvm_compat.to_numpy(result if hasattr(result, "numpy") else result[0])
    expected = run_on_cpu(standalone, inputs)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=atol):
        problems.append(
            f"computes something else than TVM on operators {operators} "
            f"(max abs difference {np.max(np.abs(got - expected)) if got.shape == expected.shape else 'shape'})"
        )
    if run_tvm_kernel is not None:
        main = relax.VirtualMachine(executable, device)["main"]
        found = confirmed_contention(lambda: times_beside_tvm(lambda: main(*tensors), run_tvm_kernel))
        if found:
            problems.append(found)
    return problems


def _multiline_lowering_errors(pm, backend, placed, target) -> list[str]:
    """A line for each plugin whose ``collage_lower_partitions`` raised a message of several lines: the
    core shows only the last one."""
    names = partitions_by_backend(placed)[backend.name]
    return [
        f"the lowering's error spans several lines and Collage shows only the last; say it in one ({error.splitlines()[0]!r} ...)"
        for _, _, error in call_each(pm.hook.collage_lower_partitions, backend=backend, mod=placed, function_names=names, target=target)
        if error and "\n" in error.strip()
    ]


def _compiled_by_tvm(pm, backend) -> bool:
    """Whether the backend says TVM compiles its partitions into the library itself (``collage_runtime_libraries``
    answers an empty list), as TVM's own backend does."""
    libraries, _ = first_result(pm.hook.collage_runtime_libraries, backend=backend)
    return libraries is not None and len(libraries) == 0


# Product cases shared by the GPU backends' pattern tests --------------------------------------------------

R = relax.op
F = "float32"


def _const(rng, *shape, dtype=F):
    return relax.const(rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype))


def _scalar(value: float, dtype: str):
    return relax.const(rounded_to(np.array(value, dtype=F), dtype), dtype)


def _gelu_erf_spelt_out(bb, x, dtype=F):
    """erf GELU as BERT's exporters write it: x * (erf(x / sqrt2) + 1) * 0.5 (constants in ``dtype``, as the
    mixed-precision pass leaves them)."""
    erf = bb.emit(R.erf(bb.emit(R.divide(x, _scalar(math.sqrt(2.0), dtype)))))
    return R.multiply(bb.emit(R.multiply(x, bb.emit(R.add(erf, _scalar(1.0, dtype))))), _scalar(0.5, dtype))


def _gelu_tanh_spelt_out(bb, x, dtype=F):
    """tanh GELU as GPT-2's exporters write it; at 16 bits the cube is computed in float32 between two casts, as
    TVM's mixed-precision pass leaves it."""
    if dtype == F:
        power = bb.emit(R.power(x, _scalar(3.0, dtype)))
    else:
        power = bb.emit(R.astype(bb.emit(R.power(bb.emit(R.astype(x, F)), _scalar(3.0, F))), dtype))
    cube = bb.emit(R.multiply(power, _scalar(0.044715, dtype)))
    inner = bb.emit(R.multiply(bb.emit(R.add(x, cube)), _scalar(math.sqrt(2 / math.pi), dtype)))
    one = bb.emit(R.add(bb.emit(R.tanh(inner)), _scalar(1.0, dtype)))
    return R.multiply(bb.emit(R.multiply(x, _scalar(0.5, dtype))), one)


def widened_residual_case(pattern_name: str, dtype: str, seed: int = 0) -> tvm.IRModule:
    """A module a ``dense[_bias][_reshape]_f32_add`` pattern covers whole, written as ``--precision bf16|fp16``
    converts GPT-2's projections: ``x`` (16 x 24, ``dtype``) times a constant, accumulated in float32 and cast to
    ``dtype``, [plus a bias,] [reshaped to 1 x 16 x 40,] cast back to float32 and added to ``residual``, a float32
    parameter (the residual stream the mixed-precision pass keeps in float32)."""
    rng = np.random.default_rng(seed)
    parts = pattern_name.split("_")
    out_shape = (1, 16, 40) if "reshape" in parts else (16, 40)
    x = relax.Var("x", relax.TensorType((16, 24), dtype))
    residual = relax.Var("residual", relax.TensorType(out_shape, F))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, residual]):
        with bb.dataflow():
            v = bb.emit(R.astype(bb.emit(R.matmul(x, _const(rng, 24, 40, dtype=dtype), out_dtype=F)), dtype))
            if "bias" in parts:
                v = bb.emit(R.add(v, _const(rng, 40, dtype=dtype)))
            if "reshape" in parts:
                v = bb.emit(R.reshape(v, out_shape))
            output = bb.emit_output(R.add(bb.emit(R.astype(v, F)), residual))
        bb.emit_func_output(output)
    return bb.get()


def product_case(pattern_name: str, seed: int = 0, cast_to: str = F) -> tuple[Callable[..., relax.Expr], list[tuple[int, ...]]]:
    """``(make(bb, *params), param shapes)`` for a function a product pattern ``<backend>.<pattern_name>`` covers
    whole, its name read as :func:`~collage_core.candidates.fused_groups.product_epilogues` and the GPU backends write
    it: ``dense[_t][_bias][_add][_reshape][_relu|_gelu|_gelu_erf|_silu]`` (``_gelu`` is tanh GELU), with
    ``_reshape_add`` the reshape before the residual add, or
    ``batch_matmul[_nn|_nt|_tn|_tt][_scale]``. Every stride is a multiple of 8 elements (what Hopper's TMA loads).

    With ``cast_to`` a 16-bit type, it is written the way `--precision bf16|fp16` converts a model: parameters
    and constants of that type, the product accumulating in float32 and cast to 16 bits before the epilogue.
    """
    rng = np.random.default_rng(seed)
    parts = pattern_name.split("_")

    def product(bb, lhs, rhs):
        if cast_to == F:
            return bb.emit(R.matmul(lhs, rhs))
        return bb.emit(R.astype(bb.emit(R.matmul(lhs, rhs, out_dtype=F)), cast_to))

    if parts[0] == "dense":
        transposed = "t" in parts
        m_shape, k, n = (2, 8), 24, 40
        shapes = [(k, 16)] if transposed else [(*m_shape, k)]
        out_shape = (16, n) if transposed else (*m_shape, n)
        reshaped_residual = "reshape_add" in pattern_name  # reshaped first, then added (GPT-2's projections at float32)
        reshaped_shape = (1, math.prod(out_shape[:-1]), n)
        if "add" in parts:
            shapes.append(reshaped_shape if reshaped_residual else out_shape)

        def make(bb, x, *rest):
            if transposed:
                x = bb.emit(R.permute_dims(x, [1, 0]))
            v = product(bb, x, _const(rng, k, n, dtype=cast_to))
            if "bias" in parts:
                v = bb.emit(R.add(_const(rng, n, dtype=cast_to), v))
            if "add" in parts and not reshaped_residual:
                v = bb.emit(R.add(v, rest[0]))
            if "reshape" in parts:
                v = bb.emit(R.reshape(v, reshaped_shape))
            if reshaped_residual:
                v = bb.emit(R.add(v, rest[0]))
            if "relu" in parts:
                v = bb.emit(R.nn.relu(v))
            if "gelu" in parts:
                v = bb.emit(_gelu_erf_spelt_out(bb, v, cast_to) if "erf" in parts else _gelu_tanh_spelt_out(bb, v, cast_to))
            if "silu" in parts:
                v = bb.emit(R.multiply(v, bb.emit(R.sigmoid(v))))
            return v

        return make, shapes
    forms = next((p for p in parts[2:] if p in ("nn", "nt", "tn", "tt")), "nn")
    batch, heads, m, k, n = 2, 3, 16, 8, 16
    lhs_shape = (batch, m, heads, k) if forms[0] == "t" else (batch, heads, m, k)
    rhs_shape = (batch, n, heads, k) if forms[1] == "t" else (batch, heads, k, n)

    def make(bb, lhs, rhs):
        if forms[0] == "t":
            lhs = bb.emit(R.permute_dims(lhs, [0, 2, 1, 3]))  # a head split read in place
        if forms[1] == "t":
            rhs = bb.emit(R.permute_dims(rhs, [0, 2, 3, 1]))  # K^T of a head split
        v = product(bb, lhs, rhs)
        if "scale" in parts:
            v = bb.emit(R.multiply(v, relax.const(0.125, cast_to)))
        return v

    return make, [lhs_shape, rhs_shape]
