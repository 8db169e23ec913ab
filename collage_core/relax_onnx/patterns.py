"""One checked pattern per operator the ONNX converter reproduces, for any backend that runs ONNX.

Each pattern matches one operator call on wildcards; its check asks
:func:`collage_core.relax_onnx.support.refusal` (and the backend's own refusal, if it has one), so
an operator the converter or the backend would compute differently never becomes a candidate.
"""

from __future__ import annotations

from typing import Callable, Optional

from tvm.relax.dpl import is_op, wildcard

from collage_core.records import Pattern, PatternRefused
from collage_core.relax_onnx import support

# How many arguments each operator's calls have, where not one. (TVM 0.27's matcher fails on
# ``varg_default_wildcard`` when a call has more arguments than its pattern, so each count is spelt out.)
ARGUMENT_COUNTS = {
    **{op: (2,) for op in support.BINARY_NUMERIC + support.BINARY_FLOAT + support.COMPARISONS},
    **{op: (2,) for op in ("relax.nn.conv2d", "relax.matmul", "relax.reshape", "relax.broadcast_to", "relax.take", "relax.image.resize2d")},
    **{op: (3,) for op in ("relax.clip", "relax.nn.layer_norm", "relax.where")},
    "relax.strided_slice": (4, 5),  # data, axes, begin, end, and strides unless all are 1
}

# A backend's own reason to refuse a call the converter accepts (None when it takes it).
BackendRefusal = Callable[[object], Optional[str]]


def operator_pattern(op_name: str):
    """``op_name`` called on wildcards, for each argument count its calls may have."""
    alternatives = [is_op(op_name)(*[wildcard() for _ in range(count)]) for count in ARGUMENT_COUNTS.get(op_name, (1,))]
    pattern = alternatives[0]
    for alternative in alternatives[1:]:
        pattern = pattern | alternative
    return pattern


def pattern_name(backend: str, op_name: str) -> str:
    """(``onnxruntime``, ``relax.nn.conv2d``) -> ``onnxruntime.conv2d``."""
    return f"{backend}.{op_name.rsplit('.', 1)[1]}"


def refusal(call, backend_refusal: Optional[BackendRefusal] = None, sixteen_bit: frozenset = frozenset()) -> Optional[str]:
    """Why ``call`` is refused: by the converter (taking ``sixteen_bit`` types besides float32), else by the
    backend; None when both take it."""
    return support.refusal(call, sixteen_bit) or (backend_refusal(call) if backend_refusal is not None else None)


def operator_patterns(
    backend: str, backend_refusal: Optional[BackendRefusal] = None, sixteen_bit: frozenset = frozenset()
) -> list[Pattern]:
    """One pattern per convertible operator, named ``<backend>.<operator>``, checked by
    :func:`refusal` with ``backend_refusal`` and ``sixteen_bit``."""

    def check(match) -> bool:
        reason = refusal(match.root, backend_refusal, sixteen_bit)
        if reason is not None:
            raise PatternRefused(reason)
        return True

    return [Pattern(pattern_name(backend, op), operator_pattern(op), check=check) for op in support.SUPPORTED_OPS]
