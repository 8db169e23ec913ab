"""Numerics verification reads NaN and infinities as a user would: a NaN output fails, saying so."""

import numpy as np

from collage_core.model.verify import compare_outputs

REFERENCE = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]], dtype=np.float32)


def test_close_outputs_pass_with_their_error():
    result = compare_outputs([REFERENCE + 1e-6], [REFERENCE], "numpy", rtol=1e-3, atol=1e-4)
    assert result.passed and 0 < result.max_abs_error < 2e-6


def test_nan_where_the_reference_is_finite_fails_and_is_named():
    broken = np.full_like(REFERENCE, np.nan)
    result = compare_outputs([broken], [REFERENCE], "numpy", rtol=1e-3, atol=1e-4)
    assert not result.passed and result.max_abs_error == np.inf
    assert "output 0 has 6 NaN or infinite values where the reference is finite" in result.describe()


def test_a_number_where_the_reference_has_nan_fails():
    reference = REFERENCE.copy()
    reference[0, 0] = np.nan
    result = compare_outputs([REFERENCE], [reference], "numpy", rtol=1e-3, atol=1e-4)
    assert not result.passed and result.max_abs_error == np.inf


def test_nan_and_infinities_where_the_reference_has_them_match():
    reference = REFERENCE.copy()
    reference[0, 0], reference[1, 1] = np.nan, -np.inf
    result = compare_outputs([reference.copy()], [reference], "numpy", rtol=1e-3, atol=1e-4)
    assert result.passed and result.max_abs_error == 0.0
