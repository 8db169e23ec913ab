"""The end of a run kept beside its library, so that the same command run again reuses it.

After the search, ``optimize`` builds the placement, verifies it, measures the baselines and times
the closest of them in turns: on a warm cost database that tail is nearly all a rerun costs. The
output directory keeps its outcome in ``finished.json``, keyed by everything that could change it
(the searched placement, the model, the target, the backends and their versions, the settings and
Collage's version) and tied to the library it describes (its size and modification time). When a
later run reaches the same searched placement with the same key and the library is untouched, the
library, the placement it returned, the verification and the end-to-end rows are reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import attrs

from collage_core.errors import CollageError
from collage_core.placement_file import Placement, placement_from_json
from collage_core.records import Cost
from collage_core.result import EndToEnd
from collage_core.verify import Verification

log = logging.getLogger("collage")

FILE_NAME = "finished.json"
FORMAT = "collage-finished-build"
VERSION = 1


@attrs.frozen
class FinishedBuild:
    """What a run ended with: the placement it returned, its end-to-end rows and its verification."""

    key: str
    placement: Placement = attrs.field(eq=False)
    end_to_end: list = attrs.field(eq=False)
    verification: Optional[Verification]


def finish_key(searched_key: str, settings: dict, code_modules) -> str:
    """The key of a run's end: the searched placement's key, every setting that changes what follows,
    and the source of Collage's core and of ``code_modules`` (the plugins in use)."""
    text = json.dumps({"searched": searched_key, "settings": settings, "code": code_digest(code_modules)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def code_digest(module_names) -> str:
    """A digest of the Python source of ``collage_core`` and of the packages of ``module_names``."""
    digest = hashlib.sha256()
    roots = {Path(__file__).resolve().parent}
    for name in module_names:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            roots.add(Path(module.__file__).resolve().parent)
    for root in sorted(roots):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def save_finished(directory: os.PathLike, library: os.PathLike, finished: FinishedBuild) -> Path:
    """Write ``finished.json`` into ``directory``, tied to ``library`` as it is now."""
    stat = Path(library).stat()
    record = {
        "format": FORMAT,
        "version": VERSION,
        "key": finished.key,
        "library": {"name": Path(library).name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns},
        "placement": finished.placement.to_json(),
        "end_to_end": [
            {"name": row.name, "cost": row.cost.to_json(), "operators_by_backend": row.operators_by_backend}
            for row in finished.end_to_end
        ],
        "verification": None if finished.verification is None else attrs.asdict(finished.verification),
    }
    path = Path(directory) / FILE_NAME
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_finished(directory: os.PathLike, library: os.PathLike, key: str) -> Optional[FinishedBuild]:
    """The run end kept in ``directory`` if it has ``key`` and ``library`` is the one it describes, else None.

    A record that is missing, unreadable, of another key or of a changed library is not reused (and
    is overwritten when this run ends); nothing is raised.
    """
    path = Path(directory) / FILE_NAME
    try:
        record = json.loads(path.read_text())
        if record.get("format") != FORMAT or record.get("version") != VERSION or record.get("key") != key:
            return None
        stat = Path(library).stat()
        kept = record["library"]
        if (kept["name"], kept["size"], kept["mtime_ns"]) != (Path(library).name, stat.st_size, stat.st_mtime_ns):
            return None
        rows = [EndToEnd(row["name"], Cost.from_json(row["cost"]), dict(row["operators_by_backend"]))
                for row in record["end_to_end"]]
        verification = None if record["verification"] is None else Verification(**record["verification"])
        placement = placement_from_json(record["placement"], str(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, CollageError) as error:
        log.warning("%s: not reused (%s: %s)", path, type(error).__name__, error)
        return None
    return FinishedBuild(key, placement, rows, verification)
