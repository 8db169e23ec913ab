"""The cuDNN backend's patterns: convolutions and matrix products with the epilogues cuDNN fuses, named ``cudnn.<what>``.

The dataflow patterns only shape the search; every match is then read by
:func:`collage_cudnn.specs.recognize`, which refuses what cuDNN would compute differently.
"""

from __future__ import annotations

from tvm.relax.dpl import is_const, is_op, wildcard

from collage_core import tvm_compat
from collage_core.fused_groups import Group, Refused, activation_pattern, bias_pattern, residual_pattern
from collage_core.records import Pattern
from collage_cudnn import specs

BACKEND = "cudnn"
ACTIVATIONS = ("relu", "gelu_erf", "gelu_tanh", "silu")


def _act(value):
    return activation_pattern(value, ACTIVATIONS)


EPILOGUES = {
    "": lambda v: v,
    "_act": _act,
    "_bias": bias_pattern,
    "_bias_act": lambda v: _act(bias_pattern(v)),
    "_bias_add": lambda v: residual_pattern(bias_pattern(v)),
    "_bias_add_act": lambda v: _act(residual_pattern(bias_pattern(v))),
}
OPERAND_FORMS = {"n": lambda: wildcard(), "t": lambda: is_op("relax.permute_dims")(wildcard())}


def _check(match) -> bool:
    matmuls = [call for call in match.calls if tvm_compat.op_name(call) == "relax.matmul"]
    if ".batch_matmul" in match.pattern.name and any(tvm_compat.is_constant(arg) for call in matmuls for arg in call.args):
        return False  # a constant right operand is the dense patterns' match
    try:
        specs.recognize(Group.from_match(match))
    except Refused:
        return False
    return True


def patterns() -> list[Pattern]:
    found = []

    def add(name, dpl):
        found.append(Pattern(f"{BACKEND}.{name}", dpl, check=_check))

    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    for suffix, epilogue in EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv))
    for lhs_form, lhs in OPERAND_FORMS.items():
        dense = is_op("relax.matmul")(lhs(), is_const())
        for suffix, epilogue in EPILOGUES.items():
            add(f"dense{'_t' if lhs_form == 't' else ''}{suffix}", epilogue(dense))
        for rhs_form, rhs in OPERAND_FORMS.items():
            forms = "" if lhs_form + rhs_form == "nn" else f"_{lhs_form}{rhs_form}"
            add(f"batch_matmul{forms}", is_op("relax.matmul")(lhs(), rhs()))
    return found
