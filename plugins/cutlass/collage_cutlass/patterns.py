"""The CUTLASS backend's patterns: 16-bit matrix products and 2-d convolutions and the epilogues its kernels fuse,
named ``cutlass.<what>`` (at ``--precision tf32``, the same of float32 operands on TF32 tensor cores, ``cutlass.<what>_tf32``).

The dataflow patterns only shape the search; every match is then read by
:func:`collage_cutlass.specs.recognize`, which refuses what the kernels would compute differently
(float32 operands, strides Hopper's TMA cannot load).
"""

from __future__ import annotations

import functools

from tvm.relax.dpl import is_const, is_op, wildcard

from collage_core.kit import TF32_PATTERN_SUFFIX, Pattern, cast_pattern, product_epilogues, recognizer_check, scale_pattern
from collage_cutlass import specs

BACKEND = "cutlass"
OPERAND_FORMS = {"n": lambda: wildcard(), "t": lambda: is_op("relax.permute_dims")(wildcard())}
DENSE_EPILOGUES = product_epilogues(["relu", "gelu_erf", "gelu_tanh", "silu"])
BATCH_MATMUL_EPILOGUES = {"": lambda v: v, "_scale": scale_pattern}
# A convolution's output keeps its channel axis: no reshapes; the activations CNNs use.
CONV2D_EPILOGUES = {name: epilogue for name, epilogue in product_epilogues(["relu", "silu"]).items() if "_reshape" not in name}

_check = recognizer_check(specs.recognize)
_check_tf32 = recognizer_check(functools.partial(specs.recognize, tf32=True))


def _maybe_cast(product):
    """The product, or its float32 result cast to 16 bits (as `--precision bf16|fp16` writes it): the kernel writes 16 bits."""
    return product | cast_pattern(product)


def patterns(tf32: bool = False) -> list[Pattern]:
    """The 16-bit patterns, or with ``tf32`` the float32 ones on TF32 tensor cores (the model is not converted then)."""
    found = []

    def add(name, dpl):
        if tf32:
            found.append(Pattern(f"{BACKEND}.{name}{TF32_PATTERN_SUFFIX}", dpl, check=_check_tf32))
        else:
            found.append(Pattern(f"{BACKEND}.{name}", dpl, check=_check))

    for lhs_form, lhs in OPERAND_FORMS.items():
        dense = _maybe_cast(is_op("relax.matmul")(lhs(), is_const()))
        for suffix, epilogue in DENSE_EPILOGUES.items():
            add(f"dense{'_t' if lhs_form == 't' else ''}{suffix}", epilogue(dense))
        for rhs_form, rhs in OPERAND_FORMS.items():
            batch = _maybe_cast(is_op("relax.matmul")(lhs(), rhs()))
            forms = "" if lhs_form + rhs_form == "nn" else f"_{lhs_form}{rhs_form}"
            for suffix, epilogue in BATCH_MATMUL_EPILOGUES.items():
                add(f"batch_matmul{forms}{suffix}", epilogue(batch))
    conv = _maybe_cast(is_op("relax.nn.conv2d")(wildcard(), is_const()))
    for suffix, epilogue in CONV2D_EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv))
    return found
