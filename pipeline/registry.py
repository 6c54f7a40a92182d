"""Plugin discovery and the checked registry of passes, plans and invariant checks.

Plugins come from the ``pipeline.plugins`` entry-point group (built-in passes included: they are
declared there by this project's own distribution) and from :func:`register_plugin`. Every
registration is checked when it happens; errors name the plugin's distribution and module.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterable

import attrs
import pluggy

from pipeline.errors import RegistrationError, did_you_mean
from pipeline.graph_pass import CapturePass, Pass, SplitPass
from pipeline.hooks import ENTRY_POINT_GROUP, PROJECT, PipelineSpecs
from pipeline.metrics import ExpectationFields, Metric, limit_fields
from pipeline.options import option_class_problem

OWN_DISTRIBUTION = "plan-pipeline"
BUILTIN_MODULE = "passes"
AUTOLOAD_ENV = "PIPELINE_DISABLE_PLUGIN_AUTOLOAD"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@attrs.frozen
class PluginInfo:
    """Where a plugin came from: shown in every error and report that involves it."""

    module: str
    distribution: str | None = None
    version: str | None = None
    obj: Any = attrs.field(default=None, eq=False, repr=False)

    def __str__(self) -> str:
        if self.distribution:
            return f"{self.distribution} {self.version or ''} ({self.module})".replace("  ", " ")
        return self.module


@attrs.frozen
class PassEntry:
    """A registered pass class and the plugin that registered it."""

    cls: type
    plugin: PluginInfo


@attrs.frozen
class PlanEntry:
    """A plan file found by name, and the plugin that shipped it."""

    path: Path
    plugin: PluginInfo


def new_plugin_manager() -> pluggy.PluginManager:
    """A fresh pluggy manager with this project's hook specifications."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(PipelineSpecs)
    return pm


class Registry:
    """Every loaded plugin with the passes, plans and invariant checks it registered."""

    def __init__(self) -> None:
        self.plugins: list[PluginInfo] = []
        self.passes: dict[str, PassEntry] = {}
        self.plans: dict[str, PlanEntry] = {}
        self.invariants: dict[str, list[tuple[Any, PluginInfo]]] = {}
        self.metrics: dict[str, Metric] = {}
        self.metric_plugins: dict[str, PluginInfo] = {}
        # Installed plugin distributions skipped because autoload is off (PIPELINE_DISABLE_PLUGIN_AUTOLOAD).
        self.not_autoloaded: list[PluginInfo] = []

    # -- loading -------------------------------------------------------------------------------
    def add_plugin(self, obj: Any, *, distribution: str | None = None,
                   version: str | None = None) -> PluginInfo:
        """Register ``obj`` (a module or object with hook implementations) and collect what it
        provides. Raises :class:`RegistrationError` naming the plugin on any problem."""
        if isinstance(obj, type):
            module = f"{obj.__module__}.{obj.__qualname__}"
        else:
            module = getattr(obj, "__name__", None) or f"{type(obj).__module__}.{type(obj).__qualname__}"
        info = PluginInfo(module=module, distribution=distribution, version=version, obj=obj)
        if any(p.obj is obj for p in self.plugins):
            return next(p for p in self.plugins if p.obj is obj)
        pm = new_plugin_manager()
        try:
            pm.register(obj)
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise RegistrationError(f"plugin {info}: {exc}{_unknown_hook_hint(obj)}") from None
        if not pm.get_hookcallers(obj):
            raise RegistrationError(
                f"plugin {info} implements no pipeline hooks: mark functions such as "
                f"pipeline_register_passes with @pipeline.hookimpl")
        passes = self._collect(pm, "pipeline_register_passes", info)
        plans = self._collect(pm, "pipeline_register_plans", info)
        invariants = self._collect(pm, "pipeline_register_invariants", info)
        metrics = self._collect(pm, "pipeline_register_metrics", info)
        new_metrics = self._check_metrics(metrics, info)
        new_passes = {}
        for cls in passes:
            self._check_pass_class(cls, info)
            other = self.passes.get(cls.name) or new_passes.get(cls.name)
            if other is not None:
                raise RegistrationError(
                    f"pass name '{cls.name}' is registered twice: by {other.plugin} "
                    f"({other.cls.__module__}.{other.cls.__qualname__}) and by {info} "
                    f"({cls.__module__}.{cls.__qualname__}); pass names must be unique")
            new_passes[cls.name] = PassEntry(cls, info)
        new_plans = {}
        for path in plans:
            for plan_path in _plan_files(path, info):
                name = plan_path.stem
                other = self.plans.get(name) or new_plans.get(name)
                if other is not None and other.path.resolve() != plan_path.resolve():
                    raise RegistrationError(
                        f"plan name '{name}' is shipped twice: {other.path} by {other.plugin} and "
                        f"{plan_path} by {info}")
                new_plans[name] = PlanEntry(plan_path, info)
        for mapping in invariants:
            if not isinstance(mapping, dict):
                raise RegistrationError(f"plugin {info}: pipeline_register_invariants must return a "
                                        f"dict of tag -> check, got {type(mapping).__name__}")
            for tag, check in mapping.items():
                if not callable(check):
                    raise RegistrationError(f"plugin {info}: invariant check for '{tag}' is not callable")
                self.invariants.setdefault(tag, []).append((check, info))
        self.passes.update(new_passes)
        self.plans.update(new_plans)
        self.metrics.update(new_metrics)
        self.metric_plugins.update({name: info for name in new_metrics})
        self.plugins.append(info)
        return info

    @staticmethod
    def _collect(pm: pluggy.PluginManager, hook_name: str, info: PluginInfo) -> list:
        try:
            results = getattr(pm.hook, hook_name)()
        except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
            raise RegistrationError(f"plugin {info} raised in {hook_name}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        out: list = []
        for result in results:
            if result is None:
                continue
            if hook_name == "pipeline_register_invariants":
                out.append(result)
            elif isinstance(result, (list, tuple)):
                out.extend(result)
            else:
                raise RegistrationError(f"plugin {info}: {hook_name} must return a list, got "
                                        f"{type(result).__name__}")
        return out

    def _check_metrics(self, metrics: list, info: PluginInfo) -> dict[str, Metric]:
        new: dict[str, Metric] = {}
        keys = {key: self.metric_plugins[m.name] for key, (m, _) in limit_fields(self.metrics).items()}
        reserved = {f.name for f in attrs.fields(ExpectationFields)}
        for metric in metrics:
            if not isinstance(metric, Metric):
                raise RegistrationError(f"plugin {info}: pipeline_register_metrics must return "
                                        f"pipeline.Metric objects, got {type(metric).__name__}")
            if metric.name in self.metrics or metric.name in new:
                other = self.metric_plugins.get(metric.name, info)
                raise RegistrationError(f"metric '{metric.name}' is registered twice: by {other} and by {info}")
            problem = option_class_problem(metric.limits)
            if problem:
                raise RegistrationError(f"plugin {info}: metric '{metric.name}' has a limits class that {problem}")
            for f in attrs.fields(metric.limits):
                if f.name in keys or f.name in reserved:
                    owner = keys.get(f.name, "the engine")
                    raise RegistrationError(f"plugin {info}: metric '{metric.name}' declares expect key "
                                            f"'{f.name}', which {owner} already declares")
                keys[f.name] = info
            new[metric.name] = metric
        return new

    @staticmethod
    def _check_pass_class(cls: Any, info: PluginInfo) -> None:
        def fail(problem: str) -> RegistrationError:
            what = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else repr(cls)
            return RegistrationError(f"plugin {info}: pass {what} {problem}")

        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            raise fail("is not a subclass of pipeline.Pass")
        if not isinstance(cls.name, str) or not _NAME_RE.match(cls.name):
            raise fail(f"has name {cls.name!r}; a pass name is kebab-case, like 'fuse' or 'my-rewrite'")
        problem = option_class_problem(cls.Options)
        if problem:
            raise fail(f"has an Options class that {problem}")
        if not isinstance(cls.version, str) or not cls.version:
            raise fail("has no version string (it feeds the compile cache key)")
        for attr in ("requires", "provides", "invalidates"):
            tags = getattr(cls, attr)
            if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
                raise fail(f"has {attr}={tags!r}; it must be a set of tag strings")
        base, method = ((CapturePass, "capture") if issubclass(cls, CapturePass)
                        else (SplitPass, "split") if issubclass(cls, SplitPass) else (Pass, "run"))
        if getattr(cls, method) is getattr(base, method):
            raise fail(f"does not implement {method}()")

    # -- queries -------------------------------------------------------------------------------
    def pass_entry(self, name: str) -> PassEntry | None:
        """The registered pass called ``name``, or None."""
        return self.passes.get(name)

    def unknown_pass_hint(self, name: str) -> str:
        """A ``; did you mean ...`` suffix for an unknown pass name (see :func:`did_you_mean`), plus
        :meth:`autoload_hint`."""
        return did_you_mean(name, self.passes) + self.autoload_hint()

    def autoload_hint(self) -> str:
        """For an unknown pass or plan name: that plugin autoloading is off and which installed
        plugin distributions it skipped (one may provide the name), or '' when it skipped none."""
        if not self.not_autoloaded:
            return ""
        shown = ", ".join(str(info) for info in self.not_autoloaded)
        return (f"; plugins are not autoloaded ({AUTOLOAD_ENV} is set), so these installed plugin "
                f"distributions were not loaded: {shown}; unset {AUTOLOAD_ENV} to load them, or register "
                f"one with pipeline.register_plugin(module)")

    def plugin_manager(self, extra: Iterable[Any] = ()) -> pluggy.PluginManager:
        """A fresh manager holding every loaded plugin plus ``extra`` (per-compile instruments)."""
        pm = new_plugin_manager()
        for info in self.plugins:
            pm.register(info.obj)
        for obj in extra:
            pm.register(obj)
        return pm


def _unknown_hook_hint(obj: Any) -> str:
    """``; did you mean 'pipeline_register_passes'?`` for a misspelled hook name, else ''."""
    specs = [name for name in vars(PipelineSpecs) if name.startswith("pipeline_")]
    for name in dir(obj):
        if name.startswith("pipeline_") and name not in specs:
            return did_you_mean(name, specs)
    return ""


def _plan_files(path: Any, info: PluginInfo) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        return sorted(list(p.glob("*.yaml")) + list(p.glob("*.yml")))
    if p.is_file():
        return [p]
    raise RegistrationError(f"plugin {info}: plan path {str(p)!r} does not exist")


_lock = threading.RLock()
_registry: Registry | None = None
_extra_plugins: list[Any] = []


def autoload_enabled() -> bool:
    """False when ``PIPELINE_DISABLE_PLUGIN_AUTOLOAD`` is set (to 1, true, yes or on): then only the
    built-in passes are loaded from entry points."""
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in {"1", "true", "yes", "on"}


def _entry_points() -> list:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load_registry() -> Registry:
    registry = Registry()
    own_loaded = False
    autoload = autoload_enabled()
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        own = (dist_name or "").lower() == OWN_DISTRIBUTION or ep.value == BUILTIN_MODULE
        if not autoload and not own:
            skipped = PluginInfo(module=ep.value, distribution=dist_name, version=dist.version if dist else None)
            if skipped not in registry.not_autoloaded:
                registry.not_autoloaded.append(skipped)
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - reported with the distribution's name
            raise RegistrationError(
                f"plugin {dist_name or '?'} ({ep.value}) failed to import from entry point "
                f"'{ep.name}' in group {ENTRY_POINT_GROUP}: {type(exc).__name__}: {exc}") from exc
        registry.add_plugin(obj, distribution=dist_name, version=dist.version if dist else None)
        own_loaded = own_loaded or own
    if not own_loaded:
        # Running from a source tree without installing: the built-ins are still a plugin.
        registry.add_plugin(importlib.import_module(BUILTIN_MODULE),
                            distribution=f"{OWN_DISTRIBUTION} (source tree)")
    for obj in _extra_plugins:
        registry.add_plugin(obj)
    return registry


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = _load_registry()
        return _registry


def reload_registry() -> Registry:
    """Forget and re-discover all plugins (after installing one, or changing the autoload switch)."""
    global _registry
    with _lock:
        _registry = None
        return get_registry()


def register_plugin(obj: Any) -> PluginInfo:
    """Register a plugin object or module from code (no entry point needed); it stays registered
    across :func:`reload_registry` until :func:`unregister_plugin`."""
    with _lock:
        registry = get_registry()
        info = registry.add_plugin(obj)
        if obj not in _extra_plugins:
            _extra_plugins.append(obj)
        return info


def unregister_plugin(obj: Any) -> None:
    """Remove a plugin added with :func:`register_plugin`."""
    with _lock:
        if obj in _extra_plugins:
            _extra_plugins.remove(obj)
        reload_registry()
