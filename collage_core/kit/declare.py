"""Hooks declared for one backend: ``@hookimpl_for(BACKEND)`` instead of testing the name in every hook, and
the whole set of a native-kernel backend's hooks (``native_kernel_hooks``) or of a graph-level engine's
(``engine_hooks``) from one declaration."""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, Sequence, TypeVar

import attrs
import tvm
from tvm import relax

from collage_core.build.executable import replace_functions
from collage_core.hookspecs import hookimpl
from collage_core.records import Availability, Backend
from collage_core.relax_onnx import patterns as engine_patterns

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


@attrs.frozen
class EngineHooks:
    """The hooks of a graph-level backend whose partitions each become one call of an engine's run function
    on the partition as a model (ONNX Runtime, OpenVINO), made by :func:`engine_hooks`; a plugin's hooks module
    holds each under its name (:meth:`hookimpls`). ``collage_lower_whole_model`` is None for an engine that does
    not run a user's model file whole."""

    collage_register_backends: Callable
    collage_check_availability: Callable
    collage_contribute_patterns: Callable
    collage_lower_partitions: Callable
    collage_lower_whole_model: Optional[Callable]
    collage_prepare_runtime: Callable

    def hookimpls(self) -> dict[str, Callable]:
        """Each hook the engine implements under its name, for the plugin's hooks module to hold as its own:
        ``globals().update(HOOKS.hookimpls())``."""
        return {name: hook for name, hook in attrs.asdict(self, recurse=False).items() if hook is not None}


def engine_hooks(
    backend_name: str,
    *,
    engine: str,
    install_hint: str,
    describe: Callable[[str], Backend],
    missing: Callable[[ModuleType], Optional[str]],
    target_kinds: Sequence[str],
    lowering: Callable[[tvm.IRModule, list[str], tvm.target.Target], Callable[[relax.Function, str], relax.Function]],
    register_runtime: Callable[[], object],
    sixteen_bit: Optional[Callable[[], frozenset]] = None,
    whole_onnx_model: Optional[Callable[[bytes, relax.Function, str], relax.Function]] = None,
) -> EngineHooks:
    """Declare a graph-level engine once; the kit implements its hooks.

    ``engine`` is the Python module of the engine (``"onnxruntime"``), imported when a hook needs it; while it
    cannot be imported the backend is unavailable and the reason says ``install_hint``. ``describe(version)`` is
    its ``Backend``, given the engine module's ``__version__`` (``"not installed"`` without one);
    ``missing(module)`` says what the imported engine lacks on this machine, or None when it runs. On a target
    of ``target_kinds`` its patterns are the shared operator set's (``engine_patterns.operator_patterns``)
    taking the 16-bit types ``sixteen_bit()`` (none without it); none elsewhere.
    ``lowering(mod, function_names, target)`` returns the function ``(func, name)`` lowering each of those
    partitions (``replace_functions``);
    ``whole_onnx_model(model, func, name)``, if given, runs an ONNX model file whole on a target of
    ``target_kinds``. ``register_runtime()`` registers the run function in this process.
    """

    def imported() -> ModuleType | ImportError:
        try:
            return importlib.import_module(engine)
        except ImportError as error:
            return error

    def import_failure(error: ImportError) -> str:
        return f"{engine} cannot be imported ({error}): {install_hint}"

    @hookimpl
    def collage_register_backends(register):
        backend = describe(getattr(imported(), "__version__", "not installed"))
        if backend.name != backend_name:
            raise ValueError(f"engine_hooks for {backend_name!r} describes a backend named {backend.name!r}")
        register(backend)

    @hookimpl_for(backend_name)
    def collage_check_availability(backend):
        module = imported()
        if isinstance(module, ImportError):
            return Availability.no(import_failure(module))
        reason = missing(module)
        return Availability.yes() if reason is None else Availability.no(reason)

    @hookimpl_for(backend_name)
    def collage_contribute_patterns(backend, target):
        if target.kind.name not in target_kinds:
            return []
        return engine_patterns.operator_patterns(backend_name, sixteen_bit=sixteen_bit() if sixteen_bit else frozenset())

    @hookimpl_for(backend_name)
    def collage_lower_partitions(backend, mod, function_names, target):
        return replace_functions(mod, function_names, lowering(mod, function_names, target))

    @hookimpl_for(backend_name)
    def collage_lower_whole_model(backend, model, model_format, func, name, target):
        if model_format != "onnx" or target.kind.name not in target_kinds:
            return None
        return whole_onnx_model(model, func, name)

    @hookimpl_for(backend_name)
    def collage_prepare_runtime(backend):
        module = imported()
        if isinstance(module, ImportError):
            raise RuntimeError(import_failure(module))
        register_runtime()
        return True

    return EngineHooks(
        collage_register_backends,
        collage_check_availability,
        collage_contribute_patterns,
        collage_lower_partitions,
        collage_lower_whole_model if whole_onnx_model is not None else None,
        collage_prepare_runtime,
    )
