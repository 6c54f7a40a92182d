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
model object keeps running eagerly."""
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


def find_regions(model: torch.nn.Module, names: list[str] | tuple[str, ...]) -> dict[type, list[torch.nn.Module]]:
    """The instances of each named class among ``model``'s submodules (the model itself excluded).
    A name matches a class by its full name or its bare class name; a name nothing matches is a
    :class:`PipelineError` listing the classes the model has."""
    found: dict[type, list[torch.nn.Module]] = {}
    classes: dict[str, type] = {}
    for _, module in model.named_modules():
        if module is model:
            continue
        cls = type(module)
        classes[region_class_name(cls)] = cls
        if region_class_name(cls) in names or cls.__name__ in names:
            found.setdefault(cls, []).append(module)
    for name in names:
        if not any(name in (region_class_name(c), c.__name__) for c in found):
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


class RegionalRunner:
    """Calls the model eagerly with every instance of the region classes running through its
    class's compiled function."""

    def __init__(self, model: Any, names: list[str] | tuple[str, ...], compile_fn: Callable[[Callable], Callable]):
        if not isinstance(model, torch.nn.Module):
            raise PipelineError("capture.regions needs an nn.Module to look for block classes in, got "
                                f"{type(model).__name__}; compile the function without regions.")
        self.model = model
        self.instances: list[tuple[torch.nn.Module, Callable]] = []
        for cls, modules in find_regions(model, names).items():
            compiled = compile_fn(_region_function(cls))
            for module in modules:
                self.instances.append((module, _bind(compiled, module)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        previous = [module._compiled_call_impl for module, _ in self.instances]
        for module, call in self.instances:
            module._compiled_call_impl = call
        try:
            return self.model(*args, **kwargs)
        finally:
            for (module, _), before in zip(self.instances, previous):
                module._compiled_call_impl = before


def _bind(compiled: Callable, module: torch.nn.Module) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(module, *args, **kwargs)
    return call


__all__ = ["RegionalRunner", "find_regions", "region_class_name"]
