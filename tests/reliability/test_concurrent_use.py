"""Two `collage optimize` processes sharing one cost database at the same time."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny_resnet.onnx"
SUMMARY = re.compile(r"candidates: \d+ \((\d+) distinct\); measured (\d+) in [\d.]+ s, (\d+) from the cost database, (\d+) invalid")


def test_two_processes_share_a_cost_database_and_both_finish(tmp_path):
    db = tmp_path / "costs.sqlite"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "collage_core.cli", "optimize", str(MODEL), "--backends", "tvm", "--search", "op-level",
             "--no-compare", "--calibration-rounds", "0", "--cost-db", str(db), "--output", str(tmp_path / f"out{i}")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for i in range(2)
    ]
    results = [run.communicate(timeout=900) for run in runs]
    for run, (stdout, stderr) in zip(runs, results):
        assert run.returncode == 0, stderr[-2000:]
        assert "numerics passed" in stdout
    summaries = [SUMMARY.search(stdout) for stdout, _ in results]
    distinct = int(summaries[0].group(1))
    assert all(int(s.group(4)) == 0 for s in summaries)
    with sqlite3.connect(db) as connection:
        stored = connection.execute("SELECT COUNT(*) FROM costs").fetchone()[0]
    assert stored == distinct  # every candidate once, whichever process measured it
    assert all(int(s.group(2)) + int(s.group(3)) == distinct for s in summaries)
