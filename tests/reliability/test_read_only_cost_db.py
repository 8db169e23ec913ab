"""A cost database in a folder that cannot be written, with a write-ahead log a killed writer left
beside it: read with its log, or one line says which costs cannot be read."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from collage_core.measure import cost_db
from collage_core.measure.cost_db import CostDatabase, CostKey
from collage_core.records import Cost

MEASURED = Cost.measured(1.5e-3, 2e-5, 20)
LOGGED = range(1, 5)


def key(candidate: int) -> CostKey:
    return CostKey("tvm", "0.27.0", '{"kind": "llvm"}', "cpu", f"{candidate:064x}")


@pytest.fixture
def frozen(tmp_path, monkeypatch) -> Path:
    """A read-only folder holding a cost database with candidate 0 in the file and the rest in its log."""
    writing = tmp_path / "writing" / "costs.sqlite"
    with CostDatabase.open(writing) as db:
        db.put(key(0), MEASURED)  # written into the file when its last connection closes
    folder = tmp_path / "frozen"
    folder.mkdir()
    with CostDatabase.open(writing) as db:
        for candidate in LOGGED:
            db.put(key(candidate), MEASURED)
        for name in ("costs.sqlite", "costs.sqlite-wal"):  # as a writer killed now leaves them
            shutil.copyfile(writing.parent / name, folder / name)
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root may write anyway: the folder looks read-only to Collage as it does to others
        monkeypatch.setattr(cost_db, "_may_write", lambda path: not Path(path).is_relative_to(folder))
    yield folder
    folder.chmod(0o755)


def contents(folder: Path) -> dict:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_read_only_database_with_a_pending_log_is_read_with_its_log(frozen, caplog):
    before = contents(frozen)
    with caplog.at_level(logging.WARNING, logger="collage"), CostDatabase.open(frozen / "costs.sqlite") as db:
        assert db.read_only
        assert db.get_many(key(c) for c in range(5)) == {key(c): MEASURED for c in range(5)}
        db.put(key(9), MEASURED)  # kept in memory
        assert db.get(key(9)) == MEASURED
    assert contents(frozen) == before
    assert "read-only" in caplog.text


def test_a_log_that_cannot_be_read_is_said_in_one_line(frozen, caplog, monkeypatch):
    def refuse(source, destination):
        raise PermissionError(13, "Permission denied", str(source))

    monkeypatch.setattr(cost_db.shutil, "copyfile", refuse)
    with caplog.at_level(logging.WARNING, logger="collage"), CostDatabase.open(frozen / "costs.sqlite") as db:
        assert db.get_many(key(c) for c in range(5)) == {key(0): MEASURED}
    said = [record.getMessage() for record in caplog.records if "write-ahead log" in record.getMessage()]
    assert len(said) == 1 and str(frozen / "costs.sqlite") in said[0] and "not used" in said[0], said
    assert "\n" not in said[0]
