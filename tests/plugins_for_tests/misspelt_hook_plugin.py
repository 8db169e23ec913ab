"""A plugin with a misspelt hook name (``collage_register_backend``, no final s)."""

from collage_core import hookimpl


@hookimpl
def collage_register_backend(register):
    raise AssertionError("a misspelt hook must be refused, never called")
