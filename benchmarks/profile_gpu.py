"""Profile one GPU workload under eager, Inductor and a plan: top CUDA kernels by time.

    python benchmarks/profile_gpu.py gpt2 [--plan default] [--host]

``--host`` profiles the host side instead (cProfile over 20 calls, by own time): where the
per-call CPU time of the generated wrapper goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_suite import workloads  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("--plan", default="default")
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--host", action="store_true")
    args = parser.parse_args()
    name, build, _ = next(w for w in workloads() if args.workload in w[0])
    torch.manual_seed(0)
    model, inputs = build()
    with torch.no_grad():
        for label, fn in (("inductor", torch.compile(model)), (f"ours:{args.plan}", compile_with_plan(model, args.plan))):
            for _ in range(3):
                fn(*inputs)
            torch.cuda.synchronize()
            if args.host:
                import cProfile
                import pstats
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(20):
                    fn(*inputs)
                profiler.disable()
                torch.cuda.synchronize()
                print(f"== {name}: {label} (host, 20 calls)")
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.rows)
                continue
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn(*inputs)
                torch.cuda.synchronize()
            print(f"== {name}: {label}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
