"""Autotuning of generated Triton kernels (``codegen: {autotune: true}``).

For each fused group the candidates of :func:`candidate_blocks` (block sizes,
rows per program, warps) are generated, compiled and timed once on random inputs of the group's
shapes, dtypes and strides on the target GPU; the fastest wins. The choice is kept on disk beside
the kernels (``<cache>/triton/tune_<key>.json``, written atomically), keyed on the default
candidate's source, the candidate list, the GPU model and the Triton version, so a second
process, or a second group with the same source, reuses it without timing anything.

A progress line on stderr shows the group being tuned and the candidate count while it runs.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from passes.kernel_ir.loops import LoopNest
from passes.timing import random_like

from .blocks import Blocks, choose_blocks, nest_is_reduction, next_pow2
from .source import TritonSource, kernel_source


def _key(default_source: str, name: str, candidates: list[Blocks], device: torch.device) -> str:
    """Independent of the kernel's name, so the same group in every layer of a model shares one
    choice."""
    import triton
    material = "\n".join([default_source.replace(name, "<kernel>"), repr(candidates),
                          torch.cuda.get_device_name(device), triton.__version__])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _load_choice(path: Path, candidates: list[Blocks]) -> Blocks | None:
    try:
        data = json.loads(path.read_text())
        choice = Blocks(**data["choice"])
    except (OSError, ValueError, KeyError, TypeError):
        return None                       # absent or unreadable: tune again, then overwrite it
    return choice if choice in candidates else None


def _save_choice(path: Path, choice: Blocks, timings: list[dict]) -> None:
    payload = {"choice": attrs.asdict(choice), "timings": timings}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        json.dump(payload, tmp, indent=1)
    os.replace(tmp.name, path)


def _progress(text: str) -> None:
    sys.stderr.write(f"\r[pipeline autotune] {text}\x1b[K" if sys.stderr.isatty() else f"[pipeline autotune] {text}\n")
    sys.stderr.flush()


def tune(nest: LoopNest, name: str, *, emulate_precision: bool, inputs: list, outputs: list,
         device: torch.device, folder: Path, load: Callable[[TritonSource], Any]) -> tuple[TritonSource, str]:
    """The fastest candidate's source for this nest and a note saying what was chosen (from the
    cache or from timing). ``load`` turns a source into its jitted kernel function."""
    from triton.testing import do_bench

    candidates = candidate_blocks(nest)
    sources = [kernel_source(nest, name, emulate_precision=emulate_precision, blocks=b) for b in candidates]
    path = folder / f"tune_{_key(sources[0].source, name, candidates, device)}.json"
    cached = _load_choice(path, candidates)
    if cached is not None:
        index = candidates.index(cached)
        return sources[index], f"{name}: autotuned launch {_describe(cached)} (cached choice)"
    if len(candidates) == 1:
        return sources[0], f"{name}: autotune has one candidate, {_describe(candidates[0])}"
    with torch.cuda.device(device):
        args = [random_like(m, device) for m in inputs] + [random_like(m, device) for m in outputs]
        timings = []
        start = time.perf_counter()
        for i, (blocks, generated) in enumerate(zip(candidates, sources)):
            _progress(f"{name}: candidate {i + 1}/{len(candidates)} {_describe(blocks)}")
            kernel = load(generated)
            launch = kernel[generated.grid]
            kwargs = dict(generated.constexprs, **generated.launch_options())
            try:
                ms = do_bench(lambda: launch(*args, **kwargs), warmup=5, rep=25)
            except Exception as exc:  # noqa: BLE001 - a candidate Triton cannot build (e.g. out of registers) loses
                timings.append({"blocks": _describe(blocks), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            timings.append({"blocks": _describe(blocks), "ms": ms})
        if sys.stderr.isatty():
            sys.stderr.write("\n")
    timed = [(t["ms"], i) for i, t in enumerate(timings) if "ms" in t]
    if not timed:
        return sources[0], f"{name}: autotune found no candidate that runs; heuristic launch kept"
    best_ms, best = min(timed)
    _save_choice(path, candidates[best], timings)
    default_ms = timings[0].get("ms")
    gain = f", heuristic {default_ms:.4f} ms" if default_ms else ""
    return sources[best], (f"{name}: autotuned launch {_describe(candidates[best])} at {best_ms:.4f} ms{gain} "
                           f"({len(candidates)} candidates, {time.perf_counter() - start:.1f} s)")


def _describe(blocks: Blocks) -> str:
    shape = f"XBLOCK {blocks.xblock} RBLOCK {blocks.rblock}" if blocks.rblock > 1 or blocks.persistent \
        else f"BLOCK {blocks.xblock}"
    cap = f", at most {blocks.maxnreg} registers" if blocks.maxnreg else ""
    return f"{shape}, {blocks.num_warps} warps{cap}"


def candidate_blocks(nest: LoopNest) -> list[Blocks]:
    """Launch shapes autotuning tries for one nest, the heuristic's first (at most twelve, since
    each costs a Triton compile). Pointwise: blocks of 1024 to 8192 elements with 4 or 8 warps.
    Persistent reductions: 1, 2 or 4 rows per program (tiles up to 16384 elements) with 4, 8 or 16
    warps, and, for many rows, the heuristic's shape with at most 64 or 72 registers a thread: a
    row kernel holding its row in registers is latency-bound by how many programs fit on an SM,
    and the cap fits one more (the layer norm + GELU row of 8192 x 4096 bf16 at 79 registers fits
    6 programs per SM, capped at 72 it fits 7; the gain was small: benchmarks/results/gpu-2026-11-30-c.md
    and the autotune run of gpu-2026-11-30-d.md).
    Looped reductions: chunks of 1024 to 4096 elements per row with 4 to 16 warps (at least
    four elements per thread)."""
    base = choose_blocks(nest)
    found = [base]

    def add(blocks: Blocks) -> None:
        if blocks not in found:
            found.append(blocks)

    sizes = nest.sizes
    if not nest_is_reduction(nest):
        total = math.prod(sizes)
        for block in (1024, 2048, 4096, 8192):
            if block <= max(16, next_pow2(total)):
                for warps in (4, 8):
                    add(Blocks(False, block, 1, -(-total // block), warps))
        return found
    outer = math.prod(sizes[a] for a in nest.outer_axes)
    if base.persistent:
        rp = base.rblock
        for xblock in (1, 2, 4):
            if xblock <= next_pow2(outer) and xblock * rp <= 16384:
                for warps in (4, 8, 16):
                    if xblock * rp >= 32 * warps:
                        add(Blocks(True, xblock, rp, -(-outer // xblock), warps))
        if base.num_warps == 4 and outer >= 1024:
            for cap in (64, 72):      # 8 and 7 programs of 128 threads per SM (65536 registers)
                add(attrs.evolve(base, maxnreg=cap))
    elif base.xblock == 1:
        for rblock in (1024, 2048, 4096):
            for warps in (4, 8, 16):
                if rblock >= 128 * warps:
                    add(Blocks(False, 1, rblock, outer, warps))
    return found
