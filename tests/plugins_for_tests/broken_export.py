"""Makes the library exports of measurement workers break midway, for testing that a library being
written never harms the one before it; never installed.

It registers no backend: imported with the other plugins in every worker, it wraps TVM's
``Executable.export_library``. While ``$BROKEN_EXPORT`` is set, an export of a run's library into the folder
``$BROKEN_EXPORT_INTO`` (a run's output folder) or into its scratch's ``library/`` (candidates' libraries, built
elsewhere, are left alone) first writes the start of a library to the path it was given, as a linker does, and then raises
(``raise``), or writes that path to the file ``exporting`` in the folder ``$BROKEN_EXPORT_DIR`` and
waits (``pause``) for the file ``go`` there (then it exports as TVM does) or ``stop`` (then it
raises). Otherwise exports are TVM's own.
"""

import os
import time
from pathlib import Path

from tvm.runtime.executable import Executable

MODE = "BROKEN_EXPORT"
INTO = "BROKEN_EXPORT_INTO"
FOLDER = "BROKEN_EXPORT_DIR"
RAISE, PAUSE = "raise", "pause"
# A paused export gives up after this long, should the test never say go or stop.
PAUSE_LIMIT_S = 120.0
START_OF_A_LIBRARY = b"\x7fELF half a library"

_export_library = Executable.export_library


def _a_runs_library(path: Path, folder: Path) -> bool:
    """Whether ``path`` is a run's library in ``folder``: in it, or built in a run's scratch (``.run-*/library/``)
    to be moved into it at the end."""
    built = path.parent.name == "library" and path.parent.parent.name.startswith(".run-") and path.parent.parent.parent == folder
    return path.parent == folder or built


def _export_breaking_midway(self, file_name, *args, **kwargs):
    mode = os.environ.get(MODE)
    if mode is None or not _a_runs_library(Path(file_name), Path(os.environ[INTO])):
        return _export_library(self, file_name, *args, **kwargs)
    Path(file_name).write_bytes(START_OF_A_LIBRARY)
    if mode == PAUSE:
        folder = Path(os.environ[FOLDER])
        (folder / "exporting").write_text(str(file_name))
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while time.monotonic() < deadline and not (folder / "stop").exists():
            if (folder / "go").exists():
                return _export_library(self, file_name, *args, **kwargs)
            time.sleep(0.05)
    raise OSError(f"the export of {Path(file_name).name} broke midway")


Executable.export_library = _export_breaking_midway
