"""The DNNL backend's patterns: each operator group a kernel computes, named ``dnnl.<what>``.

The dataflow patterns only shape the search; every match is then read by
:func:`collage_dnnl.specs.recognize`, which refuses what the kernels cannot compute exactly.
"""

from __future__ import annotations

from tvm.relax.dpl import is_const, is_op, wildcard

from collage_core.kit import Pattern, recognizer_check
from collage_dnnl import specs

BACKEND = "dnnl"


def _either(op: str, value, other):
    return is_op(op)(value, other) | is_op(op)(other, value)


def _bias(value):
    return _either("relax.add", value, is_const())


def _residual(value):
    return _either("relax.add", value, wildcard())


def _relu(value):
    return is_op("relax.nn.relu")(value)


def _gelu(value):
    """TVM's gelu, or erf GELU as ONNX exporters spell it: x * (erf(x / sqrt2) + 1) * 0.5."""
    erf = is_op("relax.erf")(is_op("relax.divide")(value, is_const()))
    product = _either("relax.multiply", value, _either("relax.add", erf, is_const()))
    return is_op("relax.nn.gelu")(value) | _either("relax.multiply", product, is_const())


def _scale(value):
    return _either("relax.multiply", value, is_const())


def _transposed(_):
    return is_op("relax.permute_dims")(wildcard())


def _plain(_):
    return wildcard()


CONV2D_EPILOGUES = {
    "": lambda v: v,
    "_relu": _relu,
    "_bias": _bias,
    "_bias_relu": lambda v: _relu(_bias(v)),
    "_bias_add": lambda v: _residual(_bias(v)),
    "_bias_add_relu": lambda v: _relu(_residual(_bias(v))),
}
DENSE_EPILOGUES = {
    "": lambda v: v,
    "_relu": _relu,
    "_gelu": _gelu,
    "_bias": _bias,
    "_bias_relu": lambda v: _relu(_bias(v)),
    "_bias_gelu": lambda v: _gelu(_bias(v)),
    "_bias_add": lambda v: _residual(_bias(v)),
}
BATCH_MATMUL_EPILOGUES = {"": lambda v: v, "_scale": _scale}
OPERAND_FORMS = {"n": _plain, "t": _transposed}  # operand read as it is, or through a permute_dims


_check = recognizer_check(specs.recognize)


def patterns() -> list[Pattern]:
    found = []

    def add(name, dpl):
        found.append(Pattern(f"{BACKEND}.{name}", dpl, check=_check))

    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    for suffix, epilogue in CONV2D_EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv))
    for lhs_form, lhs in OPERAND_FORMS.items():
        dense = is_op("relax.matmul")(lhs(None), is_const())
        for suffix, epilogue in DENSE_EPILOGUES.items():
            add(f"dense{'_t' if lhs_form == 't' else ''}{suffix}", epilogue(dense))
        for rhs_form, rhs in OPERAND_FORMS.items():
            batch = is_op("relax.matmul")(lhs(None), rhs(None))
            forms = "" if lhs_form + rhs_form == "nn" else f"_{lhs_form}{rhs_form}"
            for suffix, epilogue in BATCH_MATMUL_EPILOGUES.items():
                add(f"batch_matmul{forms}{suffix}", epilogue(batch))
    add("max_pool2d", is_op("relax.nn.max_pool2d")(wildcard()))
    add("avg_pool2d", is_op("relax.nn.avg_pool2d")(wildcard()))
    add("softmax", is_op("relax.nn.softmax")(wildcard()))
    add("layer_norm", is_op("relax.nn.layer_norm")(wildcard(), wildcard(), wildcard()))
    return found
