"""Small integer powers as multiplications in TVM's partitions.

TVM compiles its CUDA kernels with NVRTC's ``--use_fast_math``, under which ``powf(x, y)`` becomes
``exp2(y * log2(x))``: NaN for every negative ``x``. GPT-2's tanh GELU computes ``x + 0.044715 * x**3``
on activations of both signs, so on CUDA TVM's own build of it outputs NaN everywhere. ``x**2``,
``x**3`` and ``x**4`` as ``x * x ...`` are exact on every device and cheaper than a power.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from collage_core.kit import tvm_compat

EXPONENTS = (2, 3, 4)


def _integer_exponent(constant) -> int | None:
    values = tvm_compat.constant_array(constant)
    if values is None or values.size != 1:
        return None
    value = float(values.reshape(-1)[0])
    return int(value) if value in EXPONENTS else None


def _keeps_type(call, base) -> bool:
    """Whether ``base`` has the power's shape and dtype (a constant of more dimensions would broadcast it)."""
    try:
        return tvm_compat.tensor_shape_dtype(base) == tvm_compat.tensor_shape_dtype(call)
    except ValueError:
        return False


def as_multiplications(func: relax.Function) -> relax.Function:
    """``func`` with every ``power(x, c)`` whose scalar constant ``c`` is 2, 3 or 4 written as products of ``x``."""
    base, exponent = wildcard(), is_const()

    def multiply_out(call, matches):
        times = _integer_exponent(matches[exponent])
        if times is None or not _keeps_type(call, matches[base]):
            return call
        product = matches[base]
        for _ in range(times - 1):
            product = relax.op.multiply(product, matches[base])
        return product

    return rewrite_call(is_op("relax.power")(base, exponent), multiply_out, func)
