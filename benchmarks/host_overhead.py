"""Where does the host time of a compiled step go? (a GPU probe)

    python benchmarks/host_overhead.py [--out DIR] [--layers 6] [--skip eager]

On a host-bound GPU step the wall time is the host's time to issue it, so this measures that time
directly, next to Inductor's in the same process:

- ``phases``: the GPT-2 train step (train_suite's sizes) split into zero_grad, forward (the
  compiled call under autocast), backward and optimizer, in host ms per step. Every step starts on
  an idle GPU (synchronized), so the host never waits on a full launch queue.
- ``launch``: host µs per call of tiny compiled functions (a pointwise chain and a row softmax),
  where the kernel is negligible and the call's host path is everything, plus its pieces
  (``torch.empty_strided`` on the device, our kernel object's call alone).

Prints the tables and writes ``host-overhead.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_suite import gpt2_train  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402


def phase_times(compiled, model: torch.nn.Module, ids: torch.Tensor, steps: int = 30) -> dict[str, float]:
    """Median host ms per phase of a train step (each step starts on an idle GPU)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples: dict[str, list[float]] = {"zero_grad": [], "forward": [], "backward": [], "optimizer": [], "step": []}
    for i in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        if i >= 3:
            for key, (a, b) in {"zero_grad": (t0, t1), "forward": (t1, t2), "backward": (t2, t3),
                                "optimizer": (t3, t4), "step": (t0, t4)}.items():
                samples[key].append((b - a) * 1e3)
    torch.cuda.synchronize()
    return {key: statistics.median(v) for key, v in samples.items()}


def host_us(fn, calls: int = 2000) -> float:
    """Median over 5 rounds of the host µs per call of ``fn`` (no synchronization inside a round)."""
    for _ in range(50):
        fn()
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def pointwise(x):
    return torch.sigmoid(x) * 2.0 + 1.0


def row_softmax(x):
    return torch.softmax(x, dim=-1)


def launch_table() -> dict[str, dict[str, float]]:
    from passes.codegen.triton_runtime import TritonKernel
    rows = {}
    for name, fn, shape in (("pointwise 4096", pointwise, (4096,)), ("softmax 64x1024", row_softmax, (64, 1024))):
        x = torch.randn(*shape, device="cuda")
        ours = compile_with_plan(fn, "default")
        inductor = torch.compile(fn)
        row = {"eager": host_us(lambda: fn(x)), "inductor": host_us(lambda: inductor(x)),
               "ours": host_us(lambda: ours(x))}
        kernels = []
        original = TritonKernel.__call__

        def spy(self, *inputs, donors=()):
            kernels.append((self, inputs))
            return original(self, *inputs, donors=donors)
        TritonKernel.__call__ = spy
        try:
            fresh = compile_with_plan(lambda v: fn(v) + 0.0, "default")   # a new graph binds the spy
            fresh(x)
        finally:
            TritonKernel.__call__ = original
        if kernels:
            kernel, inputs = kernels[0]
            row["ours: kernel call alone"] = host_us(lambda: kernel(*inputs))
        row["torch.empty_strided"] = host_us(lambda: torch.empty_strided(shape, x.stride(), device="cuda"))
        rows[name] = row
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--skip", default="", help="variants left out: eager, inductor, launch")
    parser.add_argument("--plans", default="training", help="our plans, comma-separated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    result: dict = {}
    if "launch" not in skip:
        result["launch_us"] = launch_table()
        print("host µs per call:")
        for name, row in result["launch_us"].items():
            print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    torch.manual_seed(0)
    initial = gpt2_train(layers=args.layers).cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    variants = [("eager", lambda m: m), ("inductor", torch.compile)]
    variants += [(f"ours:{p}", lambda m, p=p: compile_with_plan(m, p)) for p in args.plans.split(",")]
    result["phases_ms"] = {}
    print("host ms per phase of a train step:")
    for label, make in variants:
        if label.split(":")[0] in skip:
            continue
        model = copy.deepcopy(initial)
        times = phase_times(make(model), model, ids)
        result["phases_ms"][label] = times
        print(f"  {label:28s} " + "  ".join(f"{k} {v:6.2f}" for k, v in times.items()), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "host-overhead.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
