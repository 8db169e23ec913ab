"""The peers benchmark measures Collage again where its code changed, and only there, keeping the peers' rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import peers  # noqa: E402

PEER_FILES = ["onnxruntime_default_session.json", "pytorch_eager.json"]


def model_directory(root: Path, commits: dict) -> peers.RawResults:
    raw = peers.RawResults(root, "small_b1")
    for name in PEER_FILES:
        (raw.directory / name).write_text(json.dumps({"median_s": 0.01, "commit": "old"}))
    for config, commit in commits.items():
        raw.path(config).write_text(json.dumps({"commit": commit}))
    for kept in ("costs.sqlite", "costs.sqlite-wal", "explanation.txt", "collage-out/placement.json"):
        (raw.directory / kept).parent.mkdir(exist_ok=True)
        (raw.directory / kept).write_text("x")
    return raw


def test_a_cold_run_from_other_code_takes_all_of_collages_rows_and_files_with_it(tmp_path):
    raw = model_directory(tmp_path, {"collage cold": "old", "collage warm": "new", "interleaved": "new"})
    forgotten = raw.forget_stale_collage(lambda commit: commit == "new")
    assert forgotten == ["collage cold", "collage warm", "interleaved"]
    left = sorted(p.name for p in raw.directory.iterdir())
    assert left == PEER_FILES  # the peers' rows stay; the cost database, library and explanation go


def test_rows_measured_with_the_current_code_stay_so_a_remeasurement_resumes(tmp_path):
    raw = model_directory(tmp_path, {"collage cold": "new", "collage warm": "new", "interleaved": "old"})
    forgotten = raw.forget_stale_collage(lambda commit: commit == "new")
    assert forgotten == ["interleaved"]
    assert raw.path("collage cold").exists() and raw.path("collage warm").exists()
    assert (raw.directory / "costs.sqlite").exists() and (raw.directory / "collage-out" / "placement.json").exists()
    assert not (raw.directory / "explanation.txt").exists()  # written again from the new library
    assert raw.forget_stale_collage(lambda commit: commit == "new") == []


def test_collage_code_is_compared_by_what_git_says_changed(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=peers.ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=peers.ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *peers.COLLAGE_CODE], cwd=peers.ROOT).returncode != 0
    assert peers.same_collage_code(head) is not dirty
    assert not peers.same_collage_code(head + "+changes")
    assert not peers.same_collage_code(None)
    assert not peers.same_collage_code("0000000")  # not a commit of this repository
