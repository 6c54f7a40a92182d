"""Where a dynamic graph's host time goes, next to the static graph (a GPU probe).

    python benchmarks/probes/dynamic_host.py [--seq 128] [--layers 12]

GPT-2 prefill in bf16: our default plan after a sequence-length change (the dynamic graph) and
with capture.dynamic: false (static). Prints ms per call for both, the top functions by own time
under cProfile, and the CUDA kernels per call from the profiler."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dynamic_shapes import Logits  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    import transformers
    config = transformers.GPT2Config(n_layer=args.layers, attn_implementation="sdpa")
    model = Logits(transformers.GPT2LMHeadModel(config)).cuda().to(torch.bfloat16).eval()
    ids = torch.randint(0, 50257, (1, args.seq), device="cuda")
    with torch.no_grad():
        dynamic = compile_with_plan(model, "default")
        for s in (args.seq // 2, args.seq + 16, args.seq):
            dynamic(torch.randint(0, 50257, (1, s), device="cuda"))
        static = compile_with_plan(model, "default", options={"capture": {"dynamic": False}})
        static(ids)
        for name, fn in (("dynamic", dynamic), ("static", static), ("dynamic", dynamic), ("static", static)):
            for _ in range(10):
                fn(ids)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                fn(ids)
            torch.cuda.synchronize()
            print(f"{name}: {(time.perf_counter() - t) / 50 * 1e3:.3f} ms per call", flush=True)
        for name, fn in (("dynamic", dynamic), ("static", static)):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(50):
                fn(ids)
            torch.cuda.synchronize()
            profile.disable()
            print(f"--- {name}: cProfile, 50 calls")
            pstats.Stats(profile).sort_stats("tottime").print_stats(14)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                    torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fn(ids)
                torch.cuda.synchronize()
            print(f"--- {name}: profiler, 5 calls")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
