"""The tuning database: one MetaSchedule JSON database per device, in a folder of Collage's cache.

The folder is ``$COLLAGE_CACHE_DIR/metaschedule/<digest>`` (``kit.cache_root``), the digest that of the target and
the device name the cost database keys costs by (``tvm_compat.device_name``), so records tuned on one machine are never
read for another. MetaSchedule appends each record to ``database_tuning_record.json`` as it is measured: a tuning run
killed at its budget keeps what it measured.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
from pathlib import Path
from typing import Optional

import tvm

from collage_core.kit import cache_root, tvm_compat

log = logging.getLogger("collage")

FOLDER = "metaschedule"
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


class TuningDatabaseError(Exception):
    """A database file MetaSchedule cannot read; the message names the file, in one line."""


def folder_for(target: tvm.target.Target) -> Path:
    """The database folder of ``target``'s device."""
    key = json.dumps([tvm_compat.target_to_json(target), tvm_compat.device_name(target)])
    return cache_root() / FOLDER / hashlib.sha256(key.encode()).hexdigest()[:16]


def records_digest() -> str:
    """A digest of every device's records file (its size: records are only appended), for the backend's version:
    costs measured with fewer records are then not read as if measured with more."""
    found = sorted((path.parent.name, path.stat().st_size) for path in (cache_root() / FOLDER).glob(f"*/{RECORDS}"))
    return hashlib.sha256(json.dumps(found).encode()).hexdigest()[:12]


def prepare_folder(target: tvm.target.Target) -> Path:
    """The database folder of ``target``'s device, made with a note saying which device it is for."""
    folder = folder_for(target)
    folder.mkdir(parents=True, exist_ok=True)
    note = folder / "target.json"
    if not note.exists():
        note.write_text(json.dumps({"target": tvm_compat.target_to_dict(target), "device": tvm_compat.device_name(target)}) + "\n")
    return folder


# The open database of each folder, with the sizes and times of its files it was read at.
_opened: dict[Path, tuple[tuple, object]] = {}


def open_database(target: tvm.target.Target, folder: Optional[Path] = None):
    """``target``'s JSON database, or None when it holds no records yet; read again only when its files change.

    Raises :class:`TuningDatabaseError` naming the file when a line is not a record. A last line without its
    newline is a record a killed run was writing: it is cut off the file, and the rest kept.
    """
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    folder = folder or folder_for(target)
    paths = (folder / WORKLOADS, folder / RECORDS)
    if not all(path.exists() for path in paths) or paths[1].stat().st_size == 0:
        return None
    stamp = tuple((path.stat().st_size, path.stat().st_mtime_ns) for path in paths)
    if folder in _opened and _opened[folder][0] == stamp:
        return _opened[folder][1]
    for path in paths:
        _check_lines(path)
    try:
        database = JSONDatabase(path_workload=str(paths[0]), path_tuning_record=str(paths[1]), allow_missing=False)
    except Exception as error:  # TVM's message spans the whole stack: one line names the folder
        first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise TuningDatabaseError(f"tuning database {folder}: MetaSchedule cannot read it ({first})") from None
    _opened[folder] = (tuple((path.stat().st_size, path.stat().st_mtime_ns) for path in paths), database)
    return database


def _check_lines(path: Path) -> None:
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = lines[-1]
    if torn:
        try:
            json.loads(torn)
        except ValueError:
            with tuning_lock(path.parent) as held:
                if not held:
                    raise TuningDatabaseError(f"tuning database {path}: a tuning run is writing it; try again when it ends") from None
                log.warning("%s: its last line is a record a killed run was writing; it is cut off", path)
                with open(path, "r+b") as handle:
                    handle.truncate(len(data) - len(torn))
            lines = lines[:-1]
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as error:
            raise TuningDatabaseError(
                f"tuning database {path}: line {number} is not a MetaSchedule record ({error}); "
                "move the file away to start this device's database again"
            ) from None


@contextlib.contextmanager
def tuning_lock(folder: Path):
    """Holds the database's lock while the block runs, and says whether it got it: one tuning run writes a folder
    at a time (MetaSchedule's records name their workload by its line in the workloads file)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "tuning.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def workload(prim_func) -> tvm.IRModule:
    """The module MetaSchedule keys ``prim_func``'s records by, the same when tuned and when looked up."""
    return tvm.IRModule({"main": prim_func.with_attr("global_symbol", "main")})


def tuned(database, prim_func, target: tvm.target.Target):
    """``prim_func`` scheduled by its best record in ``database``, or None when it has none that ran."""
    if database is None:
        return None
    scheduled = database.query_ir_module(workload(prim_func), target, "main")
    return None if scheduled is None else scheduled["main"]


def best_seconds(database, prim_func) -> Optional[float]:
    """The best measured run time of ``prim_func`` in ``database``, or None."""
    mod = workload(prim_func)
    if database is None or not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    if not top or not top[0].run_secs:
        return None
    secs = [float(value) for value in top[0].run_secs]
    return sum(secs) / len(secs)
