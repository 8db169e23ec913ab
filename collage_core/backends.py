"""Asking the plugins which backends exist, whether they run here and what patterns they bring."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Sequence

import attrs

from collage_core.errors import CollageError, reraise_interrupt
from collage_core.model.dtypes import FP32, TF32, computes_tf32
from collage_core.plugins import CollagePluginManager, PluginFailure, call_each, first_result
from collage_core.records import OP_LEVEL, Availability, Backend, Pattern

if TYPE_CHECKING:
    import tvm

log = logging.getLogger("collage")


class BackendError(CollageError):
    """A backend was asked for that is not installed or cannot run, or a plugin broke its contract."""


@attrs.frozen
class BackendInfo:
    backend: Backend
    plugin: str
    availability: Availability

    @property
    def name(self) -> str:
        return self.backend.name


def discover_backends(pm: CollagePluginManager) -> dict[str, BackendInfo]:
    """All registered backends by name, each with the plugin that registered it and its availability."""
    registered: dict[str, tuple[Backend, str]] = {}
    for plugin_name, _, error in _registering(pm, registered):
        failure = PluginFailure(plugin_name, f"collage_register_backends raised {error}")
        if error and failure not in pm.failures:
            pm.failures.append(failure)
    infos = {}
    for name, (backend, plugin_name) in sorted(registered.items()):
        infos[name] = BackendInfo(backend, plugin_name, _availability(pm, backend, plugin_name))
    return infos


def registered_backends(pm: CollagePluginManager) -> dict[str, Backend]:
    """The registered backends by name, without asking whether they run here (a plugin that raises is left out)."""
    registered: dict[str, tuple[Backend, str]] = {}
    for _ in _registering(pm, registered):
        pass
    return {name: backend for name, (backend, _) in sorted(registered.items())}


def preload(pm: CollagePluginManager, backends: dict[str, Backend], device_kind: str = "cpu") -> None:
    """Ask each backend that serves only ``device_kind`` whether it is available, so that its plugin
    imports its library now (a zygote does this once for every worker it forks); answers are dropped."""
    for backend in backends.values():
        if set(backend.device_kinds) == {device_kind}:
            first_result(pm.hook.collage_check_availability, backend=backend)


def _registering(pm, registered):
    current = {"plugin": None}

    def register(backend: Backend):
        if not isinstance(backend, Backend):
            raise BackendError(f"plugin {current['plugin']} registered {backend!r}, not a Backend")
        if backend.name in registered:
            owner = registered[backend.name][1]
            raise BackendError(f"backend {backend.name!r} of plugin {current['plugin']} is already registered by {owner}")
        registered[backend.name] = (backend, current["plugin"])

    for impl in reversed(pm.hook.collage_register_backends.get_hookimpls()):
        current["plugin"] = impl.plugin_name
        try:
            impl.function(register=register)
        except BackendError:
            raise
        except Exception as error:
            reraise_interrupt(error)
            yield impl.plugin_name, None, f"{type(error).__name__}: {error}"


def _availability(pm, backend: Backend, plugin_name: str) -> Availability:
    availability, errors = first_result(pm.hook.collage_check_availability, backend=backend)
    if availability is None:
        if errors:
            return Availability.no("; ".join(errors))
        return Availability.no(f"plugin {plugin_name} does not say whether {backend.name} is available")
    return availability


def select_backends(
    infos: dict[str, BackendInfo], names: Optional[Sequence[str]] = None, target: Optional[tvm.target.Target] = None
) -> list[BackendInfo]:
    """The backends to place on: the named ones (each must be available) or every available one that
    is chosen by default on ``target``'s kind of device (without a target: every available one chosen
    by default on all its devices)."""
    if names is None:
        chosen = [info for info in infos.values() if info.availability.available and chosen_by_default(info, target)]
        if not chosen:
            raise BackendError("no backend is available; run `collage backends` to see why")
        return chosen
    chosen = []
    for name in dict.fromkeys(names):  # a backend named twice is chosen once
        if name not in infos:
            raise _unknown(name, infos)
        if not infos[name].availability.available:
            raise BackendError(f"backend {name} is not available: {infos[name].availability.reason}")
        chosen.append(infos[name])
    return chosen


def refuse_unknown_backends(pm: CollagePluginManager, names: Optional[Sequence[str]]) -> None:
    """:class:`BackendError` naming the first of ``names`` no installed plugin registers, and the installed ones;
    asks no backend whether it runs here (that is :func:`select_backends`' question, after the import)."""
    known = registered_backends(pm)
    for name in names or ():
        if name not in known:
            raise _unknown(name, known)


def _unknown(name: str, known) -> BackendError:
    return BackendError(f"unknown backend {name!r} (installed: {', '.join(known) or 'none'})")


def backends_for(pm: CollagePluginManager, names, target) -> list[BackendInfo]:
    """The backends a run places on: those :func:`select_backends` chooses (``names``, or by default) that
    serve ``target``; each plugin that failed to load is warned of."""
    infos = discover_backends(pm)
    for failure in pm.failures:
        log.warning("plugin %s: %s", failure.name, failure.reason)
    chosen = [info for info in select_backends(infos, names, target) if serves(info, target)]
    if not chosen:
        raise CollageError(f"none of the selected backends runs on target {target.kind.name}")
    return chosen


def whole_model_builder(chosen: Sequence[BackendInfo]) -> Optional[str]:
    """The first of ``chosen`` that is an op-level backend building whole models (``Backend.builds_whole_models``:
    TVM), whose build of the whole model as one partition is the unpartitioned baseline; None when none is."""
    return next((info.name for info in chosen if info.backend.kind == OP_LEVEL and info.backend.builds_whole_models), None)


def device_kind(target) -> str:
    """The kind of device ``target`` runs on, as backends name it in ``device_kinds`` (``llvm`` is the CPU)."""
    return "cpu" if target.kind.name == "llvm" else target.kind.name


def chosen_by_default(info: BackendInfo, target=None) -> bool:
    """Whether the backend is placed on without being named, on ``target``'s kind of device (without a
    target: only a backend chosen by default on every device it serves)."""
    default = info.backend.chosen_by_default
    if isinstance(default, bool):
        return default
    return target is not None and device_kind(target) in default


def serves(info: BackendInfo, target) -> bool:
    """Whether the backend runs on ``target``'s kind of device (``llvm`` is the CPU)."""
    return device_kind(target) in info.backend.device_kinds


def contribute_patterns(pm: CollagePluginManager, backend: Backend, target: tvm.target.Target, precision: str = FP32) -> list[Pattern]:
    """The patterns every plugin contributes for ``backend`` at ``precision``; a plugin that raises is skipped
    with a warning. A TF32 pattern contributed at another precision is an error naming the plugin."""
    patterns: list[Pattern] = []
    calls = call_each(pm.hook.collage_contribute_patterns, backend=backend, target=target, precision=precision)
    for plugin_name, result, error in calls:
        if error:
            log.warning("plugin %s: collage_contribute_patterns raised %s; its patterns are left out", plugin_name, error)
            continue
        for pattern in result or ():
            if not isinstance(pattern, Pattern) or pattern.backend != backend.name:
                raise BackendError(f"plugin {plugin_name} contributed {pattern!r} for backend {backend.name}")
            if computes_tf32(pattern.name) and precision != TF32:
                raise BackendError(f"plugin {plugin_name} contributed the TF32 pattern {pattern.name} at precision {precision}")
            patterns.append(pattern)
    return patterns
