"""Host time per call of our dynamic graph against our static graph at one size, and where the
dynamic graph's host time goes (cProfile), for a workload of benchmarks/dynamic_shapes.py.

    python benchmarks/probes/dynamic_host.py --device cuda --workload encoder --size 64
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dynamic_shapes import workloads  # noqa: E402
from pipeline import compile_with_plan  # noqa: E402


def host_us(fn, inputs: tuple, calls: int, device: str) -> float:
    """Microseconds to issue one call (no synchronization inside the loop)."""
    for _ in range(5):
        fn(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    elapsed = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workload", default="encoder")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    work = workloads(args.device, [args.workload])[0]
    model = work["model"].to(args.device).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        dynamic = compile_with_plan(model, "default")
        for size in work["sizes"][:3]:
            dynamic(*work["inputs"](size, generator))
        static = compile_with_plan(model, {"extends": "default", "options": {"capture": {"dynamic": False}}})
        inputs = work["inputs"](args.size, generator)
        static(*inputs)
        for _ in range(3):
            print(f"host us per call: dynamic {host_us(dynamic, inputs, args.calls, args.device):.1f}, "
                  f"static {host_us(static, inputs, args.calls, args.device):.1f}")
        for name, fn in (("dynamic", dynamic), ("static", static)):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.calls):
                fn(*inputs)
            profile.disable()
            print(f"\n## {name}: {args.calls} calls")
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
