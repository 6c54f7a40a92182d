"""Tune a plan for each zoo model: ``pipeline.tune`` on the model's own inputs, one plan file per
model, for the zoo runner to compare with the built-in plans and Inductor in one run.

    python benchmarks/zoo/tune.py --device cuda --out tuned [--models gpt2,bert] [--budget 60]
    python benchmarks/zoo/runner.py --device cuda --mode inference --models gpt2,bert \\
        --variants inductor-default,inductor-reduce-overhead,ours-default,ours-reduce-overhead,ours-default@tuned/{model}.yaml

Each model is tuned in its own process (a crash costs that model only) with ``--budget`` seconds
for the search (built-in bases first, until it is spent; at least one). Writes ``<out>/<model>.yaml``
(the winner: a plan that extends its base and states what it changed) and ``<out>/tune.json`` (per
model: the winner, its base, the changed options and every trial's verdict and time per call, or
the error). Inference only: the models in the same dtype and inputs as the runner's inference rows.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))


def tune_one(name: str, device: str, size: str, budget: float, out: Path) -> dict:
    import torch

    import pipeline
    import zoo
    zoo.load()
    model = zoo.MODELS[name]
    missing = model.missing()
    if missing:
        return {"model": name, "skipped": missing}
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    built = model.build(device, dtype, size)
    args, kwargs = built.inputs(seed=0)
    with torch.no_grad():
        result = pipeline.tune(built.module.eval(), *args, budget=budget, out=out / f"{name}.yaml",
                               name=f"tuned-{name}", **kwargs)
    winner = result.winner
    return {"model": name, "winner": winner.name, "base": winner.base, "changes": winner.changes,
            "eager_ms": round(result.eager_ms, 4),
            "trials": [{"name": t.name, "verdict": t.verdict, "ms": None if t.ms is None else round(t.ms, 4)}
                       for t in result.trials]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="", help="comma-separated model names (default: every model the "
                                                     "device runs)")
    parser.add_argument("--size", default=None)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of option search per model")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model process")
    parser.add_argument("--out", required=True)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = args.size or ("full" if args.device.startswith("cuda") else "small")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(tune_one(args.child, args.device, size, args.budget, out)))
        return 0
    import zoo
    zoo.load()
    names = args.models.split(",") if args.models else [m.name for m in zoo.select(device=args.device)]
    rows = []
    for name in names:
        start = time.perf_counter()
        command = [sys.executable, __file__, "--child", name, "--device", args.device, "--size", size,
                   "--budget", str(args.budget), "--out", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=dict(os.environ))
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else \
                {"model": name, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"model": name, "error": f"timed out after {args.timeout:.0f} s"}
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        (out / "tune.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
