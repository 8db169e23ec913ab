"""The cost database: round trips, concurrent writers, crashes, and files it must refuse."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pathlib
import signal
import sqlite3
import time

import numpy as np
import pytest

from collage_core.measure.cost_db import SCHEMA_VERSION, CostDatabase, CostDatabaseError, CostKey, default_cost_db_path
from collage_core.records import Cost

MEASURED = Cost.measured(1.5e-3, 2e-5, 20)
INVALID = Cost.invalid("build failed: unsupported dtype")


def key(candidate: int, backend: str = "tvm") -> CostKey:
    return CostKey(backend, "0.27.0", '{"kind": "llvm"}', "cpu", f"{candidate:064x}")


def put_range(path: str, start: int, count: int, start_together) -> None:
    """A worker process: waits for its sibling, then stores ``count`` costs one put at a time."""
    start_together.wait()
    with CostDatabase.open(path) as db:
        for candidate in range(start, start + count):
            db.put(key(candidate), Cost.measured(candidate * 1e-6, 1e-7, 10))


def put_forever(path: str, started) -> None:
    """A worker process that writes until it is killed; sets ``started`` once some costs are stored."""
    with CostDatabase.open(path) as db:
        candidate = 0
        while True:
            db.put(key(candidate), Cost.measured(candidate * 1e-6, 1e-7, 10))
            candidate += 1
            if candidate == 50:
                started.set()


@pytest.fixture
def db_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "cache" / "collage" / "costs.sqlite"


@pytest.fixture
def spawn():
    return multiprocessing.get_context("spawn")


def test_measured_and_invalid_costs_round_trip_across_reopen(db_path):
    with CostDatabase.open(db_path) as db:
        assert db.get(key(1)) is None
        db.put(key(1), MEASURED)
        db.put(key(2), INVALID)
    with CostDatabase.open(db_path) as db:
        assert db.get(key(1)) == MEASURED
        assert db.get(key(2)) == INVALID
        assert db.get(key(2)).seconds == float("inf")
        assert len(db) == 2


def test_keys_differing_in_any_field_are_distinct(db_path):
    with CostDatabase.open(db_path) as db:
        db.put(key(1, backend="tvm"), MEASURED)
        assert db.get(key(1, backend="dnnl")) is None
        assert db.get(CostKey("tvm", "0.27.0", '{"kind": "cuda"}', "cpu", f"{1:064x}")) is None


def test_get_many_returns_only_stored_keys_across_query_chunks(db_path):
    with CostDatabase.open(db_path) as db:
        for candidate in range(0, 3000, 2):
            db.put(key(candidate), Cost.measured(candidate * 1e-6, 0.0, 1))
        found = db.get_many(key(candidate) for candidate in range(3000))
    assert set(found) == {key(candidate) for candidate in range(0, 3000, 2)}
    assert found[key(2998)] == Cost.measured(2998e-6, 0.0, 1)


def test_put_replaces_an_earlier_cost(db_path):
    with CostDatabase.open(db_path) as db:
        db.put(key(1), INVALID)
        db.put(key(1), MEASURED, measured_at=1_700_000_000.0)
        assert db.get(key(1)) == MEASURED
        assert len(db) == 1


def test_unknown_cost_is_not_stored(db_path):
    with CostDatabase.open(db_path) as db, pytest.raises(ValueError):
        db.put(key(1), Cost.unknown())


def test_end_to_end_costs_round_trip_apart_from_candidate_costs(db_path):
    genome = "tvm:0,1,2|dnnl:3,4"
    with CostDatabase.open(db_path) as db:
        assert db.get_end_to_end(genome) is None
        db.put_end_to_end(genome, MEASURED)
        db.put_end_to_end("tvm:0,1,2,3,4", INVALID)
        assert len(db) == 0
    with CostDatabase.open(db_path) as db:
        assert db.get_end_to_end(genome) == MEASURED
        assert db.get_end_to_end("tvm:0,1,2,3,4") == INVALID


def test_end_to_end_costs_keep_what_measuring_them_took(db_path):
    with CostDatabase.open(db_path) as db:
        db.put_end_to_end("onnxruntime:0-4", MEASURED, effort_s=12.5)
        db.put_end_to_end("tvm:0-4", INVALID)
    with CostDatabase.open(db_path) as db:
        assert db.get_end_to_end_entry("onnxruntime:0-4") == (MEASURED, 12.5)
        assert db.get_end_to_end_entry("tvm:0-4") == (INVALID, 0.0)
        assert db.get_end_to_end_entry("dnnl:0-4") is None


def test_a_file_written_before_effort_was_kept_is_upgraded_in_place(db_path):
    """A version-1 file without the effort column keeps its costs; the column is added, reading 0."""
    with CostDatabase.open(db_path) as db:
        db.put(key(1), MEASURED)
        db.put_end_to_end("tvm:0-4", MEASURED, effort_s=3.0)
    with sqlite3.connect(db_path) as connection:
        connection.execute("ALTER TABLE end_to_end_costs DROP COLUMN effort_s")
    with CostDatabase.open(db_path) as db:
        assert db.get(key(1)) == MEASURED
        assert db.get_end_to_end_entry("tvm:0-4") == (MEASURED, 0.0)
        db.put_end_to_end("dnnl:0-4", MEASURED, effort_s=2.0)
        assert db.get_end_to_end_entry("dnnl:0-4") == (MEASURED, 2.0)


def test_two_processes_writing_at_once_lose_nothing(db_path, spawn):
    start_together = spawn.Barrier(2)
    writers = [spawn.Process(target=put_range, args=(str(db_path), start, 200, start_together)) for start in (0, 200)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    with CostDatabase.open(db_path) as db:
        assert len(db) == 400
        assert len(db.get_many(key(candidate) for candidate in range(400))) == 400


def test_process_killed_mid_write_leaves_a_usable_database(db_path, spawn):
    started = spawn.Event()
    writer = spawn.Process(target=put_forever, args=(str(db_path), started))
    writer.start()
    assert started.wait(timeout=30)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join()

    with CostDatabase.open(db_path) as db:
        stored = len(db)
        assert stored >= 50
        # Each put commits on its own, so the survivors are exactly the first ``stored`` puts.
        found = db.get_many(key(candidate) for candidate in range(stored + 1))
        assert set(found) == {key(candidate) for candidate in range(stored)}
        assert found[key(49)] == Cost.measured(49e-6, 1e-7, 10)
        db.put(key(stored), MEASURED)
    with contextlib.closing(sqlite3.connect(db_path)) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_file_that_is_not_sqlite_is_refused_and_left_unchanged(tmp_path):
    path = tmp_path / "costs.sqlite"
    garbage = b"not a database" + os.urandom(4096)
    path.write_bytes(garbage)
    with pytest.raises(CostDatabaseError) as raised:
        CostDatabase.open(path)
    message = str(raised.value)
    assert str(path) in message and "--cost-db" in message and "\n" not in message
    assert path.read_bytes() == garbage


def test_a_database_whose_last_page_is_garbled_is_refused_and_left_unchanged(db_path):
    """Damage the header and schema do not show (a garbled last page, as a disk or a copy can leave it) must not
    be read as costs, nor written into: SQLite's quick check on opening finds it."""
    with CostDatabase.open(db_path) as db:
        for candidate in range(400):
            db.put(key(candidate), Cost.measured(candidate * 1e-6, 1e-7, 10))
    data = bytearray(db_path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[-page + 8 : -50] = np.random.default_rng(0).integers(0, 256, size=page - 58, dtype=np.uint8).tobytes()
    db_path.write_bytes(bytes(data))
    with pytest.raises(CostDatabaseError) as raised:
        CostDatabase.open(db_path)
    message = str(raised.value)
    assert str(db_path) in message and "quick check" in message and "--cost-db" in message and "\n" not in message
    assert db_path.read_bytes() == bytes(data)


def test_sqlite_file_of_another_application_is_refused_and_left_unchanged(tmp_path):
    path = tmp_path / "costs.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as other:
        other.execute("CREATE TABLE users (name TEXT)")
    before = path.read_bytes()
    with pytest.raises(CostDatabaseError, match="not a Collage cost database"):
        CostDatabase.open(path)
    assert path.read_bytes() == before


def test_other_schema_version_is_refused(db_path):
    with CostDatabase.open(db_path) as db:
        db.put(key(1), MEASURED)
    with contextlib.closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        raw.execute("UPDATE collage_cost_db_schema SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(CostDatabaseError, match=f"schema version {SCHEMA_VERSION + 1}") as raised:
        CostDatabase.open(db_path)
    assert str(db_path) in str(raised.value)


@pytest.mark.parametrize(
    "edit, message",
    [
        ("DELETE FROM collage_cost_db_schema", "has lost its schema version"),
        ("UPDATE costs SET kind = 'weird'", "is not one Collage wrote (kind 'weird')"),
        ("UPDATE costs SET median_s = 'abc'", "is not one Collage wrote (could not convert string to float"),
        ("UPDATE costs SET repeats = 'x'", "is not one Collage wrote (invalid literal for int()"),
        ("UPDATE costs SET median_s = -1", "is not one Collage wrote (a measured cost of -1.0 s"),
        ("UPDATE end_to_end_costs SET median_s = 1e999", "is not one Collage wrote (a measured cost of inf s"),
    ],
)
def test_rows_no_collage_wrote_are_refused_in_one_line_naming_the_file(db_path, edit, message):
    with CostDatabase.open(db_path) as db:
        db.put(key(1), MEASURED)
        db.put_end_to_end("placement", MEASURED)
    with contextlib.closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        raw.execute(edit)
    with pytest.raises(CostDatabaseError) as raised:
        with CostDatabase.open(db_path) as db:
            db.get(key(1))
            db.get_end_to_end_entry("placement")
    assert message in str(raised.value) and str(db_path) in str(raised.value) and "\n" not in str(raised.value)


def test_database_locked_longer_than_the_timeout_is_reported(db_path):
    with CostDatabase.open(db_path, busy_timeout_s=0.2) as db:
        holder = sqlite3.connect(db_path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # holds the write lock, as a writer in another process would
        try:
            started = time.monotonic()
            with pytest.raises(CostDatabaseError, match="locked by another process") as raised:
                db.put(key(1), MEASURED)
            assert time.monotonic() - started < 5
            assert str(db_path) in str(raised.value)
            # Readers are not blocked by a writer in WAL mode.
            assert db.get(key(1)) is None
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        db.put(key(1), MEASURED)


def test_directory_that_cannot_be_created_is_reported(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(CostDatabaseError, match=str(blocker)):
        CostDatabase.open(blocker / "costs.sqlite")


needs_non_root = pytest.mark.skipif(os.geteuid() == 0, reason="root may write where permissions forbid it")


@needs_non_root
@pytest.mark.parametrize("read_only_part", ["file", "directory"])
def test_read_only_database_serves_stored_costs_and_keeps_new_ones_in_memory(tmp_path, caplog, read_only_part):
    path = tmp_path / "shared" / "costs.sqlite"
    with CostDatabase.open(path) as db:
        db.put(key(1), MEASURED)
    read_only = path if read_only_part == "file" else path.parent
    writable_mode = read_only.stat().st_mode
    read_only.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="collage"), CostDatabase.open(path) as db:
            assert db.read_only
            assert db.get(key(1)) == MEASURED
            db.put(key(2), INVALID)
            db.put(key(1), INVALID)
            db.put_end_to_end("tvm:0", MEASURED)
            assert db.get_many([key(1), key(2)]) == {key(1): INVALID, key(2): INVALID}
            assert db.get_end_to_end("tvm:0") == MEASURED
            assert len(db) == 2
        assert "read-only" in caplog.text and str(path) in caplog.text
    finally:
        read_only.chmod(writable_mode)
    with CostDatabase.open(path) as db:
        assert db.get(key(1)) == MEASURED and db.get(key(2)) is None


@needs_non_root
def test_database_in_a_read_only_directory_cannot_be_created(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(CostDatabaseError, match=str(tmp_path / "costs.sqlite")):
            CostDatabase.open(tmp_path / "costs.sqlite")
    finally:
        tmp_path.chmod(0o755)


def test_default_path_honours_collage_cost_db(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLAGE_COST_DB", str(tmp_path / "mine.sqlite"))
    assert default_cost_db_path() == tmp_path / "mine.sqlite"


def test_default_path_is_in_the_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("COLLAGE_COST_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cost_db_path() == tmp_path / "xdg" / "collage" / "costs.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cost_db_path() == tmp_path / "home" / ".cache" / "collage" / "costs.sqlite"
