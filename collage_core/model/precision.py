"""The arithmetic precision a placement runs at: converting the model once, and what each precision allows.

``fp32`` (the default) leaves the model as imported: every backend computes in float32, exactly as
the reference framework does. ``bf16`` and ``fp16`` convert the model once, before candidates are
enumerated, with TVM's mixed-precision pass (``relax.transform.ToMixedPrecision``): matrix
products and convolutions take 16-bit operands and accumulate in float32, the operators that
follow them run in 16 bits, and those that need the range (softmax, layer norm, reductions) stay
in float32. Every backend sees that same converted graph; one whose kernels cannot take a 16-bit
operand refuses the match (its pattern's check says so), and TVM runs the rest. A backend may compute
its partitions under its own 16-bit policy instead (OpenVINO: float32 arithmetic under its bf16
inference precision); verification holds every placement to the same tolerance. TVM's pass writes
float16; for bf16 the converted graph's float16 casts become bfloat16 casts (same placement of
casts, bfloat16's range).

``tf32`` (CUDA only) leaves the model in float32 and lets backends whose kernels can round float32
operands to TF32 on tensor cores (10-bit mantissa, float32 range and accumulation) contribute those
kernels as patterns of their own, named ``<backend>.<what>_tf32``
(:func:`~collage_core.model.dtypes.computes_tf32`); the exact float32 patterns still compete, so each product goes where it
measures fastest. The outputs are held to fp16's tolerance.

The model's inputs and outputs keep their dtypes, so callers are unchanged; the outputs are
compared with the float32 reference within the precision's tolerance. The precision is part of
the model's fingerprint, so every measured cost, placement file and finished build is keyed by it.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import attrs
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from collage_core import tvm_compat
from collage_core.candidates.fused_groups import as_dtype
from collage_core.errors import CollageError
from collage_core.model import widening
from collage_core.model.dtypes import BF16, DTYPES, FP16, FP32, PRECISIONS, TF32

if TYPE_CHECKING:
    from collage_core.model.model_import import ImportedModel

# Numerics tolerance per precision: |out - ref| <= atol + rtol * max|ref| against the float32 reference.
# 16-bit operands carry 8 (bf16) or 11 (fp16) significant bits and errors grow with depth: BERT-base and
# ResNet-50 measured at most 6.2e-3 of the output scale at bf16 and 7.2e-4 at fp16 (docs/precision.md), so
# these leave a margin of about eight for deeper models, while a conversion gone wrong (errors of order 1) fails.
# TF32 rounds the operands of float32 products to fp16's 10-bit mantissa and accumulates in float32: fp16's tolerance.
TOLERANCES = {FP32: (1e-3, 1e-4), TF32: (1e-2, 1e-3), BF16: (5e-2, 5e-3), FP16: (1e-2, 1e-3)}
# CPU flags (as /proc/cpuinfo names them) that give bf16 matrix arithmetic its speed.
FAST_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


class PrecisionError(CollageError):
    """A precision this target cannot honour, or one the user named that does not exist."""


@attrs.frozen
class Tolerance:
    rtol: float
    atol: float


def tolerance(precision: str) -> Tolerance:
    """The numerics tolerance outputs at ``precision`` are held to against the float32 reference."""
    rtol, atol = TOLERANCES[precision]
    return Tolerance(rtol, atol)


def tolerance_for_outputs(precision: str, expected) -> Tolerance:
    """The tolerance outputs are held to against ``expected`` (the reference's arrays): ``precision``'s, or, for a
    model that is 16-bit of its own (a float16 or bfloat16 PyTorch module, whose reference answers in 16 bits too),
    that 16-bit precision's: one unit in the last place of a bfloat16 output is 2**-8 of it."""
    if precision == FP32:
        own = {str(array.dtype) for array in expected} & {"bfloat16", "float16"}
        if own:
            return tolerance(BF16 if "bfloat16" in own else FP16)
    return tolerance(precision)


def require_known(precision: str) -> None:
    """Refuse, in one line, a precision Collage does not know."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {precision!r} (choose {', '.join(PRECISIONS)})")


# The same units as LLVM names them, for a CPU known by its target's ``mcpu`` alone (a server measured through RPC).
FAST_BF16_LLVM_FEATURES = ("amx-bf16", "avx512bf16")


def check_precision(precision: str, target, remote: bool = False) -> None:
    """Refuse, in one line, a precision the target cannot run fast (or at all); return quietly otherwise. This
    machine's CPU is judged by its flags; with ``remote``, the servers' by LLVM's table for the target's ``mcpu``."""
    require_known(precision)
    if precision == FP32:
        return

    if tvm_compat.is_cuda(target):
        return
    if precision == TF32:
        raise PrecisionError("precision tf32 on the CPU: TF32 is an NVIDIA tensor-core format; use fp32 here, or tf32 with --target cuda")
    if precision == FP16:
        raise PrecisionError(
            "precision fp16 on the CPU: no CPU backend computes float16 faster than float32 here; "
            "use bf16 on a CPU with AMX or AVX512-BF16, or fp16 with --target cuda"
        )
    if remote:
        if not tvm_compat.llvm_target_has_any_feature(target, FAST_BF16_LLVM_FEATURES):
            cpu = str(tvm_compat.make_target(target).attrs.get("mcpu", "unknown"))
            raise PrecisionError(
                f"precision bf16: the servers' CPU ({cpu}, as LLVM names it) has no fast bf16 (neither "
                f"{' nor '.join(FAST_BF16_LLVM_FEATURES)} among its features), so bf16 would run slower than fp32; use fp32"
            )
        return
    if not has_fast_bf16():
        raise PrecisionError(
            f"precision bf16: this CPU ({cpu_model()}) has no fast bf16 (neither "
            f"{' nor '.join(FAST_BF16_FLAGS)} among its flags), so bf16 would run slower than fp32; use fp32"
        )


def has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix units (one of FAST_BF16_FLAGS): where CPU backends take bfloat16."""
    flags = cpu_flags()
    return any(flag in flags for flag in FAST_BF16_FLAGS)


@functools.lru_cache(maxsize=None)
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's flags; empty where /proc/cpuinfo is not there."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def convert(mod, precision: str):
    """``mod`` (float32, ``main`` one dataflow block) at ``precision``; fp32 (and tf32) return it unchanged."""

    if precision not in DTYPES:
        return mod
    mod = relax.transform.ToMixedPrecision(out_dtype="float32")(mod)
    if precision == BF16:
        mod = _float16_to_bfloat16(mod)
    tidy = tvm.transform.Sequential(
        [relax.transform.FoldConstant(), relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination(["main"])]
    )
    # Twice: a cast of a cast of a constant (a power's exponent, cast to 16 bits by the pass and back to float32 for
    # TVM's power) is a cast of a constant only once the first is folded and its binding inlined.
    return tidy(_constant_casts_folded(tidy(_constant_casts_folded(mod))))


def _constant_casts_folded(mod):
    """``mod`` with each cast of a constant replaced by the cast constant. The pass casts the scalar constants
    of a spelt-out activation (GELU's sqrt 2, 0.5, 1) to 16 bits as operators of their own, which TVM's
    FoldConstant leaves; folded, the activation reads as the constants it applies, so kernels can fuse it."""

    @mutator
    class Folder(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if tvm_compat.op_name(call) == "relax.astype" and tvm_compat.is_constant(call.args[0]):
                dtype = str(call.attrs.dtype)
                return relax.const(as_dtype(tvm_compat.constant_array(call.args[0]), dtype), dtype)
            return call

    folder = Folder(mod)
    for global_var, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(global_var, folder.visit_expr(func))
    return folder.builder_.get()


def at_precision(imported: ImportedModel, precision: str) -> ImportedModel:
    """``imported`` (as ``load_model`` gives it) converted to ``precision``: its module and fingerprint; the
    reference unchanged. Raises when the model is already at another 16-bit precision."""
    require_known(precision)
    if precision == imported.precision:
        return imported
    if imported.precision != FP32:
        raise PrecisionError(f"{imported.name} is already at {imported.precision}")
    return attrs.evolve(
        imported, mod=convert(imported.mod, precision), precision=precision, fingerprint=fingerprint(imported.fingerprint, precision)
    )


def with_float32_units(converted, float32_units, original):
    """``converted`` (an ImportedModel at bf16 or fp16) with ``float32_units`` computing in float32, weights
    taken back from ``original`` (the same model at fp32); keyed apart from the plain conversion."""
    units = tuple(sorted(set(float32_units)))
    if not units:
        return converted
    if converted.precision not in DTYPES or converted.float32_units:
        raise PrecisionError(f"{converted.name}: units can go back to float32 only from a plain {'/'.join(DTYPES)} conversion")
    try:
        mod = widening.widen(converted.mod, units, original.mod)
    except ValueError as error:
        raise PrecisionError(f"{converted.name} at {converted.precision}: {error}") from error
    return attrs.evolve(converted, mod=mod, float32_units=units, fingerprint=f"{converted.fingerprint}+float32:{','.join(map(str, units))}")


def fingerprint(model_fingerprint: str, precision: str) -> str:
    """A model's fingerprint at ``precision``: float32's is the model's own, so its costs stay keyed as before."""
    return model_fingerprint if precision == FP32 else f"{model_fingerprint}+{precision}"


def describe(precision: str) -> Optional[str]:
    """One line for the report on what ``precision`` did to the model; None for fp32."""
    if precision == TF32:
        tol = tolerance(precision)
        return (
            f"precision tf32: float32 throughout; matrix products may round their operands to TF32 where a backend's "
            f"TF32 kernel measured fastest; numerics tolerance atol {tol.atol:g} + rtol {tol.rtol:g} x max|reference| "
            f"against the float32 reference"
        )
    if precision not in DTYPES:
        return None
    tol = tolerance(precision)
    return (
        f"precision {precision}: TVM's mixed-precision pass gave matrix products and convolutions {DTYPES[precision]} "
        f"operands accumulating in float32, softmax and normalizations stay float32; numerics tolerance "
        f"atol {tol.atol:g} + rtol {tol.rtol:g} x max|reference| against the float32 reference"
    )


# Operators TVM takes in float32 and float16 only: at bfloat16 they run in float32 between casts.
FLOAT32_AT_BFLOAT16 = ("relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.rms_norm")


def _float16_to_bfloat16(mod):
    """float16 casts become bfloat16 casts; a power on bfloat16 runs in float32 (TVM's power takes no bfloat16),
    and so do the normalizations of ``FLOAT32_AT_BFLOAT16`` (their type inference refuses bfloat16)."""

    @relax.expr_functor.mutator
    class Retype(relax.expr_functor.PyExprMutator):
        def visit_call_(self, call):
            if tvm_compat.op_name(call) in FLOAT32_AT_BFLOAT16:
                args = [self.builder_.normalize(self.visit_expr(arg)) for arg in call.args]
                if "bfloat16" not in {tvm_compat.tensor_shape_dtype(arg)[1] for arg in args}:
                    return tvm_compat.call_with_args(call, args)
                widened = [relax.op.astype(arg, "float32") if tvm_compat.tensor_shape_dtype(arg)[1] == "bfloat16" else arg for arg in args]
                return relax.op.astype(tvm_compat.call_with_args(call, widened), "bfloat16")
            call = super().visit_call_(call)
            name = tvm_compat.op_name(call)
            if name == "relax.astype" and str(call.attrs.dtype) == "float16":
                return relax.op.astype(call.args[0], "bfloat16")
            if name == "relax.power":
                base, exponent = (self.builder_.normalize(arg) for arg in call.args)
                if "bfloat16" in (tvm_compat.tensor_shape_dtype(base)[1], tvm_compat.tensor_shape_dtype(exponent)[1]):
                    widened = relax.op.power(relax.op.astype(base, "float32"), relax.op.astype(exponent, "float32"))
                    return relax.op.astype(widened, "bfloat16")
            return call

    mod["main"] = Retype(mod).visit_expr(mod["main"])  # the mixed-precision pass's own copy: safe to update
    return mod
