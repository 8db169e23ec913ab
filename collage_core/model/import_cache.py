"""Remembering the canonical Relax module of an ONNX model, so a second import of the same bytes is a read.

Importing an ONNX model runs TVM's importer and the canonicalizing passes (constant folding builds
and runs TIR): about a second for the quickstart's 0.45 MB model, most of a warm run's own work.
The module is kept as TVM's JSON in ``$COLLAGE_CACHE_DIR/imports/<key>/``, keyed by the model's
bytes and by everything that shapes the import (TVM's and ONNX Runtime's versions, the importing
code), with the fingerprint the import gave it. Only modules whose
JSON is small are kept: weights travel in it, and reading a large one back is slower than importing
(BERT-base's 585 MB took longer than its import). A damaged entry is ignored and written anew.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import attrs
import tvm

from collage_core.build.native import cache_root, sources_digest

LARGEST_KEPT_BYTES = 16 << 20
_MODEL = Path(__file__).parent
_CODE = (_MODEL / "model_import.py", _MODEL / "rewrites.py", _MODEL.parent / "tvm_compat.py", Path(__file__))


@attrs.frozen
class CachedImport:
    mod: object
    fingerprint: str


def key(model_digest: str) -> str:
    """The entry's name: the model's digest with the versions and code that shape its import."""
    # Deferred: ONNX Runtime is optional and slow to import: loaded only where it runs.
    import onnxruntime

    identity = f"{model_digest}|tvm {tvm.__version__}|onnxruntime {onnxruntime.__version__}|{sources_digest(_CODE)}"
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def _entry(name: str) -> Path:
    return cache_root() / "imports" / name


def load(name: str) -> Optional[CachedImport]:
    """The cached import under ``name``, or None (absent or damaged)."""
    entry = _entry(name)
    try:
        meta = json.loads((entry / "meta.json").read_text())
        mod = tvm.ir.load_json((entry / "module.json").read_text())
        return CachedImport(mod, meta["fingerprint"])
    except Exception:  # noqa: BLE001 - an absent or damaged entry is no entry; the import runs and rewrites it
        return None


def store(name: str, mod, fingerprint: str, model_bytes: int) -> bool:
    """Keep ``mod`` under ``name`` if its JSON is small enough; whether it was kept. Never raises on a full disk.
    A model of over half the limit (``model_bytes``, its weights mostly) is not even serialized: that alone
    took BERT-base longer than its import."""
    if model_bytes > LARGEST_KEPT_BYTES // 2:
        return False
    text = tvm.ir.save_json(mod)
    if len(text) > LARGEST_KEPT_BYTES:
        return False
    entry = _entry(name)
    partial = None
    try:
        entry.mkdir(parents=True, exist_ok=True)
        for file, content in (("module.json", text), ("meta.json", json.dumps({"fingerprint": fingerprint}))):
            partial = entry / f"{file}.{os.getpid()}.partial"
            partial.write_text(content)
            os.replace(partial, entry / file)
    except OSError:
        if partial is not None:
            partial.unlink(missing_ok=True)  # a full disk keeps no half-written entry
        return False
    return True
