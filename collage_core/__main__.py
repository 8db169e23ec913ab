"""``python -m collage_core``: the ``collage`` command, for environments whose scripts directory is not on PATH."""

import sys

from collage_core.cli import main

sys.exit(main())
