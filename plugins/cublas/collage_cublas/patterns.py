"""The cuBLAS backend's patterns: matrix products and the epilogues cuBLASLt fuses, named ``cublas.<what>``.

The dataflow patterns only shape the search; every match is then read by
:func:`collage_cublas.specs.recognize`, which refuses what cuBLASLt would compute differently.
"""

from __future__ import annotations

import functools

from tvm.relax.dpl import is_const, is_op, wildcard

from collage_core.kit import (
    BF16X6_PATTERN_SUFFIX,
    TF32_PATTERN_SUFFIX,
    Pattern,
    cast_pattern,
    product_epilogues,
    recognizer_check,
    scale_pattern,
)
from collage_cublas import specs

BACKEND = "cublas"


def _transposed(_):
    return is_op("relax.permute_dims")(wildcard())


def _plain(_):
    return wildcard()


OPERAND_FORMS = {"n": _plain, "t": _transposed}  # operand read as it is, or through a permute_dims
DENSE_EPILOGUES = product_epilogues(["relu", "gelu_tanh"], widened_residual=True, reshaped_residual=True)
BATCH_MATMUL_EPILOGUES = {"": lambda v: v, "_scale": scale_pattern}


_check = recognizer_check(specs.recognize)
_check_tf32 = recognizer_check(functools.partial(specs.recognize, tf32=True))
_check_bf16x6 = recognizer_check(functools.partial(specs.recognize, bf16x6=True))


def _maybe_cast(product):
    """The product, or (16-bit operands, as `--precision bf16|fp16` writes them) its float32 result cast to
    16 bits: the kernel then writes 16 bits and the epilogue after the cast is the same."""
    return product | cast_pattern(product)


def patterns(tf32: bool = False, bf16x6: bool = False) -> list[Pattern]:
    """The exact patterns; with ``tf32`` also each float32 one again as ``<name>_tf32``, run on TF32 tensor cores;
    with ``bf16x6`` each dense one reading its input as it lies again as ``<name>_bf16x6``, a float32 product run as
    six bfloat16 ones (:mod:`collage_core.kit.bf16_split`): float32's accuracy within a small factor, on the tensor cores."""
    found = []

    def add(name, dpl, split=False):
        found.append(Pattern(f"{BACKEND}.{name}", dpl, check=_check))
        if tf32:
            found.append(Pattern(f"{BACKEND}.{name}{TF32_PATTERN_SUFFIX}", dpl, check=_check_tf32))
        if split:
            found.append(Pattern(f"{BACKEND}.{name}{BF16X6_PATTERN_SUFFIX}", dpl, check=_check_bf16x6))

    for lhs_form, lhs in OPERAND_FORMS.items():
        dense = _maybe_cast(is_op("relax.matmul")(lhs(None), is_const()))
        for suffix, epilogue in DENSE_EPILOGUES.items():
            add(f"dense{'_t' if lhs_form == 't' else ''}{suffix}", epilogue(dense), split=bf16x6 and lhs_form == "n")
        for rhs_form, rhs in OPERAND_FORMS.items():
            batch = _maybe_cast(is_op("relax.matmul")(lhs(None), rhs(None)))
            forms = "" if lhs_form + rhs_form == "nn" else f"_{lhs_form}{rhs_form}"
            for suffix, epilogue in BATCH_MATMUL_EPILOGUES.items():
                add(f"batch_matmul{forms}{suffix}", epilogue(batch))
    return found
