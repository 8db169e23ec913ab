"""Hooks declared for one backend: ``@hookimpl_for(BACKEND)`` instead of testing the name in every hook."""

from __future__ import annotations

import functools
import inspect

from collage_core.hookspecs import hookimpl


def hookimpl_for(backend_name: str, **options):
    """Mark a hook implementation that answers for the backend named ``backend_name`` only.

    The hook is called for every backend; for any other one it returns None, as the contract asks,
    without running the function. The function keeps its signature (pluggy reads the arguments a
    hook takes from it through ``__wrapped__``), so it may take fewer arguments than the spec, and
    ``options`` are ``hookimpl``'s (``trylast=True``, ...). A hook without a ``backend`` argument
    (``collage_register_backends``) is marked with ``hookimpl``.
    """

    def mark(function):
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
