"""File names made from inputs: a name taken from a model's graph name, a model file's name or a
backend's name becomes a file name by :func:`safe_file_name`; a plain name is kept as it is, and no
name leaves its folder."""

from __future__ import annotations

import hashlib
import os
import unicodedata
from pathlib import Path

# Room for the longest suffix a library's files add (".so.runtime.json") and a temporary name's
# marks within the 255 bytes a file name may have.
NAME_BYTES = 180
DEFAULT_NAME = "model"


def safe_file_name(name: str, default: str = DEFAULT_NAME) -> str:
    """``name`` as a file name that stays in its folder: path separators, NUL and other control
    characters become ``_``, leading dots go (so neither ``..`` nor a hidden file), and a name over
    NAME_BYTES bytes in UTF-8 is cut and ends in a digest of the whole, so that long names stay
    distinct. An empty result is ``default``. A plain name (``tiny_resnet``) is kept as it is."""
    cleaned = "".join("_" if ch in "/\\" or unicodedata.category(ch).startswith("C") else ch for ch in str(name))
    cleaned = cleaned.lstrip(".")
    encoded = cleaned.encode("utf-8", "replace")
    if len(encoded) > NAME_BYTES:
        digest = hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:12]
        cleaned = encoded[:NAME_BYTES - len(digest) - 1].decode("utf-8", "ignore") + "-" + digest
    return cleaned or default


def library_file(directory: os.PathLike, model_name: str) -> Path:
    """Where a run writes the library of the model called ``model_name`` in ``directory``."""
    return Path(directory) / f"{safe_file_name(model_name)}.so"
