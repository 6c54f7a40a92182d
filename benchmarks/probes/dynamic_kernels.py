"""Kernels of a workload of benchmarks/dynamic_shapes.py at one size: eager, our static graph, our
dynamic graph (compiled after a first call at another size) and Inductor's ``dynamic=None`` graph,
side by side (torch.profiler's kernels grouped by name, launches and time per call).

    python benchmarks/probes/dynamic_kernels.py --device cuda --workload encoder --size 128 [--top 25]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dynamic_shapes import workloads  # noqa: E402
from probes.zoo_kernels import kernel_table  # noqa: E402
from pipeline import compile_with_plan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workload", default="encoder")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work = workloads(args.device, [args.workload])[0]
    model = work["model"]
    g = torch.Generator().manual_seed(0)
    other = work["sizes"][0] if work["sizes"][0] != args.size else work["sizes"][1]
    dynamic = compile_with_plan(model, "default")
    inductor = torch.compile(model)
    static = compile_with_plan(model, "default", options={"capture": {"dynamic": False}})
    with torch.no_grad():
        first = work["inputs"](other, g)
        dynamic(*first)
        inductor(*first)
    inputs = work["inputs"](args.size, g)
    variants = {"eager": model, "ours-static": static, "ours-dynamic": dynamic, "inductor-dynamic": inductor}
    for label, fn in variants.items():
        table, wall = kernel_table(fn, inputs, {}, args.calls, args.device)
        total = sum(us for _, us in table.values())
        launches = sum(n for n, _ in table.values())
        print(f"\n## {args.workload}@{args.size} {label}: wall {wall:.3f} ms, kernel time {total / 1e3:.3f} ms, "
              f"{launches:.0f} launches per call")
        for kernel, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][1])[:args.top]:
            print(f"{us:9.1f} us {n:5.1f}x  {kernel[:150]}")


if __name__ == "__main__":
    main()
