"""scripts/chaos.py, briefly: two kills among runs of tiny_resnet sharing a cost database and an
output folder, and its table reports no trouble. Marked slow: where a random kill lands moves with the
machine's load, so the default suite does not run it; ``--run-slow`` does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ZERO_ROWS = (
    "lost costs",
    "transient failures kept as permanent",
    "truncated or mismatched artifacts",
    "files outside the output and database folders",
    "runs failed otherwise",
    "runs not ending cleanly on SIGTERM",
    "processes outliving their run",
    "killed processes slow to end",
)


def table_of(stdout: str) -> dict[str, str]:
    rows = stdout.split("\n\n", 1)[-1].splitlines()[2:]
    return dict(re.split(r"\s{2,}", row.strip(), maxsplit=1) for row in rows if re.search(r"\S\s{2,}\S", row))


@pytest.mark.slow
def test_two_kills_leave_no_loss_no_torn_file_and_a_rerun_that_passes(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "chaos.py"),
            "--kills",
            "2",
            "--seed",
            "0",
            "--models",
            "tiny_resnet",
            "--backends",
            "tvm",
            "--graph-level",
            "",
            "--folders",
            "1",
            "--min-delay",
            "2",
            "--max-delay",
            "5",
            "--grace",
            "60",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    table = table_of(done.stdout)
    assert table.get("kills in all") == "2", done.stdout + done.stderr[-3000:]
    assert {row: table[row] for row in ZERO_ROWS} == {row: "0" for row in ZERO_ROWS}, done.stdout
    assert table["reruns passed"] == "1/1" and table["database"] == "ok", done.stdout
    assert done.returncode == 0, done.stdout
