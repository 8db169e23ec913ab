"""Fixtures shared by the modules under tests/."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_cost_db(tmp_path_factory) -> Path:
    """One cost database for the optimizations of the shipped models in test_mlf, test_optimize and
    test_show: like a user's default database, it is shared by their optimizations, so a candidate
    one of them measured is read by the next, not measured again. Tests of measuring into an empty
    or a warm database make their own (tests/reliability/, the warm-database test)."""
    return tmp_path_factory.mktemp("shared-costs") / "costs.sqlite"



@pytest.fixture
def runtime_only_env() -> dict:
    """The environment of a process with TVM's runtime alone (no compiler) and no C++ compiler either."""
    from runtime_only import environment

    return environment()
