"""Which calls of a compiled GPU step make the host wait for the GPU? (a GPU probe)

    python benchmarks/probes/sync_check.py [--plan training] [--out DIR]

A host-bound step stays fast only while the host runs ahead of the GPU; any call that waits for
the GPU (a device-to-host copy, ``.item()``, a host-to-device copy from pageable memory) drains
the queue there and serializes the two. This runs one GPT-2 train step (train_suite's sizes;
Inductor, and ``--plan`` with recompute-pointwise) under ``torch.cuda.set_sync_debug_mode("warn")``
and prints each synchronizing call once, with the innermost frames that led to it, plus a few
single ATen operators of interest. Calls made on the autograd engine's own thread (the backward)
may escape the warning hook: the operator list is the reliable part.
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_gpu import train_variants  # noqa: E402


def synchronizing_calls(fn) -> list[str]:
    """Distinct (message, stack) of the synchronizing calls ``fn`` makes."""
    found: dict[str, int] = {}
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        stack = "".join(traceback.format_stack(limit=8)[:-2])
        key = f"{message}\n{stack}"
        found[key] = found.get(key, 0) + 1

    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = original
    return [f"[{count}x] {key}" for key, count in found.items()]


def operators() -> dict:
    """Single ATen operators a compiled training graph may call."""
    n, d, rows = 50257, 768, 4096
    ids = torch.randint(0, n, (8, 512), device="cuda")
    grad = torch.randn(8, 512, d, device="cuda")
    zeros = lambda: torch.zeros(n, d, device="cuda")  # noqa: E731
    return {
        "index_put(accumulate=True)": lambda: torch.ops.aten.index_put(zeros(), [ids], grad, True),
        "index_put_(accumulate=True)": lambda: zeros().index_put_([ids], grad, accumulate=True),
        "index_add_": lambda: zeros().index_add_(0, ids.view(-1), grad.view(rows, d)),
        "embedding_dense_backward": lambda: torch.ops.aten.embedding_dense_backward(grad, ids, n, -1, False),
        "scalar_tensor": lambda: torch.ops.aten.scalar_tensor(0.0, device="cuda"),
        "cat": lambda: torch.cat([grad, grad], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default="training")
    parser.add_argument("--skip", default="", help="variants left out: inductor, operators")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    lines = []
    if "operators" not in skip:
        for name, op in operators().items():
            op()
            calls = synchronizing_calls(op)
            lines.append(f"== operator {name}: {'synchronizes' if calls else 'no synchronization'}")
    for label, step in train_variants(["recompute-pointwise"], skip | {"eager"}, args.plan):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        calls = synchronizing_calls(step)
        lines.append(f"== {label}: {len(calls)} distinct synchronizing call(s) in one step")
        lines += calls
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "sync-check.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
