"""Why does the MLP row take more host time under max-autotune-no-cudagraphs than under default?
(on the GPU) Host µs per call of both plans on the same model, the final host code of each, and a
profile of 300 calls of each."""
import cProfile
import pstats
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from workloads import MLP  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402

torch.manual_seed(0)
model, args = MLP().cuda().eval(), (torch.randn(128, 256, device="cuda"),)
compiled = {plan: compile_with_plan(model, plan) for plan in ("default", "max-autotune-no-cudagraphs")}
with torch.no_grad():
    for plan, fn in compiled.items():
        for _ in range(20):
            fn(*args)
        torch.cuda.synchronize()
    for rep in range(3):
        for plan, fn in compiled.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                fn(*args)
            host = (time.perf_counter() - start) / 200 * 1e6
            torch.cuda.synchronize()
            print(f"{plan}: {host:.1f} us host per call")
    for plan, fn in compiled.items():
        print(f"--- {plan}: final code of graph 0")
        for graph in compilation_of(fn).graphs:
            print(graph.final_code)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            fn(*args)
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
