"""Makes every library export leave a temporary file behind, as a linker killed midway does, for
testing where a run's temporary files go; never installed.

It registers no backend: imported with the other plugins in every worker, it wraps TVM's
``Executable.export_library``. While ``$LEAKY_TEMPORARY_FILES`` names a file, each export first makes
a temporary file with ``tempfile.mkstemp`` (in the process's temporary folder), leaves it there, and
appends ``<pid> <parent pid> <its path>`` to that file. Otherwise exports are TVM's own.
"""

import os
import tempfile

from tvm.runtime.executable import Executable

LOG = "LEAKY_TEMPORARY_FILES"
PREFIX = "collage-test-leak-"

_export_library = Executable.export_library


def _export_leaving_a_temporary_file(self, file_name, *args, **kwargs):
    log = os.environ.get(LOG)
    if log:
        descriptor, path = tempfile.mkstemp(prefix=PREFIX)
        os.close(descriptor)
        with open(log, "a") as file:
            file.write(f"{os.getpid()} {os.getppid()} {path}\n")
    return _export_library(self, file_name, *args, **kwargs)


Executable.export_library = _export_leaving_a_temporary_file
