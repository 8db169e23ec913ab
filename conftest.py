"""Slow (real large models) and GPU tests are skipped unless asked for; the suite writes nothing into the checkout."""

import tempfile

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps its examples and constants in ./.hypothesis/ by default; here, in a folder of the session's own.
_hypothesis_home = tempfile.TemporaryDirectory(prefix="collage-hypothesis-")
set_hypothesis_home_dir(_hypothesis_home.name)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow (minutes each)")
    parser.addoption("--run-gpu", action="store_true", help="run tests marked gpu (needs an NVIDIA GPU)")


def pytest_collection_modifyitems(config, items):
    for marker, option in (("slow", "--run-slow"), ("gpu", "--run-gpu")):
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"marked {marker}; run with {option}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
