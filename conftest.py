"""Slow (real large models) and GPU tests are skipped unless asked for; the suite writes nothing into the checkout."""

import pytest
from hypothesis import settings

# Hypothesis keeps failing examples in ./.hypothesis/ by default; the checkout stays as it was.
settings.register_profile("collage", database=None)
settings.load_profile("collage")


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
