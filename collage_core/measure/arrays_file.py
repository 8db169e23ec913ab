"""Arrays passed between processes in an ``.npz`` file (inputs to time or verify on, outputs to compare)."""

from __future__ import annotations

import os

import numpy as np


def load_arrays(path: os.PathLike) -> list[np.ndarray]:
    """The arrays ``np.savez(path, *arrays)`` wrote, in order. numpy stores ml_dtypes' bfloat16 as two-byte void
    (``|V2``), its own dtypes having no bfloat16: such an array comes back as bfloat16 (Collage saves nothing else
    of that size)."""
    with np.load(path, allow_pickle=False) as saved:
        return [_numeric(saved[f"arr_{index}"]) for index in range(len(saved.files))]


def _numeric(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind != "V" or array.dtype.itemsize != 2:
        return array
    # Deferred: ml_dtypes is optional: only for bfloat16 arrays.
    import ml_dtypes

    return array.view(ml_dtypes.bfloat16)
