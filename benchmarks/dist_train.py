"""Distributed training benchmark: GPT-2 (6 layers) trained data-parallel under DistributedDataParallel
or FSDP2 (``fully_shard``), eager against torch.compile (Inductor) and our ``training`` plan under the
same wrapper, in one run. Launch one process per GPU with torchrun:

    torchrun --nproc-per-node 2 benchmarks/dist_train.py --wrapper ddp --out "$OUT"
    torchrun --nproc-per-node 2 benchmarks/dist_train.py --wrapper fsdp2 --out "$OUT"
    torchrun --nproc-per-node 2 benchmarks/dist_train.py --wrapper ddp --out "$OUT" \\
        --variants ours --steps 5 --load-artifacts "$OUT/bundle"                     # fleet start
    .venv/bin/torchrun --nproc-per-node 2 benchmarks/dist_train.py --device cpu --small --steps 6   # smoke

Every variant trains its own copy of the same initial weights with AdamW on the same per-rank data
(four batches of random tokens per rank, cycled), under bf16 autocast on CUDA. The variants take turns
step by step, so clock drift hits them alike. Per variant: the loss curve (rank 0's and every rank's
largest relative deviation from eager's), the median step time over the steps after ``--warmup``
(CUDA events around one whole step: forward, backward with its gradient communication, optimizer
step; the slowest rank's median), the first step's seconds (compile) and, for ours, the graph
count and cache statuses. ``--save-artifacts`` (rank 0, after its first step of ``ours``) writes a
bundle; ``--load-artifacts`` makes every rank load one into an empty cache before compiling, so its
first step runs no pass (fleet start). Rank 0 writes ``dist-<wrapper>.json`` and ``.md`` under ``--out``.

Variants, DDP: ``eager``, ``inductor`` (``torch.compile(DDP(model))``), ``ours``
(``compile_with_plan(DDP(model), "training")``), and with CUDA graphs ``inductor-reduce-overhead``
(``mode="reduce-overhead"``) and ``ours-cudagraphs`` (the built-in plan ``training-reduce-overhead``:
the training plan with forward and backward graphs recorded and replayed). FSDP2 (every GPT-2 block and the root sharded):
``eager``; compiled whole, ``inductor`` and ``ours`` (Dynamo breaks the graph at FSDP2's hooks and
compiles the frames between them); compiled per block with the hooks eager, ``inductor-blocks``
(``torch.compile`` of the block class's forward) and ``ours-regions`` (``capture.regions``).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)   # NVLink multicast stays off (device README)
RANK = int(os.environ.get("RANK", "0"))
_CACHE_BASE = os.environ.get("PIPELINE_CACHE_DIR") or tempfile.mkdtemp(prefix="dist-train-cache-")
os.environ["PIPELINE_CACHE_DIR"] = str(Path(_CACHE_BASE) / f"rank{RANK}")   # no rank reads another's cache

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_suite import gpt2_train  # noqa: E402

import pipeline  # noqa: E402

CUDAGRAPHS_PLAN = "training-reduce-overhead"
LOSS_TOLERANCE = 2e-2   # largest relative deviation of a compiled loss curve from eager's (bf16 autocast)


def block_class(model: torch.nn.Module) -> type:
    return type(model.model.transformer.h[0])


def shard(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    for block in model.model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def compile_blocks_with_inductor(model: torch.nn.Module) -> torch.nn.Module:
    """torch.compile of each sharded block's forward, its FSDP2 hooks left eager (one compiled
    function for the class, as ``capture.regions`` does for ours)."""
    forward = block_class(model).forward
    compiled = torch.compile(lambda block, *args, **kwargs: forward(block, *args, **kwargs))
    for block in model.model.transformer.h:
        block.forward = functools.partial(compiled, block)
    return model


def variants(wrapper: str, names: list[str], block: str) -> dict[str, Callable[[torch.nn.Module], Any]]:
    """label -> make(model) returning what a step calls (the model's parameters are trained)."""
    if wrapper == "ddp":
        table = {"eager": lambda m: DDP(m),
                 "inductor": lambda m: torch.compile(DDP(m)),
                 "ours": lambda m: pipeline.compile_with_plan(DDP(m), "training"),
                 "inductor-reduce-overhead": lambda m: torch.compile(DDP(m), mode="reduce-overhead"),
                 "ours-cudagraphs": lambda m: pipeline.compile_with_plan(DDP(m), CUDAGRAPHS_PLAN)}
    else:
        table = {"eager": lambda m: shard(m),
                 "inductor": lambda m: torch.compile(shard(m)),
                 "ours": lambda m: pipeline.compile_with_plan(shard(m), "training"),
                 "inductor-blocks": lambda m: compile_blocks_with_inductor(shard(m)),
                 "ours-regions": lambda m: pipeline.compile_with_plan(
                     shard(m), "training", options={"capture": {"regions": [block]}})}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown} for --wrapper {wrapper}; choose from {sorted(table)}")
    return {n: table[n] for n in (names or list(table))}


class Variant:
    """One model copy, its wrapper and optimizer, and what its steps measured."""

    def __init__(self, label: str, make: Callable, build: Callable[[], torch.nn.Module], device: str):
        self.label = label
        self.model = build()
        self.call = make(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.device = device
        self.losses: list[float] = []
        self.ms: list[float] = []
        self.first_step_s = 0.0
        self.error = ""

    def step(self, ids: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.device == "cuda"):
            loss = self.call(ids)
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.item())

    def timed_step(self, ids: torch.Tensor) -> None:
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            begin = time.perf_counter()
            start.record()
            self.step(ids)
            end.record()
            torch.cuda.synchronize()
            elapsed_ms = start.elapsed_time(end)
        else:
            begin = time.perf_counter()
            self.step(ids)
            elapsed_ms = (time.perf_counter() - begin) * 1e3
        if not self.ms and not self.first_step_s:
            self.first_step_s = time.perf_counter() - begin
        self.ms.append(elapsed_ms)

    def summary(self, warmup: int) -> dict:
        out: dict = {"losses": self.losses, "first_step_s": self.first_step_s,
                     "median_ms": statistics.median(self.ms[warmup:]) if len(self.ms) > warmup else None}
        if self.error:
            out["error"] = self.error
        compilation = pipeline.compilation_of(self.call) if self.label.startswith("ours") else None
        if compilation is not None:
            summary = compilation.summary()
            out.update(graph_count=summary["graph_count"], recompiles=summary["recompiles"],
                       compile_seconds=compilation.compile_seconds,
                       graph_breaks=[b.splitlines()[0] for b in summary["graph_breaks"]],
                       statuses={g.graph_id: str(g.cache.get("status")) for g in compilation.graphs},
                       cudagraphs=[f"{g.graph_id}: {note['message']}" for g in compilation.graphs
                                   for note in g.notes if note.get("topic") == "cudagraphs"][:40],
                       passes_run=sum(len(g.passes) for g in compilation.graphs))
        return out


def rank_data(rank: int, small: bool, device: str) -> list[torch.Tensor]:
    batch, seq, vocab = (2, 64, 1000) if small else (8, 512, 50257)
    generator = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, vocab, (batch, seq), generator=generator).to(device) for _ in range(4)]


def run(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dims = (2, 128, 4, 1000) if args.small else (6, 768, 12, 50257)

    def build() -> torch.nn.Module:
        torch.manual_seed(0)   # the same initial weights in every variant and on every rank
        return gpt2_train(*dims).to(device)

    block = block_class(build()).__name__
    if args.load_artifacts:
        loaded = pipeline.load_artifacts(args.load_artifacts, os.environ["PIPELINE_CACHE_DIR"])
        print(f"rank {rank}: loaded {loaded}", flush=True)
    data = rank_data(rank, args.small, device)
    runs = [Variant(label, make, build, device) for label, make in
            variants(args.wrapper, args.variants.split(",") if args.variants else [], block).items()]
    for step in range(args.steps):
        for v in runs:
            if v.error:
                continue
            try:
                v.timed_step(data[step % len(data)])
            except Exception as exc:  # noqa: BLE001 - a failing variant is reported, the others go on
                v.error = f"step {step}: {type(exc).__name__}: {' '.join(str(exc).split())[:800]}"
                traceback.print_exc()
            if step == 0 and v.label == "ours" and args.save_artifacts and rank == 0 and not v.error:
                pipeline.save_artifacts(v.call, args.save_artifacts)
        if step == 0:
            print(f"rank {rank}: first step " + ", ".join(f"{v.label} {v.first_step_s:.1f} s" for v in runs),
                  flush=True)
    mine = {v.label: v.summary(args.warmup) for v in runs}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone}


def report(args: argparse.Namespace, ranks: list[dict]) -> dict:
    labels = list(ranks[0])
    eager = [r["eager"]["losses"] for r in ranks] if "eager" in labels else None
    rows = []
    for label in labels:
        per_rank = [r[label] for r in ranks]
        row: dict = {"variant": label,
                     "median_ms": max((p["median_ms"] or float("nan")) for p in per_rank),
                     "first_step_s": max(p["first_step_s"] for p in per_rank),
                     "final_loss_rank0": per_rank[0]["losses"][-1] if per_rank[0]["losses"] else None,
                     "errors": [p["error"] for p in per_rank if p.get("error")]}
        if eager is not None and label != "eager":
            deviation = max(abs(a - e) / abs(e) for p, ref in zip(per_rank, eager)
                            for a, e in zip(p["losses"], ref))
            row["max_loss_relative_deviation"] = deviation
            if "inductor" in labels and label != "inductor":   # the yardstick: how far Inductor drifts
                row["max_loss_relative_deviation_vs_inductor"] = max(
                    abs(a - e) / abs(e) for p, ref in zip(per_rank, (r["inductor"]["losses"] for r in ranks))
                    for a, e in zip(p["losses"], ref))
            row["loss_curve_ok"] = deviation <= LOSS_TOLERANCE and len(per_rank[0]["losses"]) == len(eager[0])
        for key in ("graph_count", "recompiles", "graph_breaks", "passes_run"):
            if key in per_rank[0]:
                row[key] = [p[key] for p in per_rank] if key == "passes_run" else per_rank[0][key]
        if "statuses" in per_rank[0]:   # per rank: how many graph records were cache hits, misses, ...
            row["statuses"] = [" ".join(f"{s} {list(p['statuses'].values()).count(s)}"
                                        for s in sorted(set(p["statuses"].values()))) for p in per_rank]
        rows.append(row)
    return {"rows": rows, "loss_curves_rank0": {label: ranks[0][label]["losses"] for label in labels}}


def markdown(result: dict) -> str:
    lines = [f"### {result['wrapper']} — {result['workload']}, {result['world']} ranks, {result['steps']} steps "
             f"({result['date']}, {result['device_name']})", "",
             "| variant | median ms/step (slowest rank) | first step s | final loss (rank 0) | "
             "max loss deviation vs eager | graphs | cache | errors |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        deviation = row.get("max_loss_relative_deviation")
        lines.append(f"| {row['variant']} | {row['median_ms']:.2f} | {row['first_step_s']:.1f} | "
                     f"{row['final_loss_rank0']:.4f} | "
                     + (f"{deviation:.2e} ({'ok' if row['loss_curve_ok'] else 'FAIL'})" if deviation is not None else "—")
                     + f" | {row.get('graph_count', '—')} | {row.get('statuses', '—')} | "
                     + ("; ".join(row["errors"])[:300] or "—") + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wrapper", choices=["ddp", "fsdp2"], default="ddp")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    parser.add_argument("--variants", default="", help="comma-separated subset (default: all of the wrapper's)")
    parser.add_argument("--small", action="store_true", help="a 2-layer d128 GPT-2, b2 s64 (smoke test)")
    parser.add_argument("--save-artifacts", default="", help="rank 0 saves ours' compile artifacts here")
    parser.add_argument("--load-artifacts", default="", help="every rank loads a bundle before compiling")
    parser.add_argument("--out", default="", help="folder for dist-<wrapper>.json and .md (rank 0)")
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5))
    try:
        result = run(args)
        if dist.get_rank() == 0:
            name = "gpt2 2L d128 b2 s64" if args.small else "gpt2 6L d768 b8 s512 per rank, bf16 autocast, AdamW"
            result = {"wrapper": args.wrapper, "workload": name, "world": dist.get_world_size(), "steps": args.steps,
                      "date": datetime.datetime.now().isoformat(timespec="seconds"),
                      "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                      "torch": torch.__version__, "load_artifacts": bool(args.load_artifacts),
                      **report(args, result["ranks"]), "ranks": result["ranks"]}
            text = markdown(result)
            print(text, flush=True)
            if args.out:
                stem = f"dist-{args.wrapper}" + ("-fleet" if args.load_artifacts else "")
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / f"{stem}.json").write_text(json.dumps(result, indent=1))
                (Path(args.out) / f"{stem}.md").write_text(text)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
