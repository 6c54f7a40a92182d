"""Codegen's parallel compile of a graph's Triton kernels, before their first launches.

Two things a first launch would otherwise do one kernel after another: compile the kernel's
binary (MLIR passes and ptxas: seconds for a graph), and build its launcher, a C stub Triton
compiles with the host's C compiler per kernel signature (a large share of a model's cold first
call: benchmarks/results/gpu-2026-11-30-b.md). Both run here on a thread pool; both release the
GIL (native compiler passes, subprocesses)."""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch


def _on_device(device: torch.device) -> Any:
    """``torch.cuda.device`` of ``device`` (the JIT compiles for the current device), or nothing
    where this torch has no CUDA."""
    if not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.device(device.index if device.index is not None else torch.cuda.current_device())


def precompile(kernels: list[tuple[Any, list[torch.dtype]]], workers: int) -> tuple[int, float]:
    """Compile the binaries of ``kernels`` (each with the dtypes of its inputs and outputs) on a
    pool of ``workers`` threads, before their first launch, through Triton's own ahead-of-time path
    (``JITFunction.warmup`` under ``triton.AsyncCompileMode``): each lands in its JIT function's
    in-memory cache under the key a launch with 16-byte-aligned tensors computes, so that launch
    compiles nothing. Triton's compile spends most of its time outside the GIL (MLIR passes,
    ptxas). A kernel that fails to compile here is left alone: its first launch compiles it again
    and takes the usual way out (other launch shapes, then an error naming it). Returns (distinct
    kernels submitted, seconds)."""
    try:
        from triton import AsyncCompileMode
    except ImportError:   # an older Triton: every kernel compiles at its first launch
        return 0, 0.0

    started = time.perf_counter()
    seen: set = set()
    pending = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="triton-compile") as pool:
        with AsyncCompileMode(pool, ignore_errors=True):
            for kernel, dtypes in kernels:
                # Size arguments (a size-class kernel at one binding) specialize the binary too.
                sizes = tuple((v == 1, v % 16 == 0) for v in kernel.size_args)
                key = (id(kernel.function), kernel.device, tuple(dtypes), tuple(sorted(kernel.kwargs.items())), sizes)
                if key in seen or kernel.empty:
                    continue
                seen.add(key)
                with _on_device(kernel.device):
                    pending.append(kernel.function.warmup(*dtypes, *kernel.size_args, grid=kernel.grid,
                                                          **kernel.kwargs))
        build_launchers([getattr(p, "kernel", p) for p in pending], pool)
    return len(seen), time.perf_counter() - started


def build_launchers(binaries: list, pool: ThreadPoolExecutor) -> int:
    """Build the launchers of compiled kernels (``triton.compiler.CompiledKernel``: ``src`` and
    ``metadata``) on ``pool``, one per distinct signature: each lands in Triton's cache, where
    the kernel's first launch then finds it. A failure is left to that first launch, which
    builds the launcher again and reports the error. Returns the launchers submitted."""
    try:
        from triton.runtime import driver
        make = driver.active.launcher_cls
    except Exception:  # noqa: BLE001 - no usable driver here: first launches build their launchers
        return 0
    distinct: dict = {}
    for binary in binaries:
        src, metadata = getattr(binary, "src", None), getattr(binary, "metadata", None)
        if src is None or metadata is None:
            continue
        key = (repr(sorted(src.signature.items())), repr(sorted(getattr(src, "constants", {}).items(), key=repr)))
        distinct.setdefault(key, binary)

    def build(binary: Any) -> None:
        try:
            make(binary.src, binary.metadata)
        except Exception:  # noqa: BLE001 - see the docstring: the first launch reports it
            pass

    list(pool.map(build, distinct.values()))
    return len(distinct)


__all__ = ["precompile", "build_launchers"]
