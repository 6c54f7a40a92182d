"""Profile one GPU workload under eager, Inductor and a plan: CUDA time per kernel category and the
top kernels, or the host side.

    python benchmarks/profile_gpu.py gpt2 [--plan default] [--host] [--out DIR]
    python benchmarks/profile_gpu.py --train [--strategy save-all] [--plan training] [--kernels] [--out DIR]

``--kernels`` lists each generated kernel of ours instead: CUDA ms, bytes read and written,
percent of copy bandwidth and ms above the bytes-moved floor, worst first (sources of the worst
under ``--out``/kernels). ``--host`` profiles the host side instead (cProfile over 20 calls, by own time): where the
per-call CPU time of the generated wrapper goes. ``--train`` profiles one GPT-2 6-layer train
step (forward, backward, AdamW) of eager, Inductor and the ``training`` plan. Per variant the
summary gives the wall time of a step, the host time to issue it (no synchronization inside), the
summed CUDA kernel time (wall above kernels: the GPU waits on the host) and that kernel time by category (matmul, attention, Triton, ATen pointwise,
reductions, copies, memsets, optimizer), so two variants can be compared line by line.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_suite import workloads  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402

CATEGORIES = [   # (category, pattern on the kernel name), first match wins
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("attention", r"flash|fmha|attention|sdpa|efficient"),
    ("matmul", r"gemm|cutlass|sm90_|nvjet|matmul|cublas|xmma|splitK"),
    ("triton", r"^triton|^fused_|^tem_"),
    ("memset", r"memset|fill"),
    ("copy", r"copy|memcpy|cat|index"),
    ("reduction", r"reduce|softmax|norm|sum|max|nll|cross_entropy|embedding"),
    ("aten pointwise", r"elementwise|vectorized|unrolled"),
]


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def profile_summary(label: str, step, *, steps: int = 3, rows: int = 12) -> str:
    """Wall ms per step, CUDA kernel ms per step, per category and the top kernels of ``step``."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) * 1e3 / steps
    issue = (issued - start) * 1e3 / steps      # host time to issue a step: above the CUDA time = host-bound
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_cat: dict = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        entry = per_cat[category(e.key)]
        entry[0] += e.self_device_time_total / 1e3 / steps
        entry[1] += e.count / steps
    total = sum(v[0] for v in per_cat.values())
    lines = [f"== {label}: wall {wall:.2f} ms/step, host issue {issue:.2f} ms/step, CUDA kernels {total:.2f} ms/step "
             f"({sum(v[1] for v in per_cat.values()):.0f} launches)"]
    for name, (ms, count) in sorted(per_cat.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"   {name:15s} {ms:7.3f} ms  {count:5.0f} launches")
    lines.append("   top kernels:")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:rows]:
        lines.append(f"   {e.self_device_time_total / 1e3 / steps:7.3f} ms x{e.count // steps:<4d} {e.key[:90]}")
    return "\n".join(lines)


COPY_BANDWIDTH = 4.26e12   # bytes read + written per second, measured on the H200 (2026-11-29)


def _distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor names (a broadcast dimension, stride 0, counts once)."""
    count = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            count *= size
    return count * t.element_size()


def kernel_table(label: str, step, out: str | None, *, rows: int = 40) -> str:
    """Every generated Triton kernel of one step: CUDA ms per step, bytes it reads and writes,
    achieved bandwidth, and the ms above its bytes-moved floor at copy bandwidth, worst first.
    The sources of the worst kernels go to ``out/kernels/``."""
    from passes.codegen.triton.runtime import TritonKernel
    moved: dict = defaultdict(int)
    sources: dict = {}
    original = TritonKernel.__call__
    on = []

    def recording(self, *inputs, **launch):
        outs = original(self, *inputs, **launch)
        if on:
            tensors = [t for t in (*inputs, *outs) if isinstance(t, torch.Tensor)]
            moved[self.generated.name] += sum(_distinct_bytes(t) for t in tensors)
            sources[self.generated.name] = self.generated.source
        return outs

    # The generated host code binds each kernel's __call__ when it is made: the wrapper must be in
    # place while the step compiles, and records only during the one step below.
    TritonKernel.__call__ = recording
    try:
        for _ in range(3):
            step()
        on.append(True)
        step()
        on.clear()
    finally:
        TritonKernel.__call__ = original
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    times = {e.key: e.self_device_time_total / 1e3 for e in prof.key_averages()
             if e.device_type == torch.autograd.DeviceType.CUDA}
    table = []
    for name, nbytes in moved.items():
        ms = times.get(name)
        if ms is None:
            continue
        floor = nbytes / COPY_BANDWIDTH * 1e3
        table.append((ms - floor, ms, nbytes, name))
    table.sort(reverse=True)
    total = sum(t[1] for t in table)
    lines = [f"== {label}: {len(table)} generated kernels, {total:.3f} ms/step, "
             f"{sum(t[0] for t in table):.3f} ms above their bytes-moved floors"]
    lines.append(f"   {'above floor':>11s} {'ms':>7s} {'MB':>8s} {'% copy bw':>9s}  kernel")
    for excess, ms, nbytes, name in table[:rows]:
        lines.append(f"   {excess:11.3f} {ms:7.3f} {nbytes / 1e6:8.1f} "
                     f"{100 * nbytes / COPY_BANDWIDTH * 1e3 / ms:8.1f}%  {name}")
    if out:
        folder = Path(out) / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
        for _, _, _, name in table[:rows]:
            (folder / f"{name}.py").write_text(sources[name])
    return "\n".join(lines)


def train_variants(strategies: list[str], skip: set, plan: str = "training"):
    from train_suite import gpt2_train, train_step
    torch.manual_seed(0)
    initial = gpt2_train().cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    variants = [("eager", lambda m: m), ("inductor", torch.compile)]
    variants += [(f"ours:training:{s}",
                  lambda m, s=s: compile_with_plan(m, plan, options={"partition": {"strategy": s}}))
                 for s in strategies]
    for label, make in variants:
        if label.split(":")[0] in skip:
            continue
        model = copy.deepcopy(initial)
        compiled = make(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        yield label, lambda: train_step(compiled, optimizer, (ids,), "cuda", torch.bfloat16)


def inference_variants(workload: str, plan: str):
    name, build, _ = next(w for w in workloads() if workload in w[0])
    torch.manual_seed(0)
    model, inputs = build()
    for label, fn in (("inductor", torch.compile(model)), (f"ours:{plan}", compile_with_plan(model, plan))):
        def call(fn=fn):
            with torch.no_grad():
                return fn(*inputs)
        yield f"{name}: {label}", call


def host_profile(label: str, call, rows: int) -> str:
    import cProfile
    import io
    import pstats
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
    return f"== {label} (host, 20 calls)\n{text.getvalue()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?", default="gpt2")
    parser.add_argument("--plan", default="default")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--strategy", default="save-all", help="partition strategies, comma-separated")
    parser.add_argument("--skip", default="", help="variants left out: eager, inductor (--train)")
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--host", action="store_true")
    parser.add_argument("--kernels", action="store_true",
                        help="per generated kernel: time, bytes moved, bandwidth, ms above the floor")
    parser.add_argument("--out", default=None, help="also write the summary to DIR/profile-<name>.txt")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    plan = args.plan if args.plan != "default" else "training"
    variants = train_variants(args.strategy.split(","), skip, plan) if args.train else inference_variants(args.workload, args.plan)
    texts = []
    for label, call in variants:
        if args.kernels:
            if "ours" not in label:
                continue
            text = kernel_table(label, call, args.out, rows=args.rows)
        elif args.host:
            text = host_profile(label, call, args.rows)
        else:
            text = profile_summary(label, call, rows=args.rows)
        print(text, flush=True)
        texts.append(text)
    if args.out:
        stem = "train" if args.train else args.workload.replace(" ", "_")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"profile-{stem}{'-host' if args.host else ''}{'-kernels' if args.kernels else ''}.txt").write_text("\n".join(texts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
