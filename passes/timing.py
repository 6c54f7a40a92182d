"""Timing on real tensors at compile time, for passes that choose between ways of computing the
same thing by measuring them (autotuning, layout choices): random stand-ins for a graph's example
values, and the time of a call."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from pipeline import compat


def random_like(meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor with ``meta``'s shape, strides and dtype on ``device`` (a symbolic size at the
    value Dynamo saw for it), filled with random values in a safe range (so nothing is timed on
    denormals or NaNs)."""
    shape = tuple(int(compat.size_hint(s)) for s in meta.shape)
    stride = tuple(int(compat.size_hint(s)) for s in meta.stride())
    out = torch.empty_strided(shape, stride, dtype=meta.dtype, device=device)
    if meta.dtype.is_floating_point:
        out.uniform_(-1.0, 1.0)
    elif meta.dtype == torch.bool:
        out.copy_(torch.rand(out.shape, device=device) > 0.5)
    else:
        out.random_(0, 16)
    return out


def concrete(meta: Any) -> bool:
    """Whether every size and stride of ``meta`` has a value to time it at (an unbacked size has none)."""
    return all(compat.size_hint(s) is not None for s in (*meta.shape, *meta.stride()))


def seconds_per_call(call: Callable[[], Any], device: torch.device, *, sample: float = 0.002,
                     samples: int = 3, most_calls: int = 100) -> float:
    """The fastest of ``samples`` samples of ``call``'s time per call, each sample of as many calls as
    fill about ``sample`` seconds (at least one, at most ``most_calls``), after one untimed call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    call()
    sync()
    start = time.perf_counter()
    call()
    sync()
    first = time.perf_counter() - start
    calls = max(1, min(most_calls, int(sample / max(first, 1e-7))))
    best = first
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best
