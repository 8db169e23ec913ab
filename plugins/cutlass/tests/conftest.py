"""Fixtures shared by the CUTLASS plugin's tests."""

import pytest

from collage_core.backends import discover_backends
from collage_core.plugins import get_plugin_manager


@pytest.fixture(scope="module")
def pm():
    return get_plugin_manager()


@pytest.fixture(scope="module")
def backends(pm):
    return {name: info.backend for name, info in discover_backends(pm).items()}
