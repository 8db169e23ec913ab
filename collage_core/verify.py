"""Comparing a build's outputs with the reference framework's, within a stated tolerance."""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-4


@attrs.frozen
class Verification:
    """Outcome of one numerics check: the worst errors and the tolerance they were held to.

    An output passes when every element satisfies ``|out - ref| <= atol + rtol * max|ref|``
    (relative to the output's largest magnitude, so near-zero elements do not dominate).
    """

    reference: str
    passed: bool
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    detail: str = ""

    def describe(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"numerics {verdict} against {self.reference}: max abs error {self.max_abs_error:.3g}, "
            f"max error relative to output scale {self.max_rel_error:.3g} "
            f"(tolerance: atol {self.atol:g} + rtol {self.rtol:g} x max|reference|){self.detail}"
        )


def compare_outputs(
    outputs: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    reference: str,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> Verification:
    if len(outputs) != len(expected):
        return Verification(reference, False, np.inf, np.inf, rtol, atol, f"; {len(outputs)} outputs, expected {len(expected)}")
    worst_abs, worst_rel, passed, detail = 0.0, 0.0, True, ""
    for index, (out, ref) in enumerate(zip(outputs, expected)):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return Verification(reference, False, np.inf, np.inf, rtol, atol, f"; output {index} has shape {out.shape}, expected {ref.shape}")
        difference = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        abs_error = float(np.max(difference)) if difference.size else 0.0
        rel_error = abs_error / scale if scale > 0 else abs_error
        worst_abs, worst_rel = max(worst_abs, abs_error), max(worst_rel, rel_error)
        if not abs_error <= atol + rtol * scale:
            passed = False
            detail = detail or f"; output {index} is off"
    return Verification(reference, passed, worst_abs, worst_rel, rtol, atol, detail)
