"""Regional compilation for the ``capture`` pass (``capture: {regions: [...]}``).

A model made of N identical blocks (transformer layers) captured whole gives Dynamo one graph N
blocks long, and the graph passes do N times the same work. With ``regions`` naming the block's
class, the model's own code runs eagerly and every call of a block instance goes through one
Dynamo-compiled function per class, ``call_region(module, *args, **kwargs)``. Dynamo keys its
cache on that function's code object and inlines the module (parameters and buffers become graph
inputs, not constants; torch ≥ 2.5 always does this), so the first instance compiles one graph and
every other instance passes the same guards and reuses it: the block is compiled once.

What runs outside the named blocks (embeddings, the final norm, the head) runs eagerly, as with
torch's own regional compilation (``block.compile()`` per layer). The blocks are switched to the
compiled path only for the duration of a call of the compiled model, so the user's original
model object keeps running eagerly.

A block's forward hooks are compiled with it by default (``module._call_impl`` is traced). Hooks
Dynamo cannot trace (FSDP2's ``fully_shard`` wraps its all-gather and reshard hooks in
``torch._dynamo.disable``, so a traced ``_call_impl`` captures no graph) are kept out instead:
with ``region_hooks: eager`` (and ``auto`` for FSDP2 modules) the block's hooks run eagerly in
``nn.Module.__call__`` and only its class's ``forward`` is compiled, seeing the unsharded
parameters the pre-forward hook has put in place. This is what torchtitan gets by compiling each
block before sharding it."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from pipeline.errors import PipelineError, nearest

_serial = itertools.count(1)


def with_own_code(fn: Callable, prefix: str) -> Callable:
    """``fn`` with a fresh, uniquely named code object: Dynamo keeps its cache and counts recompiles
    per code object, and keys automatic-dynamic shape state on (file, line, name), so two functions
    compiled separately must share neither (else the second one's first call is compiled with
    dynamic shapes because the first one saw other sizes)."""
    name = f"{prefix}_{next(_serial)}"
    code = fn.__code__
    names = {"co_name": name, **({"co_qualname": name} if hasattr(code, "co_qualname") else {})}
    fn.__code__ = code.replace(**names)
    return fn


def region_class_name(cls: type) -> str:
    """The full name (``package.module.Class``) a plan may use for a region class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(cls: type, name: str) -> bool:
    """Whether a plan's region ``name`` names ``cls`` or a class it derives from (so a block class
    still matches after ``fully_shard`` swapped the instance's class for ``FSDP<Block>``)."""
    return any(name in (region_class_name(c), c.__name__) for c in cls.__mro__
               if c not in (torch.nn.Module, object))


def find_regions(model: torch.nn.Module, names: list[str] | tuple[str, ...]) -> dict[type, list[torch.nn.Module]]:
    """The instances of each named class among ``model``'s submodules (the model itself excluded).
    A name matches a class by its full name or its bare class name, its own or a base class's; a
    name nothing matches is a :class:`PipelineError` listing the classes the model has."""
    found: dict[type, list[torch.nn.Module]] = {}
    classes: dict[str, type] = {}
    for _, module in model.named_modules():
        if module is model:
            continue
        cls = type(module)
        classes[region_class_name(cls)] = cls
        if any(_matches(cls, name) for name in names):
            found.setdefault(cls, []).append(module)
    for name in names:
        if not any(_matches(c, name) for c in found):
            known = sorted({c.__name__ for c in classes.values()})
            guess = nearest(name, known + sorted(classes))
            hint = f" (did you mean '{guess}'?)" if guess else ""
            raise PipelineError(f"capture.regions names '{name}', but {type(model).__name__} has no submodule of "
                                f"that class{hint}. Its submodule classes: {', '.join(known) or 'none'}.")
    return found


def _region_function(cls: type) -> Callable:
    """A fresh function (its own code object, so its own Dynamo cache) calling a module of ``cls``."""

    def call_region(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    return with_own_code(call_region, f"region_{cls.__name__}")


def _forward_function(cls: type) -> Callable:
    """A fresh function calling only ``cls.forward`` on a module: its hooks stay outside, eager."""
    forward = cls.forward

    def call_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return forward(module, *args, **kwargs)

    return with_own_code(call_forward, f"region_forward_{cls.__name__}")


def hooks_run_eagerly(cls: type, region_hooks: str) -> bool:
    """Whether instances of ``cls`` get eager hooks and a compiled ``forward`` (``region_hooks``:
    ``eager``; ``auto`` for FSDP2 modules, whose hooks Dynamo does not trace)."""
    if region_hooks != "auto":
        return region_hooks == "eager"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:   # a torch built without torch.distributed
        return False
    return issubclass(cls, FSDPModule)


def sharded_block_classes(model: Any) -> list[str]:
    """The class names of ``model``'s FSDP2-sharded submodules below the root (what to name in
    ``capture.regions``), or ``[]``; Dynamo captures no graph through their hooks."""
    if not isinstance(model, torch.nn.Module):
        return []
    names = []
    for module in model.modules():
        if module is not model and hooks_run_eagerly(type(module), "auto"):
            base = next((c for c in type(module).__mro__[1:] if not c.__module__.startswith("torch.distributed")),
                        type(module))
            if base.__name__ not in names:
                names.append(base.__name__)
    return names


_MISSING = object()


class RegionalRunner:
    """Calls the model eagerly with every instance of the region classes running through its
    class's compiled function: in place of the whole ``_call_impl`` (hooks compiled with the block),
    or in place of ``forward`` (hooks eager, see :func:`hooks_run_eagerly`)."""

    def __init__(self, model: Any, names: list[str] | tuple[str, ...], compile_fn: Callable[[Callable], Callable],
                 region_hooks: str = "auto"):
        if not isinstance(model, torch.nn.Module):
            raise PipelineError("capture.regions needs an nn.Module to look for block classes in, got "
                                f"{type(model).__name__}; compile the function without regions.")
        self.model = model
        self.instances: list[tuple[torch.nn.Module, Callable]] = []    # compiled _call_impl
        self.forwards: list[tuple[torch.nn.Module, Callable]] = []     # compiled forward, eager hooks
        for cls, modules in find_regions(model, names).items():
            eager_hooks = hooks_run_eagerly(cls, region_hooks)
            compiled = compile_fn(_forward_function(cls) if eager_hooks else _region_function(cls))
            for module in modules:
                (self.forwards if eager_hooks else self.instances).append((module, _bind(compiled, module)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        previous = [module._compiled_call_impl for module, _ in self.instances]
        own_forwards = [module.__dict__.get("forward", _MISSING) for module, _ in self.forwards]
        for module, call in self.instances:
            module._compiled_call_impl = call
        for module, call in self.forwards:
            module.forward = call
        try:
            return self.model(*args, **kwargs)
        finally:
            for (module, _), before in zip(self.instances, previous):
                module._compiled_call_impl = before
            for (module, _), before in zip(self.forwards, own_forwards):
                if before is _MISSING:
                    del module.forward
                else:
                    module.forward = before


def _bind(compiled: Callable, module: torch.nn.Module) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(module, *args, **kwargs)
    return call


__all__ = ["RegionalRunner", "find_regions", "hooks_run_eagerly", "region_class_name", "sharded_block_classes"]
