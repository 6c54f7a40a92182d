"""The shape environment of symbolic sizes (private torch API): what a graph traced from fake
tensors assumed about its sizes, for the compile cache's key and for replaying those assumptions on
a cache hit. Re-exported by :mod:`pipeline.compat`."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

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
