"""Sweep the Triton backend's reduction launch heuristics on the H200's hardest reductions:
GPT-2's cross-entropy over 50257 logits (looped row reductions, forward and backward) and the
column sums of bias gradients (a reduction over the strided axis), plus that column sum split in
two stages by hand. Each setting patches the module constants of ``passes/codegen/triton/source.py``
and compiles afresh; CUDA-event medians per call are printed and written as JSON.

    python benchmarks/probes/sweep_reductions.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_suite import cuda_time  # noqa: E402

os.environ["PIPELINE_CACHE_GRAPHS"] = "0"        # module constants are not part of the graph key

LOOPED = [{}, {"LOOPED_RBLOCK": 2048, "LOOPED_WARP_ELEMENTS": 256}, {"LOOPED_RBLOCK": 4096, "LOOPED_WARP_ELEMENTS": 256},
          {"LOOPED_RBLOCK": 1024, "LOOPED_WARP_ELEMENTS": 128}, {"LOOPED_RBLOCK": 2048, "LOOPED_WARP_ELEMENTS": 512},
          {"LOOPED_RBLOCK": 4096, "LOOPED_WARP_ELEMENTS": 512}, {"LOOPED_RBLOCK": 8192, "LOOPED_WARP_ELEMENTS": 512}]
COLUMNS = [{}, {"MIN_PROGRAMS": 1}, {"OUTER_XBLOCK": 32, "MIN_PROGRAMS": 1}, {"OUTER_XBLOCK": 16, "MIN_PROGRAMS": 1},
           {"OUTER_XBLOCK": 128, "MIN_PROGRAMS": 1, "TILE_ELEMENTS": 8192}, {"MIN_PROGRAMS": 132}]


def ce(logits, target):
    return F.cross_entropy(logits.float(), target)


def ce_train(logits, target):
    loss = F.cross_entropy(logits.float(), target)
    (grad,) = torch.autograd.grad(loss, logits)
    return grad


def colsum(x):
    return x.sum(0)


def colsum_split(x):
    return x.view(32, -1, x.shape[-1]).sum(1, dtype=torch.float32).sum(0).to(x.dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from passes.codegen.triton import blocks as triton_blocks
    from pipeline import compile_with_plan

    torch.manual_seed(0)
    logits = torch.randn(4096, 50264, device="cuda", dtype=torch.bfloat16)[:, :50257]   # pad-mm's layout
    target = torch.randint(0, 50257, (4096,), device="cuda")
    trainable = logits.detach().requires_grad_()
    x = torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16)
    defaults = {name: getattr(triton_blocks, name) for name in
                ("LOOPED_RBLOCK", "LOOPED_WARP_ELEMENTS", "OUTER_XBLOCK", "MIN_PROGRAMS", "TILE_ELEMENTS")}
    rows = []
    cases = [("ce forward", ce, (logits, target), LOOPED), ("ce forward+backward", ce_train, (trainable, target), LOOPED),
             ("column sum 4096x768", colsum, (x,), COLUMNS), ("column sum split by hand", colsum_split, (x,), COLUMNS[:1])]
    for name, fn, inputs, settings in cases:
        eager = cuda_time(fn, inputs, iters=30, rounds=3)
        for setting in settings:
            for key, value in {**defaults, **setting}.items():
                setattr(triton_blocks, key, value)
            torch._dynamo.reset()
            plan = "training" if name.endswith("backward") else "default"
            compiled = compile_with_plan(fn, plan)
            try:
                ms = cuda_time(compiled, inputs, iters=30, rounds=3)
                error = None
            except Exception as exc:       # a setting Triton cannot compile is a result, not a crash
                ms, error = None, f"{type(exc).__name__}: {str(exc)[:200]}"
            row = {"case": name, "setting": setting or "default", "eager_ms": round(eager, 4),
                   "ours_ms": None if ms is None else round(ms, 4), "error": error}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for key, value in defaults.items():
        setattr(triton_blocks, key, value)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sweep-reductions.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
