"""The end of a run kept beside its library: reused only under the same key and for the same library."""

from __future__ import annotations

import json
import logging
import os

import pytest

from collage_core.finished_build import FILE_NAME, FinishedBuild, code_digest, finish_key, load_finished, save_finished
from collage_core.placement_file import Placement
from collage_core.records import Cost, Partition
from collage_core.result import EndToEnd
from collage_core.verify import Verification


def placement() -> Placement:
    return Placement(
        model_name="m", model_fingerprint="f", operators=["relax.nn.relu", "relax.nn.relu"], target={"kind": "llvm"},
        device="cpu", backends={"tvm": {"version": "1", "kind": "op-level"}}, search="op-level",
        partitions=[Partition("tvm", "tvm.op", (0,), "k0", Cost.measured(1e-6, 0.0, 3)),
                    Partition("tvm", "tvm.op", (1,), "k1", Cost.measured(2e-6, 0.0, 3))],
        inputs_of=[[], [0]],
    )


@pytest.fixture
def kept(tmp_path):
    library = tmp_path / "m.so"
    library.write_bytes(b"a library")
    finished = FinishedBuild(
        "key-1", placement(),
        [EndToEnd("placement", Cost.measured(3e-6, 1e-7, 5), {"tvm": 2}),
         EndToEnd("tvm alone", Cost.invalid("stopped: one run takes longer than 60 s"), {"tvm": 2})],
        Verification("onnxruntime 1.0", True, 1e-7, 1e-6, 1e-3, 1e-4),
    )
    save_finished(tmp_path, library, finished)
    return tmp_path, library, finished


def test_a_kept_end_is_read_back_whole_under_its_key(kept):
    directory, library, finished = kept
    again = load_finished(directory, library, "key-1")
    assert again == finished
    assert again.end_to_end == finished.end_to_end
    assert [row.operators_by_backend for row in again.end_to_end] == [{"tvm": 2}, {"tvm": 2}]
    assert again.placement.partitions == finished.placement.partitions


def test_another_key_or_a_changed_library_is_not_reused(kept):
    directory, library, _ = kept
    assert load_finished(directory, library, "key-2") is None
    library.write_bytes(b"another library")
    assert load_finished(directory, library, "key-1") is None


def test_a_library_rewritten_with_the_same_size_is_not_reused(kept):
    directory, library, _ = kept
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_finished(directory, library, "key-1") is None


def test_a_missing_library_or_record_is_not_reused(kept, tmp_path):
    directory, library, _ = kept
    assert load_finished(tmp_path / "elsewhere", library, "key-1") is None
    library.unlink()
    assert load_finished(directory, library, "key-1") is None


@pytest.mark.parametrize("damage", [
    lambda record: "not json {",
    lambda record: json.dumps({k: v for k, v in record.items() if k != "end_to_end"}),
    lambda record: json.dumps({**record, "placement": {"partitions": "nonsense"}}),
    lambda record: json.dumps({**record, "verification": {"passed": True}}),
], ids=["not json", "rows missing", "bad placement", "bad verification"])
def test_a_damaged_record_is_not_reused_and_says_why(kept, damage, caplog):
    directory, library, _ = kept
    path = directory / FILE_NAME
    path.write_text(damage(json.loads(path.read_text())))
    with caplog.at_level(logging.WARNING, logger="collage"):
        assert load_finished(directory, library, "key-1") is None
    assert f"{path}: not reused" in caplog.text


def test_a_record_of_another_format_version_is_passed_over(kept):
    directory, library, _ = kept
    path = directory / FILE_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    assert load_finished(directory, library, "key-1") is None


def test_the_key_follows_the_searched_placement_the_settings_and_the_code(tmp_path, monkeypatch):
    key = finish_key("searched", {"verify": True}, [])
    assert key == finish_key("searched", {"verify": True}, [])
    assert key != finish_key("searched-2", {"verify": True}, [])
    assert key != finish_key("searched", {"verify": False}, [])
    package = tmp_path / "a_plugin"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import a_plugin  # noqa: F401

    with_plugin = code_digest(["a_plugin"])
    assert with_plugin != code_digest([])
    (package / "__init__.py").write_text("X = 2\n")
    assert code_digest(["a_plugin"]) != with_plugin
