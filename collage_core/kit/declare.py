"""Hooks declared for one backend: ``@hookimpl_for(BACKEND)`` instead of testing the name in every hook, and
the whole set of a backend's hooks from one declaration: any backend's (``backend_hooks``), a native-kernel
backend's (``native_kernel_hooks``) or a graph-level engine's (``engine_hooks``), the last two declared
through the first."""

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
from collage_core.records import Availability, Backend, Pattern
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
class BackendHooks:
    """The hooks the kit implements for one declared backend, made by :func:`backend_hooks` (and so by
    :func:`native_kernel_hooks` and :func:`engine_hooks`); an optional hook the declaration left out is None.
    A plugin's hooks module holds each hook under its name (:meth:`hookimpls`)."""

    collage_register_backends: Callable
    collage_check_availability: Callable
    collage_contribute_patterns: Callable
    collage_lower_partitions: Callable
    collage_prepare_runtime: Callable
    collage_runtime_libraries: Optional[Callable] = None
    collage_lower_whole_model: Optional[Callable] = None
    collage_tune_partitions: Optional[Callable] = None

    def hookimpls(self) -> dict[str, Callable]:
        """Each hook the backend implements under its name, for the plugin's hooks module to hold as its own:
        ``globals().update(HOOKS.hookimpls())``."""
        return {name: hook for name, hook in attrs.asdict(self, recurse=False).items() if hook is not None}


def backend_hooks(
    backend_name: str,
    *,
    describe: Callable[[], Backend],
    missing: Callable[[], Optional[str]],
    patterns: Callable[[tvm.target.Target, str], list[Pattern]],
    lowering: Optional[Callable[[tvm.IRModule, list[str], tvm.target.Target], Callable[[relax.Function, str], relax.Function]]],
    prepare_runtime: Callable[[], object],
    target_kinds: Optional[Sequence[str]] = None,
    runtime_libraries: Optional[Callable[[], list[Path]]] = None,
    lower_whole_model: Optional[Callable[[bytes, str, relax.Function, str, tvm.target.Target], Optional[relax.Function]]] = None,
    lower_module: Optional[Callable[[tvm.IRModule, list[str], tvm.target.Target], tvm.IRModule]] = None,
    tune_partitions: Optional[Callable[[tvm.IRModule, list[str], tvm.target.Target, float], int]] = None,
) -> BackendHooks:
    """Declare a backend once; the kit implements its hooks, each answering for ``backend_name`` alone.

    ``describe()`` is its ``Backend`` (called when backends are registered; registering one of another name is
    a ``ValueError``). ``missing()`` says what this machine lacks to run it, in words a user can act on, or None
    when it runs. ``patterns(target, precision)`` are its patterns on a target of ``target_kinds`` (every
    target when None); on any other it contributes none. ``lowering(mod, function_names, target)`` returns the
    function ``(func, name)`` lowering each of those partitions (``replace_functions``).
    ``prepare_runtime()`` makes what the partitions call available in this process, raising saying what is
    missing when it cannot. Optional hooks are implemented only when given: ``runtime_libraries()``, the
    native libraries exports carry (``[]`` when TVM compiles the partitions into the library);
    ``lower_whole_model(model, model_format, func, name, target)``, a model file run whole on a target of
    ``target_kinds``, or None for a format it does not run; ``tune_partitions(mod, function_names, target,
    budget_s)``, how many kernels it tuned for those partitions within ``budget_s`` seconds. A lowering that adds
    functions of its own to the module (tuned kernels the partitions call) gives ``lower_module(mod,
    function_names, target)``, the whole module lowered, instead of ``lowering`` (None then).
    """
    if lowering is not None and lower_module is not None:
        raise TypeError(f"the hooks declared for {backend_name!r} give both lowering and lower_module: one lowers their partitions")

    def serves(target: tvm.target.Target) -> bool:
        return target_kinds is None or target.kind.name in target_kinds

    @hookimpl
    def collage_register_backends(register):
        backend = describe()
        if backend.name != backend_name:
            raise ValueError(f"the hooks declared for {backend_name!r} describe a backend named {backend.name!r}")
        register(backend)

    @hookimpl_for(backend_name)
    def collage_check_availability(backend):
        reason = missing()
        return Availability.yes() if reason is None else Availability.no(reason)

    @hookimpl_for(backend_name)
    def collage_contribute_patterns(backend, target, precision):
        return patterns(target, precision) if serves(target) else []

    @hookimpl_for(backend_name)
    def collage_lower_partitions(backend, mod, function_names, target):
        if lower_module is not None:
            return lower_module(mod, function_names, target)
        return replace_functions(mod, function_names, lowering(mod, function_names, target))

    @hookimpl_for(backend_name)
    def collage_prepare_runtime(backend):
        prepare_runtime()
        return True

    @hookimpl_for(backend_name)
    def collage_runtime_libraries(backend):
        return runtime_libraries()

    @hookimpl_for(backend_name)
    def collage_lower_whole_model(backend, model, model_format, func, name, target):
        return lower_whole_model(model, model_format, func, name, target) if serves(target) else None

    @hookimpl_for(backend_name)
    def collage_tune_partitions(backend, mod, function_names, target, budget_s):
        return tune_partitions(mod, function_names, target, budget_s) if serves(target) else None

    return BackendHooks(
        collage_register_backends,
        collage_check_availability,
        collage_contribute_patterns,
        collage_lower_partitions,
        collage_prepare_runtime,
        collage_runtime_libraries if runtime_libraries is not None else None,
        collage_lower_whole_model if lower_whole_model is not None else None,
        collage_tune_partitions if tune_partitions is not None else None,
    )


def reason_raised_by(check: Callable[[], object], unavailable: type[Exception]) -> Callable[[], Optional[str]]:
    """A ``missing`` for :func:`backend_hooks` from a ``check()`` that raises ``unavailable`` saying what is
    missing: the message of what it raised, or None when it returned."""

    def missing() -> Optional[str]:
        try:
            check()
        except unavailable as error:
            return str(error)
        return None

    return missing


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
) -> BackendHooks:
    """Declare a native-kernel backend once (:func:`backend_hooks`); the kit implements its hooks.

    ``describe()`` is its ``Backend`` (called when backends are registered); ``load()`` builds and loads its
    kernel library, registering the functions its partitions call, and raises ``unavailable`` saying what is
    missing (its message is the availability's reason); ``patterns(precision)`` are its patterns on a target
    of ``target_kinds`` (none elsewhere); ``lower_function(func, name)`` lowers one partition
    (``replace_functions``); ``built_library()`` is the kernel library, built without a device, that exports carry.
    """
    return backend_hooks(
        backend_name,
        describe=describe,
        missing=reason_raised_by(load, unavailable),
        target_kinds=target_kinds,
        patterns=lambda target, precision: patterns(precision),
        lowering=lambda mod, function_names, target: lower_function,
        prepare_runtime=load,  # registers the kernels' functions; raises `unavailable` saying what is missing
        runtime_libraries=lambda: [built_library()],
    )


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
) -> BackendHooks:
    """Declare a graph-level engine once (:func:`backend_hooks`); the kit implements its hooks.

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

    def engine_missing() -> Optional[str]:
        module = imported()
        return import_failure(module) if isinstance(module, ImportError) else missing(module)

    def prepare_runtime() -> None:
        module = imported()
        if isinstance(module, ImportError):
            raise RuntimeError(import_failure(module))
        register_runtime()

    def operator_patterns(target: tvm.target.Target, precision: str) -> list[Pattern]:
        return engine_patterns.operator_patterns(backend_name, sixteen_bit=sixteen_bit() if sixteen_bit else frozenset())

    def whole_model(model: bytes, model_format: str, func: relax.Function, name: str, target: tvm.target.Target):
        return whole_onnx_model(model, func, name) if model_format == "onnx" else None

    return backend_hooks(
        backend_name,
        describe=lambda: describe(getattr(imported(), "__version__", "not installed")),
        missing=engine_missing,
        target_kinds=target_kinds,
        patterns=operator_patterns,
        lowering=lowering,
        prepare_runtime=prepare_runtime,
        lower_whole_model=whole_model if whole_onnx_model is not None else None,
    )
