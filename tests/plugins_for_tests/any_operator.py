"""The hooks shared by test backends that take any single operator and leave its lowering to TVM."""

from tvm.relax.dpl import wildcard

from collage_core import Availability, Backend, Pattern, hookimpl
from collage_core.records import OP_LEVEL


def any_operator_backends(names, device_kinds, description: str):
    """Hooks for op-level backends ``names`` on ``device_kinds``: registered (``description``, with
    ``{name}`` filled in), always available, each taking any operator as ``<name>.op``, and their
    partitions left as they are for TVM's build. A plugin module binds them to the hook names."""
    names = tuple(names)

    @hookimpl
    def collage_register_backends(register):
        for name in names:
            register(Backend(name, OP_LEVEL, tuple(device_kinds), "1", description.format(name=name)))

    @hookimpl
    def collage_check_availability(backend):
        return Availability.yes() if backend.name in names else None

    @hookimpl
    def collage_contribute_patterns(backend, target):
        return [Pattern(f"{backend.name}.op", wildcard())] if backend.name in names else None

    @hookimpl
    def collage_lower_partitions(backend, mod, function_names, target):
        return mod if backend.name in names else None

    return collage_register_backends, collage_check_availability, collage_contribute_patterns, collage_lower_partitions
