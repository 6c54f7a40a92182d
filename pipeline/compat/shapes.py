"""The shape environment of symbolic sizes (private torch API): what a graph traced from fake
tensors assumed about its sizes, for the compile cache's key and for replaying those assumptions on
a cache hit. Re-exported by :mod:`pipeline.compat`."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from pipeline.compat.tracing import fake_mode_of


def _shape_env(values: list) -> Any:
    from torch._guards import detect_fake_mode
    mode = detect_fake_mode(list(values))
    return getattr(mode, "shape_env", None) if mode is not None else None


def _free_symbols(values: list) -> set:
    found: set = set()
    for value in values:
        sizes: list = []
        if isinstance(value, torch.Tensor):
            sizes = [*value.shape, *value.stride(), value.storage_offset()]
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            sizes = [value]
        for size in sizes:
            if isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                found |= set(size.node.expr.free_symbols)
    return found


def shape_facts(values: list) -> dict | None:
    """What the shape environment of ``values`` (fake tensors and size symbols) knows that a graph
    traced from them can depend on: every guard so far, every replacement (one symbol found equal
    to an expression of others) and the value range of each symbol the values use. None when the
    values have no symbolic sizes."""
    env = _shape_env(values)
    symbols = _free_symbols(values)
    if env is None or not symbols:
        return None
    ranges = getattr(env, "var_to_range", {})
    return {
        "guards": sorted({str(g.expr) for g in getattr(env, "guards", [])}),
        "replacements": sorted(f"{k} = {v}" for k, v in getattr(env, "replacements", {}).items()),
        "ranges": {str(s): [str(ranges[s].lower), str(ranges[s].upper)] if s in ranges else None
                   for s in sorted(symbols, key=str)},
    }


def shape_guard_count(values: list) -> int:
    """How many guards the shape environment of ``values`` holds (0 without one)."""
    env = _shape_env(values)
    return len(getattr(env, "guards", [])) if env is not None else 0


def shape_guards_since(values: list, count: int) -> list[str]:
    """The guards added to the shape environment of ``values`` after its first ``count`` (what
    compiling a graph assumed about its symbolic sizes), as expressions that must hold."""
    env = _shape_env(values)
    if env is None:
        return []
    return [str(g.expr) for g in getattr(env, "guards", [])[count:]]


def replay_shape_guards(values: list, guards: list[str]) -> str | None:
    """Assume ``guards`` again in the shape environment of ``values`` (a graph rebuilt from the
    cache skips the passes that made them, but Dynamo must still check them on later calls).
    Returns None when every one holds for the sizes at hand, else the first that does not."""
    if not guards:
        return None
    env = _shape_env(values)
    if env is None:
        return guards[0]
    import sympy
    names = {str(s): s for s in getattr(env, "var_to_range", {})}
    for text in guards:
        try:
            expr = sympy.sympify(text, locals=names)
            if not bool(env.evaluate_expr(expr)):
                return text
        except Exception:  # noqa: BLE001 - a guard that cannot be replayed means: compile again
            return text
    return None


def guards_suppressed(values: list) -> Any:
    """A context in which comparing the symbolic sizes of ``values`` answers from the sizes Dynamo
    saw and adds no guard (for heuristic decisions a pass checks again on concrete sizes: fuse's
    grouping, whose kernels are generated per concrete size). Nothing without a shape environment."""
    env = _shape_env(values)
    return env.suppress_guards() if env is not None else contextlib.nullcontext()


def known_equal(a: Any, b: Any) -> bool:
    """True when sizes ``a`` and ``b`` (ints or SymInts) are equal for every value of their
    symbols, adding no guard (False when it depends on the symbols)."""
    if type(a) is int and type(b) is int:
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    return bool(statically_known_true(a == b))


def is_backed(size: Any) -> bool:
    """True for an int, or a symbolic size of symbols Dynamo took from inputs' sizes (not the
    unbacked ones of data-dependent values, which may be 0 or 1)."""
    if type(size) is int:
        return True
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return not free_unbacked_symbols(size)


def same_sizes(a: Any, b: Any) -> bool:
    """:func:`known_equal` for each pair of two size sequences of one length."""
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b))


def rebuild_symbolic_metadata(gm: torch.fx.GraphModule, placeholders: list, like: list) -> None:
    """Fill ``node.meta['val']`` of every node of ``gm`` (a graph rebuilt from the compile cache,
    which keeps no example values) from its placeholders' descriptions, whose symbolic sizes are
    expression texts over the symbols of the shape environment of ``like`` (the fake inputs of the
    compile the graph is rebuilt in, where Dynamo named its symbols as when it was stored). Each
    description is ``{"shape", "stride", "dtype", "device"}`` (sizes: ints or texts) or None for a
    non-tensor placeholder. Adds no guard. Raises ValueError when ``like`` has no shape
    environment or an expression names a symbol it does not have."""
    import sympy
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch.utils._sympy import functions

    env, mode = _shape_env(like), fake_mode_of(like)
    if env is None or mode is None:
        raise ValueError("the compile has no shape environment to rebind symbolic sizes to")
    hints = dict(getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {}))   # renamed in torch 2.13
    names = {str(s): s for s in hints}
    local = {**names, "FloorDiv": functions.FloorDiv, "CeilDiv": functions.CeilDiv, "Mod": functions.Mod,
             "PythonMod": functions.PythonMod, "CleanDiv": functions.CleanDiv}

    def size(item: Any) -> Any:
        if isinstance(item, int):
            return item
        expr = sympy.sympify(item, locals=local)
        missing = {str(s) for s in expr.free_symbols} - set(names)
        if missing:
            raise ValueError(f"size {item} names {', '.join(sorted(missing))}, which this compile's shapes lack")
        return env.create_symintnode(expr, hint=int(expr.xreplace(hints)))

    with env.suppress_guards():
        with mode:
            fakes = [None if m is None else
                     torch.empty_strided([size(s) for s in m["shape"]], [size(s) for s in m["stride"]],
                                         dtype=getattr(torch, m["dtype"]), device=torch.device(m["device"]))
                     for m in placeholders]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
