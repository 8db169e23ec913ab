"""How a TVM partition is rewritten before TVM's pipeline builds it (the TVM backend and tvm-tuned alike)."""

from __future__ import annotations

from tvm import relax

from collage_tvm import integer_powers, split_parts


def prepared(func: relax.Function) -> relax.Function:
    """``func`` as TVM builds it: each part of a split a slice that fuses with its readers (:mod:`split_parts`), and
    small integer powers multiplications (:mod:`integer_powers`)."""
    return integer_powers.as_multiplications(split_parts.as_slices(func))
