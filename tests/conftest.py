"""Fixtures shared by the modules under tests/."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_cost_db(tmp_path_factory) -> Path:
    """One cost database for the modules that need a real placement of a shipped model but test what is
    done with it (drawing, exporting): like a user's default database, it is shared by their
    optimizations, so a candidate one of them measured is read by the next, not measured again.
    Measuring itself is tested with databases of its own (test_optimize.py, tests/reliability/)."""
    return tmp_path_factory.mktemp("shared-costs") / "costs.sqlite"
