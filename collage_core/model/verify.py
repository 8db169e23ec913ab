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
    outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], reference: str, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL
) -> Verification:
    if len(outputs) != len(expected):
        return Verification(reference, False, np.inf, np.inf, rtol, atol, f"; {len(outputs)} outputs, expected {len(expected)}")
    worst_abs, worst_rel, passed, detail = 0.0, 0.0, True, ""
    for index, (out, ref) in enumerate(zip(outputs, expected)):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return Verification(
                reference, False, np.inf, np.inf, rtol, atol, f"; output {index} has shape {out.shape}, expected {ref.shape}"
            )
        out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
        stray = int(np.count_nonzero(~np.isfinite(out64) & np.isfinite(ref64)))
        if stray:  # NaN never compares: without this, a NaN output would read as "max abs error 0"
            worst_abs = worst_rel = np.inf
            passed = False
            detail = detail or f"; output {index} has {stray} NaN or infinite values where the reference is finite"
            continue
        same = (out64 == ref64) | (np.isnan(out64) & np.isnan(ref64))  # equal infinities and NaN where the reference has NaN
        with np.errstate(invalid="ignore"):
            difference = np.where(same, 0.0, np.abs(out64 - ref64))
        scale = float(np.max(np.abs(ref64[np.isfinite(ref64)]), initial=0.0)) if ref.size else 0.0
        abs_error = float(np.max(difference)) if difference.size else 0.0
        abs_error = np.inf if np.isnan(abs_error) else abs_error  # NaN where the reference has a number
        rel_error = abs_error / scale if scale > 0 else abs_error
        worst_abs, worst_rel = max(worst_abs, abs_error), max(worst_rel, rel_error)
        if not abs_error <= atol + rtol * scale:
            passed = False
            detail = detail or f"; output {index} is off"
    return Verification(reference, passed, worst_abs, worst_rel, rtol, atol, detail)
