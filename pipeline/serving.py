"""Serving runtime: the plan's declared shape buckets, warm-up, and compiler stances.

When a plan declares ``shapes:`` (see :mod:`pipeline.plan.shapes`), :func:`serve` wraps the capture
pass's runner in a :class:`BucketedRunner`. The padding lives here, in the engine, around whatever
the capture pass returned, so it works for every capture pass and knows no pass by name.

Per call it

1. pads every bucketed input dimension at its end, with the dimension's ``pad_value``, up to the
   smallest bucket of its axis that holds the call's size (dimensions are padded in increasing
   order; where padded regions overlap, the later dimension's ``pad_value`` fills them);
2. runs the compiled model on the padded inputs (after warm-up, under ``after_warmup``'s stance);
3. cuts the declared output dimensions (``shapes.outputs``) back to the call's size of their axis.

Padding appends elements after the real ones, so results at the real positions are exact for
models whose rows are independent along a padded dimension (a batch dimension) or that only look
backwards along it (causal attention over a sequence). A model that attends over the whole
sequence needs an attention-mask input bucketed on the same axis with ``pad_value: 0``, so the
padded positions are masked out.
"""
from __future__ import annotations

import bisect
import inspect
import itertools
import time
from typing import Any, Callable

import torch

from pipeline import compat
from pipeline.compilation import compilation_of
from pipeline.errors import PipelineError, RecompileError, ShapeError
from pipeline.plan.shapes import ShapeSettings
from pipeline.progress import WarmupProgress

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def planned_variants(settings: ShapeSettings) -> int:
    """How many compiled variants the declared buckets account for (0 when none are declared);
    a capture pass allows that many on top of its recompile limit."""
    return settings.combinations() if settings.buckets else 0


def serve(runner: Callable, model: Any, compilation: Any) -> Callable:
    """``runner`` wrapped to pad, warm up and switch stance as ``compilation.plan.shapes`` says
    (``runner`` itself when the plan declares nothing there)."""
    if compilation.plan.shapes == ShapeSettings():
        return runner
    wrapped = BucketedRunner(runner, model, compilation)
    compilation.serving = wrapped
    return wrapped


class _Input:
    """One bucketed input: where it is in a call, and its bucketed dimensions."""

    def __init__(self, key: Any, position: int | None, name: str | None, dims: list[tuple]):
        self.key = key
        self.position = position
        self.name = name
        self.dims = dims   # (dim, axis name, pad value, buckets), by dim

    def get(self, args: tuple, kwargs: dict) -> Any:
        if self.position is not None and self.position < len(args):
            return args[self.position]
        if self.name is not None:
            return kwargs.get(self.name)
        return None

    def put(self, args: tuple, kwargs: dict, value: Any) -> tuple[tuple, dict]:
        if self.position is not None and self.position < len(args):
            return args[:self.position] + (value,) + args[self.position + 1:], kwargs
        return args, {**kwargs, self.name: value}

    def label(self) -> str:
        return f"input '{self.name}'" if self.name is not None else f"input {self.position}"


class BucketedRunner:
    """The compiled model's runner behind the plan's shape buckets (module docstring)."""

    def __init__(self, runner: Callable, model: Any, compilation: Any):
        self.runner = runner
        self.compilation = compilation
        self.settings: ShapeSettings = compilation.plan.shapes
        self.buckets = {name: axis.buckets() for name, axis in self.settings.axes.items()}
        self.inputs = _locate_inputs(model, self.settings, compilation.plan)
        self.outputs = self.settings.outputs
        self.warmed = False
        after = self.settings.after_warmup
        self.after_stance = compat.ReusableStance(after) if after != "default" else None

    # -- one call -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sizes, padded_args, padded_kwargs = self.pad(args, kwargs)   # a call that does not fit fails first
        if not self.warmed and self.settings.warmup:
            self.warm_up(args, kwargs, call_if_unbucketed=False)
        args, kwargs = padded_args, padded_kwargs
        if not self.warmed:
            out = self.runner(*args, **kwargs)   # with nothing warmed up, the first call is the warm-up
            self.warmed = True
        else:
            out = self._run_after_warmup(args, kwargs)
        return self.slice_outputs(out, sizes) if self.outputs and sizes else out

    def _run_after_warmup(self, args: tuple, kwargs: dict) -> Any:
        after = self.settings.after_warmup
        if self.after_stance is None or compat.current_stance() != "default":   # a caller's stance wins
            return self.runner(*args, **kwargs)
        try:
            with self.after_stance:
                return self.runner(*args, **kwargs)
        except RecompileError as exc:
            shapes = ", ".join(f"{inp.label()} {tuple(value.shape)}" for inp in self.inputs
                               if isinstance(value := inp.get(args, kwargs), torch.Tensor))
            raise RecompileError(
                f"a call after warm-up needs a new compiled variant, and the plan sets shapes.after_warmup: "
                f"{after} (padded inputs: {shapes or 'none bucketed'}). {exc}") from None

    def pad(self, args: tuple, kwargs: dict) -> tuple[dict, tuple, dict]:
        """Pad the call's bucketed inputs; returns (the call's size of each axis, args, kwargs)."""
        sizes: dict[str, int] = {}
        for inp in self.inputs:
            value = inp.get(args, kwargs)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ShapeError(f"{inp.label()} has declared shape buckets but is a {type(value).__name__}, "
                                 f"not a tensor")
            padded = value
            for dim, axis, pad_value, buckets in inp.dims:
                size = self._size(inp, value, dim, axis, sizes)
                index = bisect.bisect_left(buckets, size)
                if index == len(buckets):
                    raise ShapeError(
                        f"{inp.label()} dimension {dim} has size {size}, above the largest bucket of axis "
                        f"'{axis}' ({_show(buckets)}) declared by plan '{self.compilation.plan.name}'. Split "
                        f"the request, or add a larger bucket to shapes.axes.{axis}.")
                if buckets[index] != size:
                    extra = list(padded.shape)
                    extra[dim] = buckets[index] - size
                    padded = torch.cat([padded, padded.new_full(extra, pad_value)], dim)
            if padded is value and not _dense(value):
                padded = _fresh_copy(value)   # as warm-up compiled it: Dynamo guards on strides too
            if padded is not value:
                args, kwargs = inp.put(args, kwargs, padded)
        return sizes, args, kwargs

    def _size(self, inp: _Input, value: torch.Tensor, dim: int, axis: str, sizes: dict) -> int:
        if dim >= value.dim():
            raise ShapeError(f"{inp.label()} has {value.dim()} dimension(s), but shapes.buckets declares "
                             f"buckets for its dimension {dim}")
        size = int(value.shape[dim])
        seen = sizes.setdefault(axis, size)
        if seen != size:
            raise ShapeError(f"{inp.label()} dimension {dim} has size {size}, but another input's dimension "
                             f"on the same axis '{axis}' has size {seen}; dimensions sharing an axis must "
                             f"have equal sizes")
        return size

    def slice_outputs(self, out: Any, sizes: dict) -> Any:
        """Cut the declared output dimensions back to the call's size of their axis."""
        for key, dims in self.outputs.items():
            value = _output_item(out, key)
            if not isinstance(value, torch.Tensor):
                raise ShapeError(f"output {key!r} declared in shapes.outputs is a {type(value).__name__}, "
                                 f"not a tensor")
            cut = value
            for dim, axis in dims.items():
                if axis not in sizes:
                    continue
                bucket = self.buckets[axis][bisect.bisect_left(self.buckets[axis], sizes[axis])]
                if dim >= cut.dim() or cut.shape[dim] != bucket:
                    got = f"size {cut.shape[dim]}" if dim < cut.dim() else f"{cut.dim()} dimension(s)"
                    raise ShapeError(f"output {key!r} dimension {dim} has {got}, but axis '{axis}' was padded "
                                     f"to {bucket}: shapes.outputs names a dimension that does not follow "
                                     f"the axis")
                cut = cut.narrow(dim, 0, sizes[axis])
            out = _with_output_item(out, key, cut)
        return out

    # -- warm-up ------------------------------------------------------------------------------------
    def warm_up(self, args: tuple, kwargs: dict, *, call_if_unbucketed: bool = True) -> dict:
        """Call the compiled model once per combination of the buckets of every axis the given
        inputs are padded along (each bucketed input tiled or cut to the combination's sizes),
        so each variant is compiled before serving. Returns and records what it did.

        When the call has no bucketed input, warm-up is the call itself: made here when
        ``call_if_unbucketed``, else left to the caller (the first served call)."""
        present = [inp for inp in self.inputs if isinstance(inp.get(args, kwargs), torch.Tensor)]
        axes = list(dict.fromkeys(axis for inp in present for _, axis, _, _ in inp.dims))
        if not axes and not call_if_unbucketed:
            return {"combinations": 0, "axes": {}}
        compilation = self.compilation
        recompiles, graphs = len(compilation.recompiles), len(compilation.graphs)
        start = time.perf_counter()
        count = 0
        combinations = list(itertools.product(*(self.buckets[axis] for axis in axes)))
        progress = WarmupProgress(len(combinations))
        for combination in combinations:
            target = dict(zip(axes, combination))
            call_args, call_kwargs = args, kwargs
            for inp in present:
                value = inp.get(args, kwargs)
                for dim, axis, _, _ in inp.dims:
                    value = _resize(value, dim, target[axis])
                call_args, call_kwargs = inp.put(call_args, call_kwargs, _fresh_copy(value))
            self.runner(*call_args, **call_kwargs)
            count += 1
            progress.bucket_done(count, target)
        self.warmed = True
        record = {"combinations": count, "axes": {axis: list(self.buckets[axis]) for axis in axes},
                  "graphs_compiled": len(compilation.graphs) - graphs,
                  "recompiles": (compilation.warmup or {}).get("recompiles", 0)
                  + len(compilation.recompiles) - recompiles,
                  "seconds": round(time.perf_counter() - start, 3)}
        compilation.warmup = record
        return record


def _dense(value: torch.Tensor) -> bool:
    """True when ``value`` has exactly the strides of a fresh tensor of its shape."""
    expected = 1
    for size, stride in zip(reversed(value.shape), reversed(value.stride())):
        if stride != expected:
            return False
        expected *= size
    return True


def _fresh_copy(value: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` with the strides of a fresh tensor (what padding produces), so every
    call of one bucket matches the variant warm-up compiled (Dynamo guards on strides too)."""
    out = torch.empty(value.shape, dtype=value.dtype, device=value.device)
    out.copy_(value)
    return out


def _resize(value: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``value`` cut or tiled along ``dim`` to ``size`` (warm-up inputs keep realistic contents)."""
    have = value.shape[dim]
    if have == 0:
        shape = list(value.shape)
        shape[dim] = size
        return value.new_zeros(shape)
    if have < size:
        repeats = [1] * value.dim()
        repeats[dim] = -(-size // have)
        value = value.repeat(*repeats)
    return value.narrow(dim, 0, size)


def _output_item(out: Any, key: Any) -> Any:
    if isinstance(out, torch.Tensor):
        if key != 0:
            raise ShapeError(f"shapes.outputs names output {key!r}, but the model returns a single tensor "
                             f"(name it 0)")
        return out
    try:
        return out[key]
    except (KeyError, IndexError, TypeError):
        keys = list(out.keys()) if hasattr(out, "keys") else list(range(len(out))) \
            if isinstance(out, (tuple, list)) else []
        raise ShapeError(f"shapes.outputs names output {key!r}, which the model's {type(out).__name__} "
                         f"output does not have (it has {keys})") from None


def _with_output_item(out: Any, key: Any, value: torch.Tensor) -> Any:
    if isinstance(out, torch.Tensor):
        return value
    if isinstance(out, tuple):
        items = list(out)
        items[key] = value
        return out._make(items) if hasattr(out, "_make") else tuple(items)
    if type(out) is dict or isinstance(out, list):
        out = type(out)(out)
    out[key] = value    # dict-like output objects (e.g. a ModelOutput) are fresh per call
    return out


def _show(buckets: tuple[int, ...]) -> str:
    if len(buckets) <= 8:
        return ", ".join(map(str, buckets))
    return f"{', '.join(map(str, buckets[:3]))}, ..., {buckets[-1]}"


def _locate_inputs(model: Any, settings: ShapeSettings, plan: Any) -> list[_Input]:
    """Find each bucketed input in the model's signature (forward for a module)."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = None
    names = [p.name for p in params] if params is not None else []
    var_args = params is None or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_kwargs = params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    found = []
    for key, dims in settings.buckets.items():
        entries = sorted((dim, d.axis, d.pad_value, settings.axes[d.axis].buckets()) for dim, d in dims.items())
        if isinstance(key, int):
            param = params[key] if params is not None and key < len(params) else None
            positional = param is not None and param.kind in _POSITIONAL
            if positional or (var_args and (param is None or param.kind is inspect.Parameter.VAR_POSITIONAL)):
                found.append(_Input(key, key, param.name if positional else None, entries))
                continue
        elif key in names:
            index = names.index(key)
            positional = params[index].kind in _POSITIONAL
            found.append(_Input(key, index if positional else None, key, entries))
            continue
        elif var_kwargs:
            found.append(_Input(key, None, key, entries))
            continue
        if settings.unknown_inputs == "ignore":
            continue
        what = f"parameter '{key}'" if isinstance(key, str) else f"a positional parameter {key}"
        raise ShapeError(
            f"plan '{plan.name}' ({plan.source}) declares shapes.buckets for {what}, but "
            f"{getattr(fn, '__qualname__', type(model).__name__)} takes ({', '.join(names)}). Name inputs by "
            f"their forward parameter names or positions, or set shapes.unknown_inputs: ignore.")
    return found


def warmup(compiled: Any, *args: Any, **kwargs: Any) -> dict:
    """Compile every bucket combination of the plan's ``shapes`` before serving, with ``args`` and
    ``kwargs`` as the example call (each bucketed input is tiled or cut to every bucket size).
    After it the plan's ``shapes.after_warmup`` stance applies. Run it under the grad mode you
    serve in (e.g. inside ``torch.no_grad()``): Dynamo guards on it. Without declared buckets it
    is one call of the model. Returns the warm-up record (combinations, graphs compiled,
    recompiles, seconds), also kept as ``compilation_of(compiled).warmup``."""
    compilation = compilation_of(compiled)
    runner = getattr(compilation, "serving", None)
    if runner is None:
        compiled(*args, **kwargs)
        compilation.warmup = {"combinations": 1, "axes": {}, "graphs_compiled": len(compilation.graphs),
                              "recompiles": len(compilation.recompiles), "seconds": None}
        return compilation.warmup
    try:
        record = runner.warm_up(args, kwargs)
    except BaseException:
        compilation.after_failure()
        raise
    compilation.after_call()
    return record


def stance(name: str) -> Any:
    """Set the compiler stance: ``force_eager`` (run everything eagerly), ``eager_on_recompile``
    (use compiled variants, run new shapes eagerly), ``fail_on_recompile`` (a new variant is a
    :class:`~pipeline.RecompileError` naming the failed guard) or ``default``.

    Use it as a function (the stance holds until set again) or as a context manager (restored on
    exit). It is ``torch.compiler.set_stance``: it applies to every compiled model in the process,
    ours and torch.compile's, and wins over a plan's ``capture.stance`` and
    ``shapes.after_warmup``."""
    if name not in compat.STANCES:
        raise PipelineError(f"unknown stance '{name}' (valid: {', '.join(compat.STANCES)})")
    return compat.stance(name)


__all__ = ["BucketedRunner", "planned_variants", "serve", "stance", "warmup"]
