"""The end of a run kept beside its library: reused only under the same key and for the same library,
and when not reused, the lookup says which part differed."""

from __future__ import annotations

import json
import logging
import os

import attrs
import pytest

from collage_core.model.verify import Verification
from collage_core.outputs.end_to_end import EndToEnd
from collage_core.outputs.placement_file import Placement
from collage_core.outputs.reuse import FILE_NAME, FinishedBuild, FinishKey, code_digest, finish_key, load_finished, save_finished
from collage_core.records import Cost, Partition


def placement() -> Placement:
    return Placement(
        model_name="m",
        model_fingerprint="f",
        operators=["relax.nn.relu", "relax.nn.relu"],
        target={"kind": "llvm"},
        device="cpu",
        backends={"tvm": {"version": "1", "kind": "op-level"}},
        search="op-level",
        partitions=[
            Partition("tvm", "tvm.op", (0,), "k0", Cost.measured(1e-6, 0.0, 3)),
            Partition("tvm", "tvm.op", (1,), "k1", Cost.measured(2e-6, 0.0, 3)),
        ],
        inputs_of=[[], [0]],
    )


KEY = FinishKey(
    model="fingerprint-1",
    target='{"kind": "llvm"}',
    backends={"onnxruntime": "1.31.0", "tvm": "0.22"},
    searched="searched-1",
    settings={"verify": True, "settings": {"single_run_s": 5.0, "warmup": 1}},
    code="code-1",
)


@pytest.fixture
def kept(tmp_path):
    library = tmp_path / "m.so"
    library.write_bytes(b"a library")
    finished = FinishedBuild(
        KEY,
        placement(),
        [
            EndToEnd("placement", Cost.measured(2e-6, 1e-7, 99), {"tvm": 2}, timed_in_turns=True),
            EndToEnd("placement, one after another", Cost.measured(3e-6, 1e-7, 5), {"tvm": 2}),
            EndToEnd("tvm alone", Cost.invalid("stopped: one run takes longer than 60 s"), {"tvm": 2}),
        ],
        Verification("onnxruntime 1.0", True, 1e-7, 1e-6, 1e-3, 1e-4),
        searched_placement=attrs.evolve(placement(), why_chosen="found by the op-level search; not returned"),
    )
    save_finished(tmp_path, library, finished)
    return tmp_path, library, finished


def test_a_kept_end_is_read_back_whole_under_its_key(kept):
    directory, library, finished = kept
    lookup = load_finished(directory, library, KEY)
    again = lookup.finished
    assert again == finished and lookup.why_not == ""
    assert again.end_to_end == finished.end_to_end
    assert [row.timed_in_turns for row in again.end_to_end] == [True, False, False]
    assert [row.operators_by_backend for row in again.end_to_end] == [{"tvm": 2}] * 3
    assert again.placement.partitions == finished.placement.partitions
    assert again.searched_placement.why_chosen == "found by the op-level search; not returned"


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"model": "fingerprint-2"}, "the model changed"),
        ({"target": '{"kind": "cuda"}'}, 'another target (was {"kind": "llvm"})'),
        (
            {"backends": {"onnxruntime": "1.32.0", "tvm": "0.22"}},
            "other backends or versions (was onnxruntime 1.31.0, tvm 0.22, now onnxruntime 1.32.0, tvm 0.22)",
        ),
        ({"settings": {"verify": False, "settings": {"single_run_s": 1.0, "warmup": 1}}}, "other settings (settings.single_run_s, verify)"),
        ({"code": "code-2"}, "Collage's code or a plugin's changed"),
        ({"searched": "searched-2"}, "the search ended at another placement"),
        ({"code": "code-2", "searched": "searched-2"}, "Collage's code or a plugin's changed"),
    ],
    ids=["model", "target", "backends", "settings", "code", "searched", "code and so searched"],
)
def test_a_run_end_under_another_key_is_not_reused_and_the_part_that_differs_is_named(kept, change, reason):
    directory, library, _ = kept
    lookup = load_finished(directory, library, attrs.evolve(KEY, **change))
    assert lookup.finished is None and lookup.why_not == reason


def test_a_changed_library_is_not_reused_and_says_so(kept):
    directory, library, _ = kept
    library.write_bytes(b"another library")
    lookup = load_finished(directory, library, KEY)
    assert lookup.finished is None
    assert lookup.why_not == "its library m.so was written again after it ended (by another run into the same directory?)"


def test_a_library_rewritten_with_the_same_size_is_not_reused(kept):
    directory, library, _ = kept
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert "was written again" in load_finished(directory, library, KEY).why_not


def test_a_library_of_the_same_size_and_time_but_other_bytes_is_not_reused(kept):
    """Size and time are cheap to forge (a copy with ``touch -r``, a file system that rounds times):
    only the bytes say the library is the one that was verified."""
    directory, library, _ = kept
    stat = library.stat()
    library.write_bytes(b"garbage!!")
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (library.stat().st_size, library.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    lookup = load_finished(directory, library, KEY)
    assert lookup.finished is None
    assert lookup.why_not == (
        "its library m.so has other bytes than the one it ended with (its SHA-256 differs, though its size and time do not)"
    )


def test_the_record_is_replaced_whole(kept):
    """Written under a temporary name and renamed: a run killed meanwhile leaves the record before whole."""
    directory, library, finished = kept
    before = (directory / FILE_NAME).stat().st_ino
    save_finished(directory, library, finished)
    assert (directory / FILE_NAME).stat().st_ino != before
    assert sorted(path.name for path in directory.iterdir()) == [FILE_NAME, "m.so"]


def test_a_missing_library_or_record_is_not_reused(kept, tmp_path):
    directory, library, _ = kept
    nothing = load_finished(tmp_path / "elsewhere", library, KEY)
    assert nothing.finished is None and nothing.why_not == ""  # nothing kept: nothing to say
    library.unlink()
    assert load_finished(directory, library, KEY).why_not == "its library m.so is missing"


@pytest.mark.parametrize(
    "damage",
    [
        lambda record: "not json {",
        lambda record: json.dumps({k: v for k, v in record.items() if k != "end_to_end"}),
        lambda record: json.dumps({**record, "placement": {"partitions": "nonsense"}}),
        lambda record: json.dumps({**record, "verification": {"passed": True}}),
    ],
    ids=["not json", "rows missing", "bad placement", "bad verification"],
)
def test_a_damaged_record_is_not_reused_and_says_why(kept, damage, caplog):
    directory, library, _ = kept
    path = directory / FILE_NAME
    path.write_text(damage(json.loads(path.read_text())))
    with caplog.at_level(logging.WARNING, logger="collage"):
        lookup = load_finished(directory, library, KEY)
    assert lookup.finished is None and lookup.why_not.startswith(f"{FILE_NAME} could not be read")
    assert f"{path}: not reused" in caplog.text


def test_a_record_of_another_format_version_is_passed_over(kept):
    directory, library, _ = kept
    path = directory / FILE_NAME
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 1, "key": "a digest"}))
    lookup = load_finished(directory, library, KEY)
    assert lookup.finished is None and lookup.why_not == f"{FILE_NAME} was written by another version of Collage"


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


def test_a_contest_that_chooses_by_the_latency_after_a_pause_keeps_its_end_under_a_key_of_its_own():
    from types import SimpleNamespace

    import collage_core
    from collage_core.kit import tvm_compat
    from collage_core.outputs.reuse import key_of_run

    job = SimpleNamespace(
        imported=SimpleNamespace(fingerprint="model", reference_name="onnxruntime"),
        target=tvm_compat.make_target({"kind": "llvm"}),
        backends={},
        end_to_end_key=lambda parts, protocol: "searched",
        plugin_modules=[],
    )
    warm = key_of_run(job, [], collage_core.OptimizeOptions())
    after_pause = key_of_run(job, [], collage_core.OptimizeOptions(latency="after-pause"))
    assert after_pause != warm and after_pause.settings == {**warm.settings, "latency": "after-pause"}
    assert "latency" not in warm.settings  # the keys of runs kept before the option existed still match
