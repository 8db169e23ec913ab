"""How a TVM partition is rewritten before TVM's pipeline builds it (the TVM backend and tvm-tuned alike)."""

from __future__ import annotations

from tvm import relax

from collage_tvm import integer_powers, reshapes_first, split_parts


def prepared(func: relax.Function) -> relax.Function:
    """``func`` as TVM builds it: each part of a split a slice that fuses with its readers (:mod:`split_parts`), a reshape
    after a norm over the last axis done before it, so that what follows the norm fuses with it (:mod:`reshapes_first`), and small integer powers
    multiplications (:mod:`integer_powers`)."""
    return integer_powers.as_multiplications(reshapes_first.reshapes_before_norms(split_parts.as_slices(func)))
