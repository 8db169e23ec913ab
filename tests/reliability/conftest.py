"""The reliability tests load the test plugins in ``tests/plugins_for_tests`` by module name."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parents[1])
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
