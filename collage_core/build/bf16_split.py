"""Float32 matrix products on bfloat16 tensor cores, to float32's accuracy within a small factor: each operand split
into three bfloat16 terms, and the product the sum of the six products of terms that float32 can resolve, laid
along K so that one 16-bit product with a float32 accumulator computes them all.

A float32 ``x`` is ``x1 + x2 + x3`` with ``x1 = bf16(x)``, ``x2 = bf16(x - x1)``, ``x3 = bf16(x - x1 - x2)``: each
difference is exact in float32, bfloat16 keeps 8 significant bits and rounds to nearest, so ``|x2| <= 2^-8 |x|``,
``|x3| <= 2^-16 |x|``, and the three hold all of x's 24 bits (for ``|x|`` down to ``2^-100``; below, ``x3`` falls
under float32's smallest normal number and what is lost stays under ``2^-130``). Of the nine products ``ai * bj``
the six with ``i + j <= 4`` (:data:`TERMS`) are kept; the three left out add up to at most about ``2^-23 |a| |b|``,
twice float32's own rounding of a product. A product of two bfloat16 terms is exact in float32, so what remains is
the float32 accumulation. The tensor cores accumulate by truncation, so the products are laid smallest first
(:data:`TERMS`): where the accumulator runs along K, it holds small sums while the small products come in, and the
largest come last, as many as in the float32 product. Laid largest first, a GPT-2-sized product (1024 x 768 by
768 x 3072) erred on an H100 by 7.6 times cuBLAS's float32 kernel; the smallest-first order has not run on a GPU
yet (the cuBLAS GPU test asks for at most 4 times, and a tenth of TF32's error).
Laid along the reduced axis, ``[a2 a1 a3 a1 a2 a1] . [b2; b3; b1; b2; b1; b1]`` is that sum: one bfloat16 product
six times as deep. Hopper's tensor cores run bfloat16 about fifteen times as fast as float32 without them (989
against 67 TFLOP/s on an H100 SXM), so a large float32 product is expected to take under half the time (not timed
yet).

A backend names such a pattern ``<backend>.<what>_bf16x6`` (:func:`computes_bf16x6`); its lowering passes the
left operand through :func:`stacked_terms` (Relax operators TVM compiles with the partition: one cast-and-subtract
kernel writing six times the operand's elements at 16 bits) and a constant right operand as
:func:`stacked_constant` (split once, at build time).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

BF16X6_PATTERN_SUFFIX = "_bf16x6"
# The (left, right) terms of each product kept (i + j <= 4), in the order they are laid along K: smallest first.
TERMS = ((2, 2), (1, 3), (3, 1), (1, 2), (2, 1), (1, 1))
DEPTH = len(TERMS)  # how many times deeper the bfloat16 product is


def computes_bf16x6(pattern_name: str) -> bool:
    """Whether a pattern's kernel computes its float32 product as :data:`DEPTH` bfloat16 products (its name ends with
    :data:`BF16X6_PATTERN_SUFFIX`)."""
    return pattern_name.endswith(BF16X6_PATTERN_SUFFIX)


def split_terms(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three bfloat16 terms (ml_dtypes' bfloat16, rounded to nearest even) of float32 ``values``."""
    # Deferred: ml_dtypes comes with TVM; only bfloat16 constants need it.
    import ml_dtypes

    rest = np.asarray(values, dtype=np.float32)
    terms = []
    for _ in range(3):
        term = rest.astype(ml_dtypes.bfloat16)
        terms.append(term)
        rest = rest - term.astype(np.float32)  # exact: term is rest rounded to fewer bits
    return tuple(terms)


def stacked_constant(values: np.ndarray, axis: int, left: bool = False) -> np.ndarray:
    """A constant right operand's terms laid along its reduced ``axis`` in :data:`TERMS` order (bfloat16); with
    ``left``, a left operand's (what :func:`stacked_terms` computes)."""
    terms = split_terms(values)
    return np.concatenate([terms[pair[0 if left else 1] - 1] for pair in TERMS], axis=axis)


def stacked_terms(expr: relax.Expr, axis: int = -1) -> relax.Expr:
    """The Relax expression laying a float32 left operand's terms along its reduced ``axis`` in :data:`TERMS` order:
    casts and exact subtractions, then one concatenation (bfloat16)."""
    op = relax.op
    rest, terms = expr, []
    for index in range(3):
        term = op.astype(rest, "bfloat16")
        terms.append(term)
        if index < 2:
            rest = op.subtract(rest, op.astype(term, "float32"))
    return op.concat([terms[left - 1] for left, _ in TERMS], axis=axis)
