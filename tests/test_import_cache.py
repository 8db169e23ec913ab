"""A second import of the same ONNX bytes reads the canonical module back instead of importing again."""

from pathlib import Path

import numpy as np
import pytest
import tvm

from collage_core import tvm_compat
from collage_core.model import import_cache
from collage_core.model.model_import import load_model

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    return tmp_path / "imports"


def _importer_forbidden(monkeypatch):
    def forbidden(proto):
        raise AssertionError("imported again")

    monkeypatch.setattr(tvm_compat, "from_onnx", forbidden)


def test_the_second_import_is_read_back_and_equals_the_first(cache, monkeypatch):
    first = load_model(str(MODELS / "tiny_resnet.onnx"))
    assert len(list(cache.iterdir())) == 1
    _importer_forbidden(monkeypatch)
    second = load_model(str(MODELS / "tiny_resnet.onnx"))
    tvm.ir.assert_structural_equal(second.mod, first.mod)
    assert tvm_compat.structural_key(second.mod["main"]) == tvm_compat.structural_key(first.mod["main"])
    assert (second.fingerprint, second.inputs, second.reference_name) == (first.fingerprint, first.inputs, first.reference_name)
    inputs = second.random_inputs()
    np.testing.assert_array_equal(second.reference(inputs)[0], first.reference(inputs)[0])


def test_a_damaged_entry_is_imported_again_and_rewritten(cache):
    first = load_model(str(MODELS / "tiny_bert.onnx"))
    (entry,) = cache.iterdir()
    (entry / "module.json").write_text("{not json")
    again = load_model(str(MODELS / "tiny_bert.onnx"))
    tvm.ir.assert_structural_equal(again.mod, first.mod)
    assert import_cache.load(entry.name) is not None


def test_large_modules_are_not_kept(cache, monkeypatch):
    monkeypatch.setattr(import_cache, "LARGEST_KEPT_BYTES", 1000)
    load_model(str(MODELS / "tiny_resnet.onnx"))
    assert not cache.exists() or not list(cache.iterdir())


def test_large_models_are_not_even_serialized(cache, monkeypatch):
    size = (MODELS / "tiny_resnet.onnx").stat().st_size
    monkeypatch.setattr(import_cache, "LARGEST_KEPT_BYTES", 2 * size - 2)
    monkeypatch.setattr(tvm.ir, "save_json", lambda mod: pytest.fail("serialized a model over half the limit"))
    load_model(str(MODELS / "tiny_resnet.onnx"))
    assert not cache.exists() or not list(cache.iterdir())


def test_other_bytes_are_another_entry(cache, tmp_path):
    import onnx

    model = onnx.load(str(MODELS / "tiny_resnet.onnx"))
    model.doc_string = "another export of the same network"
    other = tmp_path / "other.onnx"
    onnx.save(model, str(other))
    first, second = load_model(str(MODELS / "tiny_resnet.onnx")), load_model(str(other))
    assert first.fingerprint != second.fingerprint and len(list(cache.iterdir())) == 2
