"""Launch shapes of Triton kernels: block sizes, program counts and warps per kernel, from its loop
nest (:func:`choose_blocks`), and the facts about a nest they are chosen from. The constants are
module attributes, so benchmarks and tests can sweep them (``benchmarks/probes/sweep_reductions.py``)."""
from __future__ import annotations

import math

import attrs

from passes.kernel_ir.groups import REDUCTIONS, packet_name
from passes.kernel_ir.loops import LoopNest
from passes.kernel_ir.symbolic import is_dim

from .welford import WARPS, find_variances

POINTWISE_BLOCK = 4096          # elements per program of a pointwise kernel
POINTWISE_WARPS = 8
PERSISTENT_MAX = 8192           # longest row (reduced elements, padded to a power of 2) kept in one tile
TILE_ELEMENTS = 4096            # target XBLOCK * RBLOCK of a reduction program
LOOPED_RBLOCK = 2048            # chunk of a looped row reduction (one row per program)
OUTER_XBLOCK = 64               # rows per program when the reduced axis is not the contiguous one
WARP_ELEMENTS = 1024            # tile elements per warp of a reduction program
LOOPED_WARP_ELEMENTS = 512      # the same for a looped row reduction's chunk
MIN_PROGRAMS = 264              # strided-axis reductions shrink XBLOCK (to 8) to launch at least this many


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pow2_at_most(n: int, cap: int) -> int:
    """``min(next_pow2(n), cap)`` for a power of two ``cap``; ``cap`` for a symbolic ``n``, so that
    one kernel (one size class) serves its small sizes and its large ones alike (a block larger
    than a small extent only masks more lanes of one program)."""
    return cap if is_dim(n) or n >= cap else next_pow2(n)


def uneven(extent, block: int) -> bool:
    """Whether a loop over ``extent`` in steps of ``block`` needs a mask: always for a symbolic
    extent (one kernel then serves every size, divisible or not)."""
    return is_dim(extent) or extent % block != 0


@attrs.frozen
class Blocks:
    """Launch shape of one kernel: block sizes, program count, warps, and a cap on registers per
    thread (``maxnreg``; None: the compiler's choice)."""

    persistent: bool
    xblock: int
    rblock: int
    grid: int
    num_warps: int
    maxnreg: int | None = None


def choose_blocks(nest: LoopNest) -> Blocks:
    """Pointwise: ``BLOCK = min(4096, next_pow2(n))``, 8 warps (fewer for smaller blocks).
    Reductions over the contiguous axis: persistent when the padded row fits 8192 elements, with
    as many rows per program as fill a 4096-element tile; else one row per program looping over
    2048-element chunks with 4 warps (16 elements per thread: with 8192-element chunks and 8
    warps the accumulators left room for two programs per SM, and GPT-2's cross-entropy over
    50257 logits ran much slower; benchmarks/results/gpu-2026-11-29-e.md, swept by
    benchmarks/probes/sweep_reductions.py). Reductions over a strided axis take up to 64 rows
    per program (coalesced along the rows; fewer, down to 8, while that leaves under 264
    programs, two per H200 SM) and are persistent when rows * row length fits 8192 elements.
    Warps: one per 1024 tile elements, 2 to 16. These beat the other settings tried on the GPU
    suite's bf16 softmax, layer norm + GELU + residual, RMS norm and fp32 pointwise rows. The
    constants above are module attributes, so benchmarks can sweep them."""
    sizes = nest.sizes
    if not nest_is_reduction(nest):
        total = math.prod(sizes)
        block = max(16, pow2_at_most(total, POINTWISE_BLOCK))
        warps = POINTWISE_WARPS if block == POINTWISE_BLOCK else max(1, min(4, block // 256))
        return Blocks(False, block, 1, -(-total // block), warps)
    outer = math.prod(sizes[a] for a in nest.outer_axes)
    red = math.prod(sizes[a] for a in nest.reduced)
    rp = next_pow2(red)
    if reduces_contiguous_axis(nest):
        if rp <= PERSISTENT_MAX:
            persistent, rblock = True, rp
            xblock = pow2_at_most(outer, max(1, TILE_ELEMENTS // rp))
        else:
            persistent, xblock, rblock = False, 1, LOOPED_RBLOCK
    else:
        xblock = pow2_at_most(outer, OUTER_XBLOCK)
        while xblock > 8 and -(-outer // xblock) < MIN_PROGRAMS:
            xblock //= 2
        persistent = xblock * rp <= PERSISTENT_MAX
        rblock = rp if persistent else max(1, TILE_ELEMENTS // xblock)
    per_warp = LOOPED_WARP_ELEMENTS if not persistent and xblock == 1 else WARP_ELEMENTS
    warps = max(2, min(16, next_pow2(xblock * rblock // per_warp)))
    if persistent and aten_statistics(nest, rblock):   # a thread per column of ATen's block (triton/welford.py)
        warps = max(warps, WARPS)
    return Blocks(persistent, xblock, rblock, -(-outer // xblock), warps)


def aten_statistics(nest: LoopNest, rblock: int) -> bool:
    """Whether the nest computes its row variances in ATen's order: asked for, a persistent row
    (padded length at most PERSISTENT_MAX) and a variance :func:`triton_welford.find_variances`
    accepts."""
    return (getattr(nest, "aten_statistics", False) and rblock <= PERSISTENT_MAX and reduces_contiguous_axis(nest)
            and bool(find_variances(nest)))


def nest_is_reduction(nest: LoopNest) -> bool:
    return bool(nest.group.reduced) or any(packet_name(n.target) in REDUCTIONS for n in nest.nodes)


def reduces_contiguous_axis(nest: LoopNest) -> bool:
    """True when some full-level access walks a reduced axis with stride 1 (rows are contiguous).
    Accesses that vary along both the reduced and the outer axes decide when there are any: a
    vector broadcast along the outer axes (an RMS norm's per-row scale, ``[rows, 1]``) walks the
    reduced axis with stride 1 but is read once per row, and must not make a column sum over a
    row-major matrix read that matrix one column per program."""
    accesses = [acc for (_, consumer), acc in nest.loads.items()
                if nest.level.get(consumer) == "full" or packet_name(consumer.target) in REDUCTIONS]
    accesses += [acc for node, acc in nest.outputs if nest.level[node] == "full"]
    if not nest.reduced:
        return True
    spanning = [acc for acc in accesses if any(acc.strides[a] != 0 for a in nest.reduced)
                and any(acc.strides[a] != 0 for a in nest.outer_axes)]
    accesses = spanning or accesses
    return any(acc.strides[a] == 1 for acc in accesses for a in nest.reduced) or not any(
        acc.strides[a] == 1 for acc in accesses for a in nest.outer_axes)
