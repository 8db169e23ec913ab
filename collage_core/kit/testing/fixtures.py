"""The fixtures every plugin's tests share: ``from collage_core.kit.testing import backends, pm`` in a conftest.py."""

from __future__ import annotations

import pytest

from collage_core.backends import discover_backends
from collage_core.plugins import CollagePluginManager, get_plugin_manager
from collage_core.records import Backend


@pytest.fixture(scope="module")
def pm() -> CollagePluginManager:
    """The plugin manager of the installed plugins."""
    return get_plugin_manager()


@pytest.fixture(scope="module")
def backends(pm: CollagePluginManager) -> dict[str, Backend]:
    """The installed plugins' backends by name."""
    return {name: info.backend for name, info in discover_backends(pm).items()}
