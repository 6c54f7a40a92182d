"""One rank of the CPU distributed tests (tests/test_distributed.py): joins a gloo process group
through a FileStore, runs one scenario and prints one JSON line with what it saw.

    python tests/distributed_worker.py SCENARIO --rank R --world N --work DIR

Scenarios:

``ddp``       eager DistributedDataParallel, then the same model and data compiled with the
              ``training`` plan (1 MiB buckets: Dynamo's DDPOptimizer splits the graph in two),
              then again with ``torch._dynamo.config.optimize_ddp = False`` (no split).
``fsdp2``     the same with ``fully_shard`` (FSDP2) on every layer and the root instead of DDP,
              compiled with ``capture.regions`` (each sharded layer's forward compiled, its
              hooks eager), and once compiled whole (nothing captured; the plan warns).
``fleet``     rank 0 compiles (on a DDP model of its own, in a group of one), saves the artifacts
              and passes a barrier; the other ranks load them into empty caches before their first
              call; then every rank trains the world-wide DDP model.
``recompile`` rank 1 alone changes its batch size at step 3; steps 3 and 4 run under
              ``pipeline.stance(--stance)``: ``default`` recompiles, ``fail_on_recompile`` refuses.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import pipeline  # noqa: E402

WIDTH = 256
STEPS = 5


class Layer(torch.nn.Module):
    """One block: a linear layer and a GELU (FSDP2 shards each block, regions compile it)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


class MLP(torch.nn.Module):
    """Six 256-wide layers: 1.5 MiB of fp32 parameters, so 1 MiB DDP buckets make two buckets."""

    def __init__(self, width: int = WIDTH, depth: int = 6):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def batches(rank: int, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-rank random data, the same for every run of a rank."""
    generator = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(n, WIDTH, generator=generator), torch.randn(n, WIDTH, generator=generator))
            for n in sizes]


def train(model: torch.nn.Module, step_fn: Callable, data: list) -> list[float]:
    """SGD steps of an MSE loss; ``model`` owns the parameters, ``step_fn`` is what is called."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in data:
        loss = F.mse_loss(step_fn(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def fresh_model() -> MLP:
    torch.manual_seed(0)   # the same initial parameters on every rank and in every run
    return MLP()


def full_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        p = p.detach()
        out.append(p.full_tensor() if hasattr(p, "full_tensor") else p.clone())
    return out


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def compile_summary(compiled: Any) -> dict:
    compilation = pipeline.compilation_of(compiled)
    summary = compilation.summary()
    return {"graph_count": summary["graph_count"],
            "graph_ids": [g.graph_id for g in compilation.graphs],
            "graph_breaks": [b.splitlines()[0] for b in summary["graph_breaks"]],
            "recompiles": summary["recompiles"],
            "statuses": {g.graph_id: g.cache.get("status") for g in compilation.graphs},
            "passes_run": {g.graph_id: [p["pass"] for p in g.passes] for g in compilation.graphs},
            "compile_seconds": compilation.compile_seconds}


def scenario_ddp(rank: int, args: argparse.Namespace) -> dict:
    data = batches(rank, [16] * STEPS)
    eager = fresh_model()
    eager_ddp = DDP(eager, bucket_cap_mb=1)
    eager_losses = train(eager, eager_ddp, data)
    result: dict = {"eager_losses": eager_losses}
    for label, optimize_ddp in (("buckets", True), ("no_split", False)):
        torch._dynamo.config.optimize_ddp = optimize_ddp
        model = fresh_model()
        compiled = pipeline.compile_with_plan(DDP(model, bucket_cap_mb=1), "training")
        started = time.perf_counter()
        losses = train(model, compiled, data)
        result[label] = {"losses": losses, "seconds": time.perf_counter() - started,
                         "max_parameter_difference": max_difference(full_parameters(model),
                                                                    full_parameters(eager)),
                         **compile_summary(compiled)}
    return result


def scenario_fsdp2(rank: int, args: argparse.Namespace) -> dict:
    """Eager FSDP2, then the same compiled with the training plan and ``capture.regions: [Layer]``
    (hooks eager, each sharded layer's forward compiled), then compiled whole (the plan warns)."""
    import warnings

    from torch.distributed.fsdp import fully_shard

    data = batches(rank, [16] * STEPS)

    def sharded() -> MLP:
        model = fresh_model()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model

    eager = sharded()
    eager_losses = train(eager, eager, data)
    model = sharded()
    compiled = pipeline.compile_with_plan(model, "training", options={"capture": {"regions": ["Layer"]}})
    losses = train(model, compiled, data)
    result = {"eager_losses": eager_losses, "losses": losses,
              "max_parameter_difference": max_difference(full_parameters(model), full_parameters(eager)),
              **compile_summary(compiled)}
    whole = sharded()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled_whole = pipeline.compile_with_plan(whole, "training")
        result["whole"] = {"losses": train(whole, compiled_whole, data[:1]),
                           "warnings": [str(w.message) for w in caught if "FSDP2" in str(w.message)],
                           **compile_summary(compiled_whole)}
    return result


def scenario_fleet(rank: int, args: argparse.Namespace) -> dict:
    work = Path(args.work)
    bundle = work / "bundle"
    solo = dist.new_group([0])   # every rank takes part in creating a group
    result: dict = {}
    if rank == 0:
        model = fresh_model()
        compiled = pipeline.compile_with_plan(DDP(model, bucket_cap_mb=1, process_group=solo), "training",
                                              cache={"dir": str(work / "cache-0")})
        train(model, compiled, batches(rank, [16]))
        result["saved"] = compile_summary(compiled)
        pipeline.save_artifacts(compiled, bundle)
    dist.barrier()
    if rank != 0:
        result["loaded"] = pipeline.load_artifacts(bundle, work / f"cache-{rank}")
    model = fresh_model()
    compiled = pipeline.compile_with_plan(DDP(model, bucket_cap_mb=1), "training",
                                          cache={"dir": str(work / f"cache-{rank}")})
    started = time.perf_counter()
    train(model, compiled, batches(rank, [16]))
    result["first_step_seconds"] = time.perf_counter() - started
    result["first_step"] = compile_summary(compiled)
    result["parameter_sum"] = sum(p.double().sum().item() for p in full_parameters(model))
    return result


def scenario_recompile(rank: int, args: argparse.Namespace) -> dict:
    sizes = [16, 16, 8 if rank == 1 else 16, 16]
    data = batches(rank, sizes)
    eager = fresh_model()
    eager_losses = train(eager, DDP(eager, bucket_cap_mb=1), data)
    model = fresh_model()
    compiled = pipeline.compile_with_plan(DDP(model, bucket_cap_mb=1), "training")
    result: dict = {"eager_losses": eager_losses, "losses": train(model, compiled, data[:2])}
    try:
        with pipeline.stance(args.stance):   # after warm-up, as a serving or training loop would
            result["losses"] += train(model, compiled, data[2:])
    except Exception as exc:  # noqa: BLE001 - the scenario reports what each rank raised
        result["error"] = {"type": type(exc).__name__, "message": " ".join(str(exc).split())[:1500]}
    result["max_parameter_difference"] = max_difference(full_parameters(model), full_parameters(eager))
    result.update(compile_summary(compiled))
    return result


SCENARIOS = {"ddp": scenario_ddp, "fsdp2": scenario_fsdp2, "fleet": scenario_fleet,
             "recompile": scenario_recompile}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--work", required=True)
    parser.add_argument("--stance", default="default")
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)   # one core per rank
    dist.init_process_group("gloo", store=dist.FileStore(str(Path(args.work) / "store"), args.world),
                            rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.collective_timeout))
    try:
        result = SCENARIOS[args.scenario](args.rank, args)
    except Exception:  # noqa: BLE001 - the test prints it
        result = {"crashed": traceback.format_exc()[-4000:]}
    print(json.dumps({"rank": args.rank, **result}), flush=True)
    # No destroy_process_group: after a refused recompile the other rank is gone, and the
    # result is already out.
    os._exit(0)


if __name__ == "__main__":
    main()
