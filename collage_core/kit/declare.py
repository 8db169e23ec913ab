"""Hooks declared for one backend: ``@hookimpl_for(BACKEND)`` instead of testing the name in every hook, and
the whole set of a native-kernel backend's hooks from one declaration (``native_kernel_hooks``)."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import attrs

from collage_core.build.executable import replace_functions
from collage_core.hookspecs import hookimpl
from collage_core.records import Availability, Backend

Hook = TypeVar("Hook", bound=Callable)


def hookimpl_for(backend_name: str, **options) -> Callable[[Hook], Hook]:
    """Mark a hook implementation that answers for the backend named ``backend_name`` only.

    The hook is called for every backend; for any other one it returns None, as the contract asks,
    without running the function. The function keeps its signature (pluggy reads the arguments a
    hook takes from it through ``__wrapped__``), so it may take fewer arguments than the spec, and
    ``options`` are ``hookimpl``'s (``trylast=True``, ...). A hook without a ``backend`` argument
    (``collage_register_backends``) is marked with ``hookimpl``.
    """

    def mark(function: Hook) -> Hook:
        parameters = list(inspect.signature(function).parameters)
        if "backend" not in parameters:
            raise TypeError(f"{function.__qualname__} takes no backend argument: mark it with hookimpl")
        position = parameters.index("backend")

        @functools.wraps(function)
        def for_one_backend(*args, **kwargs):
            backend = args[position] if position < len(args) else kwargs["backend"]
            if backend.name != backend_name:
                return None
            return function(*args, **kwargs)

        for_one_backend.collage_backend = backend_name
        return hookimpl(**options)(for_one_backend)

    return mark


@attrs.frozen
class NativeKernelHooks:
    """The hooks of an op-level backend whose partitions each become one call of its native kernels (DNNL,
    cuBLAS, cuDNN), made by :func:`native_kernel_hooks`; a plugin's hooks module holds each under its name (:meth:`hookimpls`)."""

    collage_register_backends: Callable
    collage_check_availability: Callable
    collage_contribute_patterns: Callable
    collage_lower_partitions: Callable
    collage_prepare_runtime: Callable
    collage_runtime_libraries: Callable

    def hookimpls(self) -> dict[str, Callable]:
        """Each hook under its name, for the plugin's hooks module to hold as its own:
        ``globals().update(HOOKS.hookimpls())``."""
        return attrs.asdict(self, recurse=False)


def native_kernel_hooks(
    backend_name: str,
    *,
    describe: Callable[[], Backend],
    load: Callable[[], object],
    unavailable: type[Exception],
    target_kinds: Sequence[str],
    patterns: Callable[[str], list],
    lower_function: Callable,
    built_library: Callable[[], Path],
) -> NativeKernelHooks:
    """Declare a native-kernel backend once; the kit implements its hooks.

    ``describe()`` is its ``Backend`` (called when backends are registered); ``load()`` builds and loads its
    kernel library, registering the functions its partitions call, and raises ``unavailable`` saying what is
    missing (its message is the availability's reason); ``patterns(precision)`` are its patterns on a target
    of ``target_kinds`` (none elsewhere); ``lower_function(func, name)`` lowers one partition
    (``replace_functions``); ``built_library()`` is the kernel library, built without a device, that exports carry.
    """

    @hookimpl
    def collage_register_backends(register):
        backend = describe()
        if backend.name != backend_name:
            raise ValueError(f"native_kernel_hooks for {backend_name!r} describes a backend named {backend.name!r}")
        register(backend)

    @hookimpl_for(backend_name)
    def collage_check_availability(backend):
        try:
            load()
        except unavailable as missing:
            return Availability.no(str(missing))
        return Availability.yes()

    @hookimpl_for(backend_name)
    def collage_contribute_patterns(backend, target, precision):
        if target.kind.name not in target_kinds:
            return []
        return patterns(precision)

    @hookimpl_for(backend_name)
    def collage_lower_partitions(backend, mod, function_names, target):
        return replace_functions(mod, function_names, lower_function)

    @hookimpl_for(backend_name)
    def collage_prepare_runtime(backend):
        load()  # registers the kernels' functions; raises `unavailable` saying what is missing
        return True

    @hookimpl_for(backend_name)
    def collage_runtime_libraries(backend):
        return [built_library()]

    return NativeKernelHooks(
        collage_register_backends,
        collage_check_availability,
        collage_contribute_patterns,
        collage_lower_partitions,
        collage_prepare_runtime,
        collage_runtime_libraries,
    )
