"""The pass manager: runs a plan's graph passes in order on one captured graph.

Between passes it checks the structural validity of the graph, the requires/provides contract,
and (when the plan verifies) the invariant checks plugins registered for the tags a pass claims.
Before/after hooks wrap every pass; timing, snapshots and dumps are such hooks (``instruments``).
"""
from __future__ import annotations

from typing import Any

import torch.fx

from pipeline import compat
from pipeline.errors import PassFailure, PipelineError
from pipeline.graph_pass import Pass, PassContext
from pipeline.registry import PluginInfo, Registry


class BoundPass:
    """A pass instance bound to one compile, with the plugin that registered its class."""

    def __init__(self, instance: Pass, plugin: PluginInfo):
        self.instance = instance
        self.plugin = plugin

    @property
    def name(self) -> str:
        """The pass's registered name."""
        return self.instance.name


class PassManager:
    """Runs graph passes over one graph under a plan's policies."""

    def __init__(self, passes: list[BoundPass], *, registry: Registry, plugin_manager: Any,
                 check_invariants: bool):
        self.passes = passes
        self.registry = registry
        self.pm = plugin_manager
        self.check_invariants = check_invariants

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        """Apply every pass to ``graph``; raise :class:`PassFailure` naming the pass and plugin."""
        for bound in self.passes:
            cls = type(bound.instance)
            context.current_pass = bound.name
            missing = set(cls.requires) - context.tags
            if missing:
                raise PassFailure(
                    f"pass '{bound.name}' ({bound.plugin}) requires {', '.join(sorted(missing))} but the "
                    f"graph {context.graph_id} only has {', '.join(sorted(context.tags)) or 'no tags'}",
                    pass_name=bound.name, plugin=str(bound.plugin), graph_id=context.graph_id)
            self._call_hook("pipeline_before_pass", bound, graph, context)
            try:
                result = bound.instance.run(graph, context)
            except (PipelineError, *compat.restart_exceptions()):
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised naming the pass and its plugin
                raise PassFailure(
                    f"pass '{bound.name}' from plugin {bound.plugin} failed on graph {context.graph_id}: "
                    f"{type(exc).__name__}: {exc}",
                    pass_name=bound.name, plugin=str(bound.plugin), graph_id=context.graph_id) from exc
            if not isinstance(result, torch.fx.GraphModule):
                raise PassFailure(
                    f"pass '{bound.name}' from plugin {bound.plugin} returned {type(result).__name__}, "
                    f"not a torch.fx.GraphModule", pass_name=bound.name, plugin=str(bound.plugin),
                    graph_id=context.graph_id)
            try:
                result.graph.lint()
            except Exception as exc:  # noqa: BLE001 - a malformed graph is the pass's fault
                raise PassFailure(
                    f"pass '{bound.name}' from plugin {bound.plugin} produced a malformed graph: {exc}",
                    pass_name=bound.name, plugin=str(bound.plugin), graph_id=context.graph_id) from exc
            graph = result
            context.tags -= set(cls.invalidates)
            provided = set(cls.provided(bound.instance.options))
            context.tags |= provided
            if self.check_invariants:
                self._check_invariants(bound, graph, context, provided)
            self._call_hook("pipeline_after_pass", bound, graph, context)
        context.current_pass = None
        return graph

    def _call_hook(self, hook_name: str, bound: BoundPass, graph: Any, context: PassContext) -> None:
        hook = getattr(self.pm.hook, hook_name)
        kwargs = {"pass_": bound.instance, "graph": graph, "context": context}
        for impl in reversed(hook.get_hookimpls()):
            try:
                # Like pluggy, pass only the arguments an implementation declares (any subset).
                impl.function(**{name: kwargs[name] for name in impl.argnames})
            except PipelineError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised naming the hook's plugin
                who = self._plugin_name(impl.plugin)
                raise PassFailure(
                    f"plugin {who} raised in {hook_name} around pass '{bound.name}' on graph "
                    f"{context.graph_id}: {type(exc).__name__}: {exc}",
                    pass_name=bound.name, plugin=who, graph_id=context.graph_id) from exc

    def _plugin_name(self, obj: Any) -> str:
        for info in self.registry.plugins:
            if info.obj is obj:
                return str(info)
        return getattr(obj, "__name__", type(obj).__name__)

    def _check_invariants(self, bound: BoundPass, graph: torch.fx.GraphModule, context: PassContext,
                          provided: set[str]) -> None:
        for tag in sorted(provided):
            for check, info in self.registry.invariants.get(tag, []):
                try:
                    problem = check(graph)
                except Exception as exc:  # noqa: BLE001 - a crashing check is reported with its plugin
                    raise PassFailure(
                        f"the invariant check for '{tag}' from plugin {info} raised after pass "
                        f"'{bound.name}' on graph {context.graph_id}: {type(exc).__name__}: {exc}",
                        pass_name=bound.name, plugin=str(info), graph_id=context.graph_id) from exc
                if problem:
                    raise PassFailure(
                        f"pass '{bound.name}' ({bound.plugin}) claims '{tag}' but the graph it produced "
                        f"breaks it (check from {info}): {problem}",
                        pass_name=bound.name, plugin=str(bound.plugin), graph_id=context.graph_id)
