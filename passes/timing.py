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


def fastest_per_call(calls: list[Callable[[], Any]], device: torch.device, *, sample: float = 0.001,
                     rounds: int = 5, most_calls: int = 100) -> list[float]:
    """Seconds per call of each of ``calls``: the fastest of ``rounds`` samples, each of as many calls as
    fill about ``sample`` seconds (at least one, at most ``most_calls``). The calls are timed in turn
    within each round, in an order reversed every other round, so a burst of load on a shared host
    slows all of them alike instead of one; the fastest sample is the one least disturbed. Each sample
    follows one untimed call, so no call is timed cold from the switch (caches, a library's
    per-layout state) that the call before it made."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    counts = []
    for call in calls:
        call()
        sync()
        start = time.perf_counter()
        call()
        sync()
        counts.append(max(1, min(most_calls, int(sample / max(time.perf_counter() - start, 1e-7)))))
    best = [float("inf")] * len(calls)
    order = list(range(len(calls)))
    for round_ in range(rounds):
        for i in (order if round_ % 2 == 0 else order[::-1]):
            calls[i]()                  # untimed: what the call before it left cold is warmed again
            sync()
            start = time.perf_counter()
            for _ in range(counts[i]):
                calls[i]()
            sync()
            best[i] = min(best[i], (time.perf_counter() - start) / counts[i])
    return best
