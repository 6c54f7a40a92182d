"""Row statistics in ATen's order (``codegen: {eager_norm_statistics: true}``, Triton backend;
on by default for rows of ``eager_norm_min_row`` = 256 to ``eager_norm_max_row`` = 1024 elements).

``fuse`` writes a ``var_mean`` over a row (layer norm's) as two sums: ``mean = sum(x) / n``, then
``var = sum((x - mean)**2) / n``. ATen's CUDA layer norm (``vectorized_layer_norm_kernel``) instead
runs Welford's online update in each of 128 threads over 4-wide vectors (thread t reads vectors
t, t + 128, ...), combines the threads of a warp with ``shfl.sync.down`` (offsets 16 to 1), then the
4 warps pairwise (2, then 1). The two orders round differently: in a few outputs in a million the
last bit of a bf16 layer norm differs, and a deep model such as GPT-2 amplifies that into a 1e-2
relative difference of its logits. A kernel holding such a pattern computes the mean and variance
exactly as ATen does, so layer-norm outputs have eager's bits:

- the rows' values are loaded as [128, XBLOCK, 4] blocks (thread column, row, vector lane: one
  8- or 16-byte load per thread and row) and split into the 4 lanes;
- per thread column, for its k-th value: ``delta = v - mean``, ``mean' = fma(delta, 1/k, mean)``,
  ``m2' = fma(delta, v - mean', m2)``;
- the combine of (own, other): ``coef = 1/(n_own + n_oth)``, ``mean = fma(n_oth*coef, mean_oth,
  n_own*coef * mean_own)``, ``m2 = fma(delta^2 * n_oth, n_own*coef, m2_oth + m2_own)``, which is
  how nvcc contracts ATen's ``cuWelfordCombine`` (measured on the H200: the other contractions
  differ in some rows; benchmarks/probes/welford_probe.py). ``1/count``
  is ``1.0 / count`` (Triton's approximate division) refined by one Newton step, which equals IEEE
  division for every count from 1 to 65536 (checked exhaustively on the H200, benchmarks/probes/reciprocal_check.py) at a
  fraction of ``div_rn``'s cost;
- ``var = m2 / n`` rounded as IEEE division.

On CUDA the threads are combined by ``tl.reduce`` over the thread axis of [128, XBLOCK] states.
Triton lays such a tensor out one column per thread (32 lanes, then the warps, along the columns;
the rows in registers) and reduces it lanes first by butterfly shuffles (offsets 16 to 1), then
the warps' results pairwise (2, then 1): for lane 0, whose result Triton broadcasts, that is ATen's
tree, combine for combine. [XBLOCK, 128] states got rows interleaved with columns within a warp
(triton 3.6, sm_90), which is why the block is transposed. The CI test reads the layout from the
TTGIR of kernels compiled for sm_90; the GPU tests check eager's bits at 1 to 16 rows per program
and 4 to 16 warps. The interpreter reduces sequentially, so there the same tree is written out
with reshapes (``pp_welford_halve``).

Cost (benchmarks/results/gpu-2026-11-30-f.md): none measurable on GPT-2's 4096 x 768 bf16
residual add + layer norm, but the 8192 x 4096 layer norm + GELU + residual row is an issue-bound
kernel where the per-value update shows, hence the row limit of the default. Rows much shorter
than 128 x 4 leave most of the block's lanes idle (a layer norm over 96 channels ran 2.8x slower
than Inductor's two-sum kernel), hence the lower limit. Only persistent
row kernels with one reduced axis of a length divisible by 4 qualify.
"""
from __future__ import annotations

import math

import attrs
import numpy as np
import torch
import torch.fx

from passes.kernel_ir.groups import REDUCTIONS, meta_of, packet_name
from passes.kernel_ir.loops import LoopNest, closure

THREADS = 128         # ATen's layer-norm block: 4 warps of 32
WARPS = 4

# Triton helpers the statistics block calls (merged into triton_ops.HELPERS).
WELFORD_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pp_welford_combine": ('''
@triton.jit
def pp_welford_combine(m_own, s_own, c_own, m_oth, s_oth, c_oth):
    # ATen's cuWelfordCombine(own, other) as nvcc contracts it (triton/welford.py)
    delta = m_own - m_oth
    count = c_oth + c_own
    safe = tl.where(count > 0, count, 1.0)
    approx = 1.0 / safe      # one Newton step makes it IEEE 1/count for every count up to 65536
    coef = tl.fma(approx, tl.fma(-safe, approx, 1.0), approx)
    mean = tl.fma(c_oth * coef, m_oth, c_own * coef * m_own)
    m2 = tl.fma(delta * delta * c_oth, c_own * coef, s_oth + s_own)
    return tl.where(count > 0, mean, 0.0), tl.where(count > 0, m2, 0.0), count
''', ()),
    "pp_welford_halve": ('''
@triton.jit
def pp_welford_halve(m, s, c, A: tl.constexpr, H: tl.constexpr, X: tl.constexpr):
    # [A * 2 * H, X] -> [A * H, X]: row (a, h) combines with row (a, H + h) of its group a
    m0, m1 = tl.split(tl.permute(tl.reshape(m, [A, 2, H, X]), (0, 2, 3, 1)))
    s0, s1 = tl.split(tl.permute(tl.reshape(s, [A, 2, H, X]), (0, 2, 3, 1)))
    c0, c1 = tl.split(tl.permute(tl.reshape(c, [A, 2, H, X]), (0, 2, 3, 1)))
    m, s, c = pp_welford_combine(m0, s0, c0, m1, s1, c1)
    return tl.reshape(m, [A * H, X]), tl.reshape(s, [A * H, X]), tl.reshape(c, [A * H, X])
''', ("pp_welford_combine",)),
}


@attrs.frozen
class Variance:
    """One two-pass variance in a nest: ``mean = total / n``, ``var = sum(squares) / n`` with
    ``squares = centered * centered`` and ``centered = x - mean``."""

    x: torch.fx.Node
    total: torch.fx.Node
    mean: torch.fx.Node
    centered: torch.fx.Node
    squares: torch.fx.Node
    sum_squares: torch.fx.Node
    var: torch.fx.Node
    n: int

    def replaced(self) -> set:
        """Nodes the statistics block stands for (``centered`` only when nothing else reads it)."""
        nodes = {self.total, self.mean, self.squares, self.sum_squares, self.var}
        if set(self.centered.users) <= nodes:
            nodes.add(self.centered)
        return nodes


def _divides_by(node: torch.fx.Node, dividend: torch.fx.Node, n: int) -> bool:
    return (packet_name(node.target) == "aten.div" and node.args[0] is dividend and len(node.args) == 2
            and not node.kwargs and isinstance(node.args[1], (int, float)) and node.args[1] == n)


def find_variances(nest: LoopNest) -> list[Variance]:
    """The two-pass variances over the nest's one reduced axis, of fp32 rows whose length is a
    positive multiple of 4, whose values need no reduction of the nest to compute."""
    if len(nest.reduced) != 1 or getattr(nest, "pitch", None) is not None:
        return []
    n = nest.sizes[nest.reduced[0]]
    if n % 4 or n == 0:         # empty rows keep the sums, whose mean of nothing is NaN as eager's
        return []
    found = []
    for total in nest.nodes:
        if packet_name(total.target) != "aten.sum" or len(total.users) != 1:
            continue
        x = total.args[0]
        if not isinstance(x, torch.fx.Node) or meta_of(x).dtype != torch.float32:
            continue
        (mean,) = total.users
        if not _divides_by(mean, total, n):
            continue
        for centered in mean.users:
            if not (packet_name(centered.target) == "aten.sub" and centered.args[0] is x
                    and centered.args[1] is mean and not centered.kwargs):
                continue
            for squares in centered.users:
                if not (packet_name(squares.target) == "aten.mul" and squares.args[0] is centered
                        and squares.args[1] is centered and len(squares.users) == 1):
                    continue
                (sum_squares,) = squares.users
                if packet_name(sum_squares.target) != "aten.sum" or len(sum_squares.users) != 1:
                    continue
                (var,) = sum_squares.users
                if not _divides_by(var, sum_squares, n):
                    continue
                if _computable_first(nest, x, total):
                    found.append(Variance(x, total, mean, centered, squares, sum_squares, var, n))
    return found


def _computable_first(nest: LoopNest, x: torch.fx.Node, total: torch.fx.Node) -> bool:
    """Whether ``x`` can be computed before anything else in the kernel, at any row index: only
    loads (walking the reduced axis forwards) and pointwise ops, no index ramp, no value of a
    reduction (a per-row value)."""
    nodes = set(nest.nodes)
    axis = nest.reduced[0]
    inputs = closure([x], [m for m in nest.nodes if nest.level[m] == "full"]) if x in nodes else []
    if x in nodes and x not in inputs:
        return False
    for node in inputs:
        if packet_name(node.target) in REDUCTIONS or node in nest.ramps:
            return False
        if any(a in nodes and a not in inputs for a in node.all_input_nodes):
            return False
    reads = [(a, node) for node in inputs for a in node.all_input_nodes if a.op == "placeholder"]
    if x.op == "placeholder":
        reads.append((x, total))
    return all((a, c) in nest.loads and nest.loads[(a, c)].strides[axis] >= 0 for a, c in reads)


def reciprocal(k: int) -> str:
    """``1/k`` rounded to fp32 as an IEEE division does, as an exact Python literal."""
    return repr(float(np.float32(1.0) / np.float32(k)))


def emit_statistics(writer, variance: Variance, cuda: bool) -> None:
    """Write the statistics block of ``variance`` into ``writer`` (a TritonWriter of a persistent
    row kernel with at least 4 warps) and bind its mean and var nodes to the results. Written
    first in the kernel body: it loads the rows' values itself, in ATen's thread layout, by
    computing ``x`` again with the column index ``rr`` set per (chunk, vector lane).

    The block works on [128, XBLOCK] tensors, threads' columns first: Triton lays such a tensor
    out one column per thread (32 lanes by 4 warps, the rows in registers), which the reduction
    needs to combine the threads in ATen's order. [XBLOCK, 128] blocks got rows interleaved with
    columns in a warp (sm_90 TTGIR, triton 3.6) and gave other bits."""
    n, chunks = variance.n, -(-variance.n // (4 * THREADS))
    emit, nest = writer.emit, writer.nest
    pid = "tl.program_id(0).to(tl.int64)" if writer.int64 else "tl.program_id(0)"
    outer_total = math.prod(nest.sizes[a] for a in nest.outer_axes)
    wm, ws, wn = f"w{writer.fresh('m')}", f"w{writer.fresh('s')}", f"w{writer.fresh('n')}"   # mean, m2, count

    def index_rows(along: str) -> None:
        emit(1, f"xo = {pid} * XBLOCK + tl.arange(0, XBLOCK){along}")
        if writer.xmask:
            emit(1, f"xmask = xo < {outer_total}")

    index_rows("[None, :, None]")      # the outer axes' indices, computed below once the loads name them
    mark = len(writer.lines)
    for var in (wm, ws, wn):
        emit(1, f"{var} = tl.zeros([{THREADS}, XBLOCK], tl.float32)")
    masked = n % (4 * THREADS) != 0
    saved_rmask, saved_var, saved_dims = writer.rmask, dict(writer.var), dict(writer.dims)
    full = [m for m in nest.nodes if nest.level[m] == "full"]
    needed = closure([variance.x], full)
    vectors, lanes = writer.fresh("wv"), [writer.fresh(f"wl{lane}_") for lane in range(4)]
    for chunk in range(chunks):
        emit(1, f"rr = ({chunk * THREADS} + tl.arange(0, {THREADS}))[:, None, None] * 4 "
                f"+ tl.arange(0, 4)[None, None, :]")
        writer.rmask = "rmask" if masked else None
        if masked:
            emit(1, f"rmask = rr < {n}")
            emit(1, f"vmask = ({chunk * THREADS} + tl.arange(0, {THREADS}))[:, None] < {n // 4}")
        writer.loads.append({})
        for node in needed:
            writer.compute(1, node, "full")
        value = writer.operand(1, variance.total, "full", set())(variance.x, "tl.float32")
        writer.loads.pop()
        # each thread's 4-wide vector, one [128, XBLOCK] tensor per vector lane
        emit(1, f"{vectors} = tl.reshape({value} + tl.zeros([{THREADS}, XBLOCK, 4], tl.float32), "
                f"[{THREADS}, XBLOCK, 2, 2])")
        emit(1, f"{lanes[0]}, {lanes[2]} = tl.split(tl.split({vectors})[0])")
        emit(1, f"{lanes[1]}, {lanes[3]} = tl.split(tl.split({vectors})[1])")
        for lane in range(4):
            step = 4 * chunk + lane + 1
            v = lanes[lane]
            delta, new_mean = writer.fresh("wd"), writer.fresh("wa")
            emit(1, f"{delta} = {v} - {wm}")
            emit(1, f"{new_mean} = tl.fma({delta}, {reciprocal(step)}, {wm})")
            new_m2 = f"tl.fma({delta}, {v} - {new_mean}, {ws})"
            if masked:
                emit(1, f"{ws} = tl.where(vmask, {new_m2}, {ws})")
                emit(1, f"{wm} = tl.where(vmask, {new_mean}, {wm})")
                emit(1, f"{wn} = tl.where(vmask, {wn} + 1.0, {wn})")
            else:
                emit(1, f"{ws} = {new_m2}")
                emit(1, f"{wm} = {new_mean}")
                emit(1, f"{wn} = {wn} + 1.0")
    writer.lines[mark:mark] = writer.decompose(1, "xo", nest.outer_axes)   # axes the loads above index
    writer.var, writer.dims = saved_var, saved_dims
    writer.uses.add("pp_welford_combine")
    if cuda:
        emit(1, f"{wm}, {ws}, {wn} = tl.reduce(({wm}, {ws}, {wn}), 0, pp_welford_combine)")
    else:     # the interpreter reduces sequentially: the same tree, written out
        writer.uses.add("pp_welford_halve")
        for groups, half in [(WARPS, h) for h in (16, 8, 4, 2, 1)] + [(1, WARPS // 2), (1, 1)]:
            emit(1, f"{wm}, {ws}, {wn} = pp_welford_halve({wm}, {ws}, {wn}, {groups}, {half}, XBLOCK)")
        for v in (wm, ws, wn):
            emit(1, f"{v} = tl.reshape({v}, [XBLOCK])")
    mean, var = f"v_{variance.mean.name}", f"v_{variance.var.name}"
    emit(1, f"{mean} = {wm}[:, None]")
    emit(1, f"{var} = tl.div_rn({ws}[:, None], tl.full([XBLOCK, 1], {n}.0, tl.float32))")
    index_rows("[:, None]")
    writer.lines.extend(writer.decompose(1, "xo", nest.outer_axes))
    emit(1, "rr = tl.arange(0, RBLOCK)[None, :]")
    writer.rmask = saved_rmask
    if saved_rmask:
        emit(1, f"rmask = rr < {writer.red_total}")
    writer.var[variance.mean], writer.dims[variance.mean] = mean, frozenset({"x"})
    writer.var[variance.var], writer.dims[variance.var] = var, frozenset({"x"})


__all__ = ["THREADS", "WARPS", "WELFORD_HELPERS", "Variance", "emit_statistics", "find_variances", "reciprocal"]
