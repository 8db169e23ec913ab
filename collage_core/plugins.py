"""The plugin manager factory: specs, blocked names, entry points, extra modules, then a check."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import Any, Iterable, Optional

import attrs
import pluggy

from collage_core import hookspecs
from collage_core.errors import reraise_interrupt

ENTRY_POINT_GROUP = hookspecs.PROJECT
ALLOW_ENV = "COLLAGE_PLUGINS"
DISABLE_ENV = "COLLAGE_DISABLE_PLUGINS"


@attrs.frozen
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    name: str
    reason: str


class CollagePluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers the plugins that failed to load."""

    def __init__(self):
        super().__init__(hookspecs.PROJECT)
        self.failures: list[PluginFailure] = []

    def module_plugin_names(self) -> list[str]:
        """Importable names of the module plugins, so a worker process can load the same set."""
        return [plugin.__name__ for plugin in self.get_plugins() if isinstance(plugin, type(os))]


def call_each(hook, **kwargs):
    """Call each implementation of ``hook`` in pluggy's order, on its own, so one plugin's exception spares the rest.

    Yields ``(plugin_name, result, error)``; ``error`` is ``"Type: message"`` or None. As pluggy does,
    each implementation gets only the arguments it names, so a hook can gain an argument without
    breaking plugins written before it.
    """
    for impl in reversed(hook.get_hookimpls()):
        try:
            yield (impl.plugin_name, impl.function(**{name: kwargs[name] for name in impl.argnames if name in kwargs}), None)
        except Exception as error:
            reraise_interrupt(error)
            yield impl.plugin_name, None, f"{type(error).__name__}: {error}"


def first_result(hook, **kwargs) -> tuple[Any, list[str]]:
    """A firstresult hook called plugin by plugin: the first non-None result, and the errors met before it."""
    errors = []
    for plugin_name, result, error in call_each(hook, **kwargs):
        if error:
            errors.append(f"plugin {plugin_name}: {hook.name} raised {error}")
        elif result is not None:
            return result, errors
    return None, errors


def disabled_plugin_names(environ=os.environ) -> set[str]:
    return {name.strip() for name in environ.get(DISABLE_ENV, "").split(",") if name.strip()}


def allowed_plugin_names(environ=os.environ) -> Optional[set[str]]:
    """The only entry-point plugins to load (``$COLLAGE_PLUGINS``, comma-separated), or None for all."""
    if ALLOW_ENV not in environ:
        return None
    return {name.strip() for name in environ[ALLOW_ENV].split(",") if name.strip()}


def get_plugin_manager(
    *, disabled: Optional[Iterable[str]] = None, load_entry_points: bool = True, extra_modules: Iterable[str] = ()
) -> CollagePluginManager:
    """Make the plugin manager every part of Collage uses.

    ``disabled`` names plugins (entry-point names or module names) not to load; by default they
    come from ``$COLLAGE_DISABLE_PLUGINS`` (comma-separated). When ``$COLLAGE_PLUGINS`` is set,
    only the entry-point plugins it names are imported at all (an allow list: nothing else
    installed in the environment runs). A plugin whose import fails is
    recorded in ``failures`` and the others still load. ``extra_modules`` are imported and
    registered too (how a measurement worker loads the plugins its parent had).
    """
    pm = CollagePluginManager()
    pm.add_hookspecs(hookspecs)
    blocked = disabled_plugin_names() if disabled is None else set(disabled)
    for name in blocked:
        pm.set_blocked(name)
    if load_entry_points:
        allowed = allowed_plugin_names()
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry_point.name in blocked or pm.has_plugin(entry_point.name):
                continue
            if allowed is not None and entry_point.name not in allowed:
                continue
            try:
                plugin = entry_point.load()
            except Exception as error:  # a broken plugin must not take the others down
                reraise_interrupt(error)
                pm.failures.append(PluginFailure(entry_point.name, f"import failed: {type(error).__name__}: {error}"))
                continue
            if plugin.__name__ not in blocked:
                pm.register(plugin, name=entry_point.name)
    for module_name in extra_modules:
        if module_name in blocked or any(p.__name__ == module_name for p in pm.get_plugins() if hasattr(p, "__name__")):
            continue
        try:
            pm.register(importlib.import_module(module_name), name=module_name)
        except Exception as error:
            reraise_interrupt(error)
            pm.failures.append(PluginFailure(module_name, f"import failed: {type(error).__name__}: {error}"))
    pm.check_pending()
    return pm
