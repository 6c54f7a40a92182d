"""Split reductions: a reduction with few programs for its rows runs in two kernels.

A backward's bias and norm-weight gradients are column sums: 4096 rows reduced to 768 values.
The one-kernel shape (blocks.choose_blocks) gives each program a few columns and every
row, so only about a hundred programs run on the H200's 132 SMs, each reading 16-32 bytes per
row: those kernels stayed far from copy bandwidth, slower than ATen's ``sum``
(benchmarks/results/gpu-2026-11-29-e.md, gpu-2026-11-30-a.md).

Split, the rows are cut into ``count`` chunks:
- the *partial* kernel runs one program per (64 columns, chunk), or per chunk of one contiguous
  row: it computes the group's
  full-level nodes over its chunk and stores each reduction's partial result, unrounded, in its
  working type (fp32 for half types), into a ``[count, outer]`` workspace;
- the *combine* kernel runs one program per 64 columns: it reduces the ``count`` partials of
  each reduction (with the reduction's own rounding) and computes the group's epilogue (the
  outer-level nodes) and outputs, as the one-kernel version does after its loop.

Only groups that allow it are split: every reduction a float sum, amax or amin (their partial
results combine with the same operator), all in one pass, no full-level output (a group with
either runs staged, passes/codegen/triton/stages.py), and few programs for its rows
(:func:`few_programs`): over a strided axis, at least ``MIN_ROWS`` reduced elements and a
one-kernel shape that either launches fewer than ``MIN_PROGRAMS`` programs or got them by
narrowing each program's columns below ``OUTER_XBLOCK`` (8 bf16 columns read 16 bytes per row,
too little for GPT-2's 3072- and 2304-column bias gradients:
benchmarks/results/gpu-2026-11-30-a.md); over the contiguous axis (a batch norm's N x H x W per
channel in NCHW, a group norm's rows), fewer than ``MIN_PROGRAMS`` rows of at least
``MIN_LONG_ROW`` elements, each chunk then one program's ``LONG_ROW_RBLOCK``-element steps. :class:`SplitKernel`
launches the two (allocating the workspaces from PyTorch's caching allocator) and is what the
graph calls.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import torch

from passes.kernel_ir.groups import REDUCTIONS, CompiledKernel, FusedGroup, meta_of, packet_name
from passes.kernel_ir.loops import LoopNest, closure

from .ops import accumulator_init, accumulator_update, reduce_tile, work_type
from .runtime import TritonKernel, load_module, write_source
from .blocks import (LOOPED_WARP_ELEMENTS, MIN_PROGRAMS, OUTER_XBLOCK, WARP_ELEMENTS, Blocks, choose_blocks, next_pow2,
                     reduces_contiguous_axis)
from .source import TritonWriter, kernel_source

SPLIT_OPS = ("aten.sum", "prims.sum", "aten.amax", "aten.amin")
MIN_ROWS = 1024              # reduced elements below which one kernel is enough
TARGET_PROGRAMS = 528        # partial programs aimed for: four per H200 SM
PARTIAL_RBLOCK = 64          # rows per loop step of a partial program (64 x 64 tiles)
MIN_LONG_ROW = 16384         # contiguous rows shorter than this stay one program each
LONG_ROW_RBLOCK = 2048       # elements per loop step of a partial program over a contiguous row
COMBINE_XBLOCK = 32          # columns per combine program
WORKSPACE_TYPES = {"tl.float32": (torch.float32, "*fp32"), "tl.float64": (torch.float64, "*fp64")}


@attrs.frozen
class SplitPlan:
    """How one nest is split: ``count`` chunks of ``chunk`` reduced elements."""

    count: int
    chunk: int
    outer: int                  # outer (kept) elements: the workspaces are [count, outer]
    columns: int                # programs along the outer axes in the partial kernel
    partial: Blocks
    combine: Blocks


def _reductions(nest: LoopNest) -> list:
    return [n for n in nest.nodes if packet_name(n.target) in REDUCTIONS]


def _splittable(nest: LoopNest) -> bool:
    """Whether every reduction of ``nest`` combines partial results (a float sum, amax or amin) and
    the nest has no pitched rows."""
    reductions = _reductions(nest)
    placeholders = [n for n in nest.group.subgraph.graph.nodes if n.op == "placeholder"]
    return bool(reductions) and bool(placeholders) and getattr(nest, "pitch", None) is None \
        and all(packet_name(r.target) in SPLIT_OPS and work_type(r) in WORKSPACE_TYPES for r in reductions)


def few_programs(nest: LoopNest) -> bool:
    """Whether one kernel of ``nest`` would launch too few programs for its rows: over a strided
    axis, at least ``MIN_ROWS`` reduced elements and fewer than ``MIN_PROGRAMS`` programs (or
    programs narrowed below ``OUTER_XBLOCK`` columns); over the contiguous axis, fewer than
    ``MIN_PROGRAMS`` rows of at least ``MIN_LONG_ROW`` elements (one program loops over each)."""
    outer = math.prod(nest.sizes[a] for a in nest.outer_axes)
    rows = math.prod(nest.sizes[a] for a in nest.reduced)
    if reduces_contiguous_axis(nest):       # not with symbolic sizes: no decision taken about them
        return nest.decisions is None and outer < MIN_PROGRAMS and rows >= MIN_LONG_ROW
    single = choose_blocks(nest)
    return rows >= MIN_ROWS and not (single.grid >= MIN_PROGRAMS and single.xblock >= OUTER_XBLOCK)


def wants_stages(nest: LoopNest) -> bool:
    """Whether ``nest`` should run staged (passes/codegen/triton/stages.py): a splittable nest with
    few programs that needs several passes or writes full-level outputs. (Rows in ATen's statistics
    order, blocks.aten_statistics, are contiguous and at most PERSISTENT_MAX long: never these.)
    A nest with symbolic sizes stays one size-class kernel (no decision is taken about its sizes)."""
    full_outputs = any(nest.level[node] == "full" for node, _ in nest.outputs)
    return nest.decisions is None and (nest.passes > 1 or full_outputs) and _splittable(nest) \
        and few_programs(nest)


def split_plan(nest: LoopNest) -> SplitPlan | None:
    """The plan for splitting ``nest``, or None when one kernel is the right shape (see the
    module docstring for the conditions)."""
    if not _splittable(nest) or nest.passes != 1 or any(nest.level[node] == "full" for node, _ in nest.outputs):
        return None
    if not few_programs(nest):
        return None     # one kernel already has enough programs, each reading whole row segments
    outer = math.prod(nest.sizes[a] for a in nest.outer_axes)
    rows = math.prod(nest.sizes[a] for a in nest.reduced)
    if reduces_contiguous_axis(nest):   # a program per chunk of one row
        xblock, step, per_warp = 1, LONG_ROW_RBLOCK, LOOPED_WARP_ELEMENTS
    else:
        xblock, step, per_warp = min(OUTER_XBLOCK, next_pow2(outer)), PARTIAL_RBLOCK, WARP_ELEMENTS
    columns = -(-outer // xblock)
    count = max(2, min(-(-TARGET_PROGRAMS // columns), rows // step))
    chunk = -(-rows // (count * step)) * step
    count = -(-rows // chunk)
    rblock = min(step, chunk)
    warps = max(2, min(8, xblock * rblock // per_warp))
    sblock = next_pow2(count)
    cx = min(COMBINE_XBLOCK, next_pow2(outer))
    return SplitPlan(count=count, chunk=chunk, outer=outer, columns=columns,
                     partial=Blocks(False, xblock, rblock, columns * count, warps),
                     combine=Blocks(True, cx, sblock, -(-outer // cx), max(1, min(4, cx * sblock // 256))))


class _StageWriter(TritonWriter):
    """A writer of one stage of a split nest: its launch shape comes from the plan."""

    stage = ""      # "partial" or "combine": the plan's Blocks for this stage

    def __init__(self, nest: LoopNest, name: str, *, emulate_precision: bool, blocks: Blocks | None = None,
                 plan: SplitPlan):
        super().__init__(nest, name, emulate_precision=emulate_precision,
                         blocks=blocks or getattr(plan, self.stage))
        self.plan = plan
        self.reductions = _reductions(nest)


class PartialWriter(_StageWriter):
    """The first stage: each reduction's partial result over one chunk of the reduced axis."""

    stage = "partial"

    def parameters(self) -> dict:
        signature = {f"in{i}": sig for i, sig in enumerate(super().parameters().values())
                     if i < len(self.placeholders)}
        signature.update({f"out{k}": WORKSPACE_TYPES[work_type(r)][1] for k, r in enumerate(self.reductions)})
        return signature

    def kind(self) -> str:
        return f"split reduction, partials over {self.plan.count} chunks of {self.plan.chunk}"

    def write_body(self) -> None:
        nest, plan = self.nest, self.plan
        rows = math.prod(nest.sizes[a] for a in nest.reduced)
        self.red_total = rows
        self.emit(1, "pid = tl.program_id(0).to(tl.int64)" if self.int64 else "pid = tl.program_id(0)")
        self.emit(1, f"xo = (pid % {plan.columns}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.emit(1, f"start = (pid // {plan.columns}) * {plan.chunk}")
        if plan.outer % self.blocks.xblock:
            self.xmask = "xmask"
            self.emit(1, f"xmask = xo < {plan.outer}")
        self.emit(1, "rbase = tl.arange(0, RBLOCK)[None, :]")
        mark = len(self.lines)
        full_nodes = [n for n in nest.nodes if nest.level[n] == "full"]
        for node in nest.nodes:     # outer values of the group's inputs (a channel's mean, weight)
            if nest.level[node] == "outer" and nest.pass_of[node] == 0 and node not in self.reductions:
                self.compute(1, node, "outer")
        for r in self.reductions:
            for line in accumulator_init(r):
                self.emit(1, line)
        self.emit(1, f"for roff in range(start, start + {plan.chunk}, RBLOCK):")
        self.emit(2, "rr = roff + rbase")
        if plan.count * plan.chunk != rows:
            self.rmask = "rmask"
            self.emit(2, f"rmask = rr < {rows}")
        inner, saved_need = len(self.lines), self.need
        self.need = set()
        for node in closure([r.args[0] for r in self.reductions], full_nodes):
            self.compute(2, node, "full")
        for r in self.reductions:
            for line in accumulator_update(r, self.reduce_source(2, r), self.rmask):
                self.emit(2, line)
        self.lines[inner:inner] = self.decompose(2, "rr", list(nest.reduced))
        self.need = saved_need | {a for a in self.need if a not in nest.reduced}
        self.rmask = None
        for k, r in enumerate(self.reductions):
            flags = f"nan_{r.name}" if packet_name(r.target) in ("aten.amax", "aten.amin") \
                and work_type(r) in WORKSPACE_TYPES else None
            for line in reduce_tile(r, f"acc_{r.name}", f"v_{r.name}", index="rr", valid=None, nan_flags=flags,
                                    emulate=False, uses=self.uses):
                self.emit(1, line)
            mask = f", mask={self.xmask}" if self.xmask else ""
            self.emit(1, f"tl.store(out{k} + ((pid // {plan.columns}) * {plan.outer} + xo), v_{r.name}{mask})")
        self.lines[mark:mark] = self.decompose(1, "xo", nest.outer_axes)


class CombineWriter(_StageWriter):
    """The second stage: reduce each reduction's partials, then the group's epilogue and outputs."""

    stage = "combine"

    def parameters(self) -> dict:
        base = super().parameters()
        signature = {k: v for k, v in base.items() if k.startswith("in")}
        first = len(self.placeholders)
        signature.update({f"in{first + k}": WORKSPACE_TYPES[work_type(r)][1] for k, r in enumerate(self.reductions)})
        signature.update({k: v for k, v in base.items() if k.startswith("out")})
        return signature

    def kind(self) -> str:
        return f"split reduction, combining {self.plan.count} partials"

    def write_body(self) -> None:
        nest, plan = self.nest, self.plan
        self.emit(1, "xo = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        if plan.outer % self.blocks.xblock:
            self.xmask = "xmask"
            self.emit(1, f"xmask = xo < {plan.outer}")
        self.emit(1, "rr = tl.arange(0, RBLOCK)[None, :]")
        valid = None
        if plan.count != self.blocks.rblock:
            valid = "rmask"
            self.emit(1, f"rmask = rr < {plan.count}")
        mark = len(self.lines)
        first = len(self.placeholders)
        for k, r in enumerate(self.reductions):
            mask = " & ".join(m for m in (self.xmask, valid) if m)
            load = f"tl.load(in{first + k} + (rr * {plan.outer} + xo)" + (f", mask={mask}, other=0)" if mask else ")")
            self.emit(1, f"p_{r.name} = {load}")
            self.finish_block(1, r, f"p_{r.name}", valid=valid, masked=False)
        for node in nest.nodes:
            if nest.level[node] == "outer" and node not in self.reductions:
                self.compute(1, node, "outer")
        for node, access in nest.outputs:
            self.store(1, node, access.strides, "outer")
        self.lines[mark:mark] = self.decompose(1, "xo", nest.outer_axes)


class SplitKernel(CompiledKernel):
    """A split reduction's two Triton kernels (see the module docstring): the partial kernel
    writes the workspaces, the combine kernel reads them with the group's inputs. Inputs with
    unexpected strides or on another kind of device run the group eagerly."""

    backend = "triton"
    accepts_reuse = True

    def __init__(self, group: FusedGroup, partial: Any, combine: Any):
        super().__init__(group, partial.source + "\n" + combine.source)
        self.partial = partial
        self.combine = combine

    @property
    def __name__(self) -> str:
        return self.combine.__name__

    def __call__(self, *inputs: torch.Tensor, donors: tuple = (), reuse: tuple = ()) -> tuple:
        partials = self.partial(*inputs)
        if partials is None:        # strides or a device the kernels were not built for
            return self.group(*inputs)
        return self.combine(*inputs, *partials, reuse=reuse)

    def to_data(self, codec: Any) -> dict:
        """Plain data for the compile cache: the group and both kernels' descriptions."""
        return {"group": self.group.to_data(codec), "partial": self.partial.to_data(codec),
                "combine": self.combine.to_data(codec)}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "SplitKernel":
        return cls(FusedGroup.from_data(data["group"], codec), PartialKernel.from_data(data["partial"], codec),
                   TritonKernel.from_data(data["combine"], codec))


class PartialKernel(TritonKernel):
    """The partial stage's kernel: its outputs are workspaces, so inputs it was not built for
    give None (the :class:`SplitKernel` then runs the group eagerly) instead of group outputs."""

    def unfit(self, inputs: tuple) -> None:
        return None


def workspace_values(nest: LoopNest, plan: SplitPlan) -> list[torch.Tensor]:
    """Meta tensors with the workspaces' shapes and dtypes (what the two kernels are built for)."""
    return [torch.empty((plan.count, plan.outer), dtype=WORKSPACE_TYPES[work_type(r)][0], device="meta")
            for r in _reductions(nest)]


def build_split_kernel(group: FusedGroup, nest: LoopNest, plan: SplitPlan, *, emulate_precision: bool,
                       directory: Any, persistent: bool, interpret: bool) -> tuple[SplitKernel, list]:
    """The split reduction's two kernels written, loaded and wrapped, and (kernel, argument dtypes)
    per stage for codegen's parallel compile."""
    placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
    inputs = [meta_of(p) for p in placeholders]
    workspaces = workspace_values(nest, plan)
    outputs = [meta_of(n) for n, _ in nest.outputs]
    stages = []
    for kind, writer, ins, outs in ((PartialKernel, PartialWriter, inputs, workspaces),
                                    (TritonKernel, CombineWriter, inputs + workspaces, outputs)):
        source = kernel_source(nest, emulate_precision=emulate_precision, writer=functools.partial(writer, plan=plan))
        path, _ = write_source(source.source, directory, persistent=persistent)
        stage = kind(group, source, load_module(path, interpret=interpret), path, ins, outs)
        stages.append((stage, [v.dtype for v in ins + outs]))
    return SplitKernel(group, stages[0][0], stages[1][0]), stages
