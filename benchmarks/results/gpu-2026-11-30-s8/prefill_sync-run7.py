"""Does our GPT-2 prefill block the host? sync warnings, allocator device allocs, host issue time."""
import sys, time, traceback, warnings
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
from gpu_suite import workloads
from pipeline import compile_with_plan

for name, make, _ in workloads():
    if "gpt2" in name:
        model, args = make()
        break
variants = [("inductor", torch.compile(model)), ("ours", compile_with_plan(model, "default"))]
with torch.no_grad():
    for label, fn in variants:
        for _ in range(5):
            fn(*args)
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        allocs, frees = stats.get("num_device_alloc", 0), stats.get("num_device_free", 0)
        times = []
        for _ in range(20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        print(label, "host issue ms (min/median):", round(min(times), 3), round(sorted(times)[10], 3),
              "cudaMalloc:", stats.get("num_device_alloc", 0) - allocs, "cudaFree:", stats.get("num_device_free", 0) - frees)
        seen = {}

        def hook(message, category, filename, lineno, file=None, line=None):
            frames = [f for f in traceback.format_stack()[:-2] if "warnings" not in f][-3:]
            key = str(message)[:100] + " @ " + " | ".join(x.strip().replace("\n", " ")[:160] for x in frames)
            seen[key] = seen.get(key, 0) + 1

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = hook
            torch.cuda.set_sync_debug_mode("warn")
            fn(*args)
            torch.cuda.set_sync_debug_mode(0)
        print(label, "synchronizing calls:", len(seen))
        for key, count in seen.items():
            print("   ", count, key)
        t = time.perf_counter()
        for _ in range(20):
            fn(*args)
        torch.cuda.synchronize()
        print(label, "wall ms per call (20 back to back):", round((time.perf_counter() - t) / 20 * 1e3, 3))
