"""The cost database: measured costs kept on disk so that no candidate is measured twice.

One SQLite file, shared by every Collage run of the user. SQLite's transactions make it safe
for two runs at once and for a run killed in the middle of a write. Runs measuring at the same
time divide the work: each claims a candidate just before measuring it (:meth:`CostDatabase.claim`),
or a whole placement (:meth:`CostDatabase.claim_end_to_end`), and a claim lapses with the process
that made it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import shutil
import socket
import sqlite3
import tempfile
import time
import uuid
from typing import Callable, Iterable, Iterator, Optional

import attrs

from collage_core.errors import CollageError
from collage_core.records import INVALID, MEASURED, UNKNOWN, Cost

log = logging.getLogger("collage")

SCHEMA_VERSION = 1
DEFAULT_BUSY_TIMEOUT_S = 30.0

_USE_ANOTHER_FILE = "pass --cost-db or set COLLAGE_COST_DB to use another file"

_COST_COLUMNS = "kind, median_s, spread_s, repeats, reason"
_KEY_COLUMNS = "backend, backend_version, target, device, candidate"
_SCHEMA = (
    "CREATE TABLE collage_cost_db_schema (version INTEGER NOT NULL)",
    f"INSERT INTO collage_cost_db_schema (version) VALUES ({SCHEMA_VERSION})",
    f"""CREATE TABLE costs (
        backend TEXT NOT NULL, backend_version TEXT NOT NULL, target TEXT NOT NULL, device TEXT NOT NULL,
        candidate TEXT NOT NULL,
        kind TEXT NOT NULL, median_s REAL NOT NULL, spread_s REAL NOT NULL, repeats INTEGER NOT NULL,
        reason TEXT NOT NULL, measured_at REAL NOT NULL,
        PRIMARY KEY ({_KEY_COLUMNS})
    ) WITHOUT ROWID""",
    """CREATE TABLE end_to_end_costs (
        key TEXT NOT NULL PRIMARY KEY,
        kind TEXT NOT NULL, median_s REAL NOT NULL, spread_s REAL NOT NULL, repeats INTEGER NOT NULL,
        reason TEXT NOT NULL, measured_at REAL NOT NULL, effort_s REAL NOT NULL DEFAULT 0
    ) WITHOUT ROWID""",
)
# ``effort_s`` (the seconds a whole-placement measurement took, build included) came after
# version 1 was released. It is added in place to a version-1 file that lacks it; earlier
# Collage versions read and write such a file as before (they name their columns, and an
# effort they do not write reads as 0).
_ADD_EFFORT = "ALTER TABLE end_to_end_costs ADD COLUMN effort_s REAL NOT NULL DEFAULT 0"

# Who is measuring what right now. Added to version-1 files in place (earlier Collage versions
# neither read nor mind it). A claim names its process (host, pid and the kernel's start time of
# that pid, so that a pid used again is not taken for the claimer) and when it lapses.
_CLAIMS_TABLE = "collage_claims"
_CREATE_CLAIMS = f"""CREATE TABLE IF NOT EXISTS {_CLAIMS_TABLE} (
    key TEXT NOT NULL PRIMARY KEY, holder TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    process_started TEXT NOT NULL, expires_at REAL NOT NULL
) WITHOUT ROWID"""

# A failure that says nothing about what was measured (its worker was killed from outside, or ran
# out of time while the machine kept it waiting; see collage_core.measure.worker_client) carries this in
# its reason. It is stored like any invalid cost, so that older Collage versions read it as one,
# but a run that opens the database later finds nothing there and measures it again.
TRANSIENT_REASON = "transient failure"

# SQLite versions before 3.32 allow at most 999 parameters per statement; a key takes five.
_KEYS_PER_QUERY = 999 // 5


class CostDatabaseError(CollageError):
    """The cost database cannot be opened, read or written; the message names the file."""


def is_transient(cost: Cost) -> bool:
    """Whether ``cost`` is a failure that was not the measured thing's doing (see TRANSIENT_REASON)."""
    return cost.kind == INVALID and TRANSIENT_REASON in cost.reason


def default_cost_db_path() -> pathlib.Path:
    """``$COLLAGE_COST_DB`` if set, else ``$XDG_CACHE_HOME/collage/costs.sqlite`` (``~/.cache`` by default)."""
    explicit = os.environ.get("COLLAGE_COST_DB")
    if explicit:
        return pathlib.Path(explicit)
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    cache_home = os.environ.get("XDG_CACHE_HOME", "")
    cache_dir = pathlib.Path(cache_home) if os.path.isabs(cache_home) else pathlib.Path.home() / ".cache"
    return cache_dir / "collage" / "costs.sqlite"


@attrs.frozen
class CostKey:
    """What a measurement depends on: the same key on the same machine gives the same cost.

    ``target`` is the canonical JSON of the TVM target; ``candidate`` the structural hash (hex)
    of the candidate's standalone function.
    """

    backend: str
    backend_version: str
    target: str
    device: str
    candidate: str


@attrs.frozen
class Claim:
    """What :meth:`CostDatabase.claim` found: the ``cost`` another run stored meanwhile; or
    ``granted``, this run is to measure it; or neither, another live run is measuring it now.
    A whole placement's cost comes with the seconds its measurement took (``effort_s``)."""

    cost: Optional[Cost] = None
    granted: bool = False
    effort_s: float = 0.0


@attrs.define
class CostDatabase:
    """Costs of candidates (by :class:`CostKey`) and of whole placements (by an opaque string).

    Open with :meth:`open`. Every ``put`` is its own committed transaction, so a crash loses at
    most the measurement in flight.

    A file the user can read but not write (a shared, read-only cache) is opened read-only:
    ``get`` reads it, and ``put`` keeps the new costs in memory for the rest of this run,
    announced by one warning at open. Raising instead would throw away measurements that took
    minutes, and the run's result does not depend on where its costs are kept.

    Failures that were not the measured thing's doing (:func:`is_transient`) stored before this
    database was opened are not found: this run measures them again. With ``remeasure_invalid``,
    neither is any invalid cost stored before; with ``remeasure_held_up``, any cost timed while other
    processes held its threads up (:attr:`Cost.held_up`) stored before.
    """

    path: pathlib.Path
    busy_timeout_s: float
    read_only: bool
    _connection: sqlite3.Connection = attrs.field(repr=False)
    remeasure_invalid: bool = False
    remeasure_held_up: bool = False
    _opened_at: float = attrs.field(factory=time.time, repr=False)
    # Who claims candidates through this object: two runs in one process divide the work as well.
    _holder: str = attrs.field(factory=lambda: uuid.uuid4().hex, repr=False)
    # A read-only file's copy with its write-ahead log, read in its place (see _read_with_its_log).
    _private_copy: Optional[tempfile.TemporaryDirectory] = attrs.field(default=None, repr=False)
    _unsaved: dict[CostKey, Cost] = attrs.field(factory=dict, repr=False)
    _unsaved_end_to_end: dict[str, tuple[Cost, float]] = attrs.field(factory=dict, repr=False)
    _has_effort: bool = attrs.field(default=True, repr=False)

    @classmethod
    def open(
        cls,
        path: os.PathLike | str,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        remeasure_invalid: bool = False,
        remeasure_held_up: bool = False,
    ) -> "CostDatabase":
        """Open the database at ``path``, creating it (and its directory) if it does not exist.

        ``busy_timeout_s`` is how long to wait for another process that holds the write lock.
        With ``remeasure_invalid``, invalid costs stored before now are not found, so they are
        measured again; with ``remeasure_held_up``, neither are held-up ones. Never modifies a file that is not a Collage cost database of this schema
        version.
        """
        path = pathlib.Path(path).absolute()
        read_only = _is_read_only(path)
        private_copy = _read_with_its_log(path) if read_only else None
        with _reported_as(path, busy_timeout_s, "open"):
            if private_copy is not None:
                copied = pathlib.Path(private_copy.name) / path.name
                connection = sqlite3.connect(f"{copied.as_uri()}?mode=ro", uri=True, isolation_level=None)
            else:
                connection = _connect(path, read_only, busy_timeout_s)
        database = cls(path, busy_timeout_s, read_only, connection, remeasure_invalid, remeasure_held_up, private_copy=private_copy)
        try:
            with database._reported("open"):
                database._check_or_create_schema()
                if not read_only:
                    # FULL makes each commit survive a power cut too; a measurement costs far more than the fsync.
                    connection.execute("PRAGMA synchronous = FULL")
        except BaseException:
            database.close()
            raise
        if read_only:
            log.warning(
                "cost database %s is read-only: costs measured in this run are kept in memory only; %s to keep them",
                path,
                _USE_ANOTHER_FILE,
            )
        return database

    def get(self, key: CostKey) -> Optional[Cost]:
        """The stored cost of ``key``, or None if it was never measured."""
        return self.get_many([key]).get(key)

    def get_many(self, keys: Iterable[CostKey]) -> dict[CostKey, Cost]:
        """The stored costs of those ``keys`` that have one; a few queries for thousands of keys."""
        wanted = list(dict.fromkeys(keys))
        found = {key: self._unsaved[key] for key in wanted if key in self._unsaved}
        found.update(self._stored([key for key in wanted if key not in found]))
        return found

    def put(self, key: CostKey, cost: Cost, *, measured_at: Optional[float] = None) -> None:
        """Store ``cost`` for ``key``, replacing any earlier one, and end this run's claim on it;
        ``measured_at`` is epoch seconds (default now)."""
        cost = _checked_storable(cost)
        if self.read_only:
            self._unsaved[key] = cost
            return
        when = time.time() if measured_at is None else measured_at
        with self._reported("write"), self._immediate():
            self._connection.execute(
                f"INSERT OR REPLACE INTO costs ({_KEY_COLUMNS}, {_COST_COLUMNS}, measured_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*attrs.astuple(key), *_row_from_cost(cost), when),
            )
            self._connection.execute(f"DELETE FROM {_CLAIMS_TABLE} WHERE key = ? AND holder = ?", (_claim_key(key), self._holder))

    def claim(self, key: CostKey, lifetime_s: float) -> Claim:
        """Look ``key`` up again just before measuring it, and claim it for this run unless another
        run claimed it first and is still measuring it.

        The claim lasts until :meth:`put` stores the cost, :meth:`release` gives it up, or
        ``lifetime_s`` passes: the longest its measurement may take. A claim whose process no longer
        exists lapses at once. A read-only database has no claims: every run measures what it misses.
        """
        return self._claim(_claim_key(key), lambda: self._found(key), lifetime_s)

    def claim_end_to_end(self, key: str, lifetime_s: float) -> Claim:
        """As :meth:`claim`, for a whole placement by the caller's ``key``: the claim lasts until
        :meth:`put_end_to_end` stores its cost, :meth:`release_end_to_end` gives it up, or
        ``lifetime_s`` passes."""
        return self._claim(_end_to_end_claim_key(key), lambda: self._found_end_to_end(key), lifetime_s)

    def _claim(self, claim_key: str, found: Callable[[], Optional[Claim]], lifetime_s: float) -> Claim:
        if self.read_only:
            return found() or Claim(granted=True)
        now = time.time()
        # Looked at first without the write lock, so that runs waiting for each other only read.
        claimed = self._claimed_or_measured(claim_key, found, now)
        if claimed is not None:
            return claimed
        with self._reported("write"), self._immediate():
            claimed = self._claimed_or_measured(claim_key, found, now)
            if claimed is not None:
                return claimed
            self._connection.execute(
                f"INSERT OR REPLACE INTO {_CLAIMS_TABLE} VALUES (?, ?, ?, ?, ?, ?)",
                (claim_key, self._holder, *_this_process(), now + lifetime_s),
            )
        return Claim(granted=True)

    def _found(self, key: CostKey) -> Optional[Claim]:
        cost = self.get(key)
        return None if cost is None else Claim(cost)

    def _found_end_to_end(self, key: str) -> Optional[Claim]:
        entry = self.get_end_to_end_entry(key)
        return None if entry is None else Claim(entry[0], effort_s=entry[1])

    def _claimed_or_measured(self, claim_key: str, found: Callable[[], Optional[Claim]], now: float) -> Optional[Claim]:
        """The stored cost, or that another live run claims it; None when it is free to claim."""
        stored = found()
        if stored is not None:
            return stored
        with self._reported("read"):
            other = self._connection.execute(
                f"SELECT holder, host, pid, process_started, expires_at FROM {_CLAIMS_TABLE} WHERE key = ?", (claim_key,)
            ).fetchone()
        if other is not None and other[0] != self._holder and other[4] > now and _alive(*other[1:4]):
            return Claim()
        return None

    def release(self, key: CostKey) -> None:
        """Give up this run's claim on ``key`` without storing a cost: another run may measure it."""
        self._release(_claim_key(key))

    def release_end_to_end(self, key: str) -> None:
        """Give up this run's claim on a whole placement without storing its cost."""
        self._release(_end_to_end_claim_key(key))

    def _release(self, claim_key: str) -> None:
        if not self.read_only:
            with self._reported("write"):
                self._connection.execute(f"DELETE FROM {_CLAIMS_TABLE} WHERE key = ? AND holder = ?", (claim_key, self._holder))

    def release_claims(self) -> None:
        """Give up every claim this run still holds."""
        if not self.read_only:
            with self._reported("write"):
                self._connection.execute(f"DELETE FROM {_CLAIMS_TABLE} WHERE holder = ?", (self._holder,))

    def get_end_to_end(self, key: str) -> Optional[Cost]:
        """The stored cost of a whole placement, by the caller's ``key``, or None."""
        entry = self.get_end_to_end_entry(key)
        return None if entry is None else entry[0]

    def get_end_to_end_entry(self, key: str) -> Optional[tuple[Cost, float]]:
        """The stored cost of a whole placement and the seconds its measurement took (0 if not
        recorded), or None."""
        if key in self._unsaved_end_to_end:
            return self._unsaved_end_to_end[key]
        effort = "effort_s" if self._has_effort else "0"
        with self._reported("read"):
            row = self._connection.execute(
                f"SELECT {_COST_COLUMNS}, measured_at, {effort} FROM end_to_end_costs WHERE key = ?", (key,)
            ).fetchone()
        if row is None or not self._usable(self._cost_from_row(row[:5]), row[5]):
            return None
        return self._cost_from_row(row[:5]), float(row[6])

    def put_end_to_end(self, key: str, cost: Cost, *, effort_s: float = 0.0, measured_at: Optional[float] = None) -> None:
        """Store the cost of a whole placement under the caller's ``key``, replacing any earlier one,
        and end this run's claim on it.

        ``effort_s`` is what measuring it took; a search whose budget is charged with it replays
        the same way from the database as it ran when it measured.
        """
        if self.read_only:
            self._unsaved_end_to_end[key] = (_checked_storable(cost), float(effort_s))
            return
        cost = _checked_storable(cost)
        when = time.time() if measured_at is None else measured_at
        with self._reported("write"), self._immediate():
            self._connection.execute(
                f"INSERT OR REPLACE INTO end_to_end_costs (key, {_COST_COLUMNS}, measured_at, effort_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, *_row_from_cost(cost), when, float(effort_s)),
            )
            self._connection.execute(
                f"DELETE FROM {_CLAIMS_TABLE} WHERE key = ? AND holder = ?", (_end_to_end_claim_key(key), self._holder)
            )

    def __len__(self) -> int:
        """How many candidate costs are known (whole-placement costs are not counted)."""
        with self._reported("read"):
            (stored,) = self._connection.execute("SELECT COUNT(*) FROM costs").fetchone()
        return stored + len(self._unsaved) - len(self._stored(list(self._unsaved)))

    def close(self) -> None:
        self._connection.close()
        if self._private_copy is not None:
            self._private_copy.cleanup()

    def __enter__(self) -> "CostDatabase":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _stored(self, keys: list[CostKey]) -> dict[CostKey, Cost]:
        stored = {}
        with self._reported("read"):
            for start in range(0, len(keys), _KEYS_PER_QUERY):
                chunk = keys[start : start + _KEYS_PER_QUERY]
                # A join, not "(...) IN (VALUES ...)": SQLite looks each key up by the primary key
                # in a join, but scans the whole table for the IN.
                rows = self._connection.execute(
                    f"WITH wanted ({_KEY_COLUMNS}) AS (VALUES {', '.join(['(?, ?, ?, ?, ?)'] * len(chunk))}) "
                    f"SELECT {_KEY_COLUMNS}, {_COST_COLUMNS}, measured_at FROM wanted JOIN costs USING ({_KEY_COLUMNS})",
                    [field for key in chunk for field in attrs.astuple(key)],
                )
                for row in rows:
                    cost = self._cost_from_row(row[5:10])
                    if self._usable(cost, row[10]):
                        stored[CostKey(*row[:5])] = cost
        return stored

    def _usable(self, cost: Cost, measured_at: float) -> bool:
        """Whether a stored cost is found: a failure stored before this database was opened is
        measured again when it was transient, and any is with ``remeasure_invalid``; a held-up cost
        with ``remeasure_held_up``."""
        if measured_at >= self._opened_at:
            return True
        if cost.is_measured:
            return not (self.remeasure_held_up and cost.held_up)
        return not (self.remeasure_invalid or is_transient(cost))

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[None]:
        """One write transaction, taking the write lock at once: what it reads stays true until it commits."""
        self._connection.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._connection.execute("COMMIT")
        finally:
            if self._connection.in_transaction:
                self._connection.execute("ROLLBACK")

    def _check_or_create_schema(self) -> None:
        if self._has_schema():
            self._check_integrity()
            self._add_effort_column()
            self._add_claims_table()
            return
        if self.read_only:
            raise CostDatabaseError(f"cost database {self.path} is empty and read-only; {_USE_ANOTHER_FILE}")
        self._switch_to_write_ahead_log()
        # Another process may create the schema between our check and our lock: check again under the lock.
        self._connection.execute("BEGIN IMMEDIATE")
        try:
            if not self._has_schema():
                for statement in (*_SCHEMA, _CREATE_CLAIMS):
                    self._connection.execute(statement)
            self._connection.execute("COMMIT")
        finally:
            if self._connection.in_transaction:
                self._connection.execute("ROLLBACK")

    def _check_integrity(self) -> None:
        """SQLite's quick check of every page: damage its header and schema do not show (a garbled last page) would
        otherwise be read, and written into, without a word."""
        rows = [row[0] for row in self._connection.execute("PRAGMA quick_check(3)").fetchall()]
        if rows != ["ok"]:
            lines = [line for row in rows for line in str(row).splitlines() if line.strip() and not line.startswith("***")]
            raise CostDatabaseError(
                f"{self.path} is not a usable SQLite database (its pages fail SQLite's quick check: {(lines or rows)[0]}); "
                f"move it away or {_USE_ANOTHER_FILE}"
            )

    def _add_effort_column(self) -> None:
        columns = {row[1] for row in self._connection.execute("PRAGMA table_info(end_to_end_costs)")}
        if "effort_s" in columns:
            return
        if self.read_only:
            self._has_effort = False
            return
        try:
            self._connection.execute(_ADD_EFFORT)
        except sqlite3.OperationalError as error:
            if "duplicate column" not in str(error):  # another process added it first
                raise

    def _add_claims_table(self) -> None:
        if self.read_only:
            return
        (present,) = self._connection.execute(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = ?", (_CLAIMS_TABLE,)
        ).fetchone()
        if not present:  # IF NOT EXISTS: another process may add it first
            self._connection.execute(_CREATE_CLAIMS)

    def _switch_to_write_ahead_log(self) -> None:
        # SQLite does not wait out the busy timeout here: the switch fails at once while another
        # process opening the same new file holds a lock, so we retry until the timeout.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                self._connection.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as error:
                if _primary_code(error) != _SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def _has_schema(self) -> bool:
        """False for an empty database, True for ours; refuses any other without writing to it."""
        tables = {name for (name,) in self._connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        if not tables:
            return False
        if "collage_cost_db_schema" not in tables:
            raise CostDatabaseError(
                f"{self.path} is an SQLite database but not a Collage cost database; move it away or {_USE_ANOTHER_FILE}"
            )
        row = self._connection.execute("SELECT version FROM collage_cost_db_schema").fetchone()
        if row is None:
            raise CostDatabaseError(f"cost database {self.path} has lost its schema version; move it away or {_USE_ANOTHER_FILE}")
        (version,) = row
        if version != SCHEMA_VERSION:
            raise CostDatabaseError(
                f"cost database {self.path} has schema version {version} but this Collage reads version "
                f"{SCHEMA_VERSION}; move it away (its costs will be measured again) or {_USE_ANOTHER_FILE}"
            )
        return True

    def _cost_from_row(self, row: tuple) -> Cost:
        try:
            return _cost_from_row(row)
        except (TypeError, ValueError) as error:
            raise CostDatabaseError(
                f"{self.path}: a stored cost is not one Collage wrote ({str(error).strip()}); move the file away (its costs "
                f"will be measured again) or {_USE_ANOTHER_FILE}"
            ) from None

    def _reported(self, action: str) -> contextlib.AbstractContextManager[None]:
        return _reported_as(self.path, self.busy_timeout_s, action)


@contextlib.contextmanager
def _reported_as(path: pathlib.Path, busy_timeout_s: float, action: str) -> Iterator[None]:
    """Turns SQLite's errors into one-line CostDatabaseErrors that name the file and a way out."""
    try:
        yield
    except sqlite3.Error as error:
        raise CostDatabaseError(_describe(path, busy_timeout_s, action, error)) from error


def _describe(path: pathlib.Path, busy_timeout_s: float, action: str, error: sqlite3.Error) -> str:
    primary_code = _primary_code(error)
    if primary_code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return (
            f"cost database {path} stayed locked by another process for more than {busy_timeout_s:g} s "
            f"(on {action}); wait for the other Collage run to finish or {_USE_ANOTHER_FILE}"
        )
    if primary_code in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return f"{path} is not a usable SQLite database ({error}); move it away or {_USE_ANOTHER_FILE}"
    return f"cannot {action} cost database {path}: {error}; {_USE_ANOTHER_FILE}"


# SQLite's primary result codes; Python's sqlite3 names them only from 3.11 on.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26
_CODES_BY_MESSAGE = {"database is locked": _SQLITE_BUSY, "file is not a database": _SQLITE_NOTADB}


def _primary_code(error: sqlite3.Error) -> int:
    """SQLite's primary code of ``error``; 0 for errors of Python's sqlite3 module itself, which carry none."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:  # Python 3.10
        return next((c for text, c in _CODES_BY_MESSAGE.items() if text in str(error)), 0)
    return code & 0xFF


def _is_read_only(path: pathlib.Path) -> bool:
    """Whether ``path`` can only be read; creates its directory, and raises if it cannot be used at all."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CostDatabaseError(f"cannot create the directory of cost database {path}: {error.strerror}; {_USE_ANOTHER_FILE}") from error
    # SQLite's write-ahead log lives in files beside the database, so writing needs the directory too.
    directory_writable = _may_write(path.parent)
    if not path.exists():
        if not directory_writable:
            raise CostDatabaseError(f"cannot create cost database {path}: directory not writable; {_USE_ANOTHER_FILE}")
        return False
    if not os.access(path, os.R_OK):
        raise CostDatabaseError(f"cannot read cost database {path}: permission denied; {_USE_ANOTHER_FILE}")
    return not (directory_writable and _may_write(path))


def _may_write(path: pathlib.Path) -> bool:
    return os.access(path, os.W_OK)


def _connect(path: pathlib.Path, read_only: bool, busy_timeout_s: float) -> sqlite3.Connection:
    # isolation_level=None: we say where transactions begin, so each put commits on its own.
    if not read_only:
        return sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    # mode=ro still needs to create the log's shared-memory file beside the database; where the
    # directory forbids that, immutable=1 reads without it (and without seeing concurrent writers).
    mode = "mode=ro" if _may_write(path.parent) else "immutable=1"
    return sqlite3.connect(f"{path.as_uri()}?{mode}", uri=True, timeout=busy_timeout_s, isolation_level=None)


def _read_with_its_log(path: pathlib.Path) -> Optional[tempfile.TemporaryDirectory]:
    """For a read-only ``path`` in a folder that cannot be written, with a write-ahead log beside it:
    a private folder holding copies of both, to be read in its place; None when there is no log to
    read, or when it cannot be copied (said in one warning).

    SQLite reads such a file only as immutable, which ignores the log and with it every cost
    committed since the log was last copied into the file (a run that was killed leaves them there).
    """
    log_path = path.with_name(path.name + "-wal")
    if _may_write(path.parent) or not log_path.exists() or log_path.stat().st_size == 0:
        return None
    private = tempfile.TemporaryDirectory(prefix="collage-cost-db-")
    try:
        for source in (path, log_path):  # the database first: the log's frames are checked against it
            shutil.copyfile(source, pathlib.Path(private.name) / source.name)
    except OSError as error:
        private.cleanup()
        log.warning(
            "cost database %s: its write-ahead log cannot be read in this read-only folder (%s), so the costs "
            "committed since the log was last written into the database are not used",
            path,
            error.strerror or error,
        )
        return None
    return private


def _claim_key(key: CostKey) -> str:
    return json.dumps(["candidate", *attrs.astuple(key)])


def _end_to_end_claim_key(key: str) -> str:
    return json.dumps(["end-to-end", key])


def _this_process() -> tuple[str, int, str]:
    """(host, pid, start time) naming this process in a claim."""
    return socket.gethostname(), os.getpid(), _process_started(os.getpid()) or ""


def _alive(host: str, pid: int, started: str) -> bool:
    """Whether the process that made a claim may still be measuring: one on another host is
    taken to be until its claim lapses."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    now_started = _process_started(pid)
    return now_started is None or not started or now_started == started


def _process_started(pid: int) -> Optional[str]:
    """When ``pid`` started, in the kernel's clock ticks since boot; "" for a process that has ended
    but was not reaped yet (a zombie), None where /proc does not say."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
    return "" if fields[0] in ("Z", "X") else fields[19]


def _checked_storable(cost: Cost) -> Cost:
    if cost.kind == UNKNOWN:
        raise ValueError("an unknown cost is not a measurement; there is nothing to store")
    return cost


# A measured cost's reason column says "held up" when it was timed while other processes kept its threads waiting
# for a processor (Cost.held_up_share); a Collage that does not know the word reads the cost as it is.
HELD_UP_PREFIX = "held up: its threads waited for a processor, share"


def _row_from_cost(cost: Cost) -> tuple:
    reason = f"{HELD_UP_PREFIX} {cost.held_up_share!r}" if cost.is_measured and cost.held_up else cost.reason
    return (cost.kind, cost.median_s, cost.spread_s, cost.repeats, reason)


def _held_up_share(reason: str) -> float:
    """The share a measured cost's reason column records (see HELD_UP_PREFIX); 0.0 for any other reason."""
    if not reason.startswith(HELD_UP_PREFIX):
        return 0.0
    try:
        share = float(reason[len(HELD_UP_PREFIX) :])
    except ValueError:
        raise ValueError(f"reason {reason!r}") from None
    if not math.isfinite(share) or share <= 0:
        raise ValueError(f"reason {reason!r}")
    return share


def _cost_from_row(row: tuple) -> Cost:
    """A stored row as a Cost; ValueError or TypeError for one no Collage wrote (a kind, number or count out of place)."""
    kind, median_s, spread_s, repeats, reason = row
    if kind not in (MEASURED, INVALID, UNKNOWN):
        raise ValueError(f"kind {kind!r}")
    median_s, spread_s = float(median_s), float(spread_s)
    if isinstance(repeats, float) and not repeats.is_integer():
        raise ValueError(f"repeats {repeats!r} is not a count")
    cost = Cost(kind, median_s, spread_s, int(repeats), str(reason))
    if cost.is_measured:
        cost = Cost.measured(median_s, spread_s, int(repeats), _held_up_share(str(reason)))
    if median_s < 0 or spread_s < 0 or (cost.is_measured and not math.isfinite(median_s + spread_s)):
        raise ValueError(f"a {kind} cost of {median_s!r} s (spread {spread_s!r} s)")
    return cost


def open_costs(path: Optional[os.PathLike], remeasure_invalid: bool = False, remeasure_held_up: bool = False) -> CostDatabase:
    """The cost database at ``path`` (default: :func:`default_cost_db_path`); with ``remeasure_invalid``, the
    invalid costs stored before it is opened are not read, so they are measured again; with ``remeasure_held_up``,
    the held-up ones (:attr:`collage_core.records.Cost.held_up`)."""
    return CostDatabase.open(
        path if path else default_cost_db_path(), remeasure_invalid=remeasure_invalid, remeasure_held_up=remeasure_held_up
    )
