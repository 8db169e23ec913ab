"""A plugin that raises when asked to prepare a process for its partitions: loading names it and what to install."""

from __future__ import annotations

import pytest

from collage_core import Backend, hookimpl
from collage_core.build.deploy import LibraryLoadError, backend_needs, prepare_runtime, write_runtime_file
from collage_core.plugins import get_plugin_manager
from collage_core.records import OP_LEVEL

NEEDS = "libfragile (apt-get install libfragile-dev)"


class FragileRuntime:
    """A backend whose runtime cannot be prepared: its native library is missing."""

    @hookimpl
    def collage_register_backends(self, register):
        register(Backend("fragile", OP_LEVEL, ("cpu",), "1", "test backend", runtime_needs=NEEDS))

    @hookimpl
    def collage_prepare_runtime(self, backend):
        if backend.name != "fragile":
            return None
        raise OSError("libfragile.so: cannot open shared object file")


def test_collage_prepare_runtime_raising_names_the_backend_the_error_and_the_fix(tmp_path):
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(FragileRuntime(), name="fragile_plugin")
    library = tmp_path / "model.so"
    library.write_bytes(b"")
    write_runtime_file(library, backend_needs([Backend("fragile", OP_LEVEL, ("cpu",), "1", runtime_needs=NEEDS)], {"fragile"}))
    with pytest.raises(LibraryLoadError) as raised:
        prepare_runtime(library, pm)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{library}: backend fragile cannot run here")
    assert "fragile_plugin" in message and "libfragile.so: cannot open shared object file" in message and NEEDS in message
