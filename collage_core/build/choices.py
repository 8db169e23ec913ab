"""Choices a backend made by timing at build time (a layout, an algorithm, an execution plan), kept on disk.

A kernel built once on a machine is built the same way on every later build there (a replay,
an export) without timing again. Keys are digests of everything that decides the choice (the
kernel's spec, the device, the library's version); values are JSON. The file is shared by
processes: a writer merges under a lock, and a damaged file reads as empty (timing again is
always correct).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional


def any_value(value: Any) -> bool:
    """Every value is valid: a store whose values no build can outgrow."""
    return True


class ChoiceStore:
    """The choices kept in the JSON file ``path``, by key; ``is_valid(value)`` says whether a value (perhaps
    written by an older build) is one this build can use: one that is not reads as absent, so it is timed again."""

    def __init__(self, path: Path, is_valid: Callable[[Any], bool] = any_value):
        self.path = path
        self.is_valid = is_valid

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Optional[Any]:
        """The valid value kept for ``key``, or None."""
        value = self._read().get(key)
        return value if value is not None and self.is_valid(value) else None

    def values(self) -> list:
        """Every valid value in the store (what was chosen, for reports)."""
        return [value for value in self._read().values() if value is not None and self.is_valid(value)]

    def put(self, key: str, value: Any) -> None:
        """Keep ``value`` (JSON) for ``key``, merged under a lock with what other processes wrote."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            data[key] = value
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
            partial.write_text(json.dumps(data, sort_keys=True))
            os.replace(partial, self.path)
