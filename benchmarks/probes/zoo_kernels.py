"""Where the GPU (or CPU) time of zoo models goes, per variant: torch.profiler's kernels grouped
by name (calls and time per model call), for eager, Inductor default and our default plan, side
by side, so that a model where ours trails shows which kernels differ.

    python benchmarks/probes/zoo_kernels.py --device cuda --models vit,t5 --out DIR [--plan P]
        [--host-profile CALLS]    # and where the host time of Inductor's and our calls goes
        [--train]                 # a training step as the zoo runs it (forward, loss, backward)
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from zoo import MODELS, load  # noqa: E402
from pipeline import compile_with_plan  # noqa: E402


def kernel_table(fn, args, kwargs, calls: int, device: str, train: bool = False) -> tuple[dict, float]:
    """{kernel name: (launches per call, us per call)} and the wall ms per call."""
    import contextlib
    import time
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with contextlib.nullcontext() if train else torch.no_grad():
        for _ in range(3):
            fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / calls * 1e3
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(calls):
                fn(*args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
    table: dict = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        if device == "cuda" and not on_device:
            continue
        if device != "cuda" and (event.cpu_parent is not None or not event.name.startswith(("aten::", "cpp_", "graph_"))):
            continue
        entry = table[event.name]
        entry[0] += 1
        entry[1] += (event.device_time if on_device else event.cpu_time_total)
    return {k: (v[0] / calls, v[1] / calls) for k, v in table.items()}, wall


def train_step(fn, built, device: str):
    """The zoo's training step around ``fn``: forward (under bf16 autocast on CUDA), loss, backward,
    gradients cleared."""
    def step(*args, **kwargs):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = fn(*args, **kwargs)
        built.loss(out).backward()
        built.module.zero_grad(set_to_none=True)
    return step


def host_profile(fn, args, kwargs, calls: int, top: int) -> str:
    """cProfile of ``calls`` calls (after the timed ones): where the host time of a call goes."""
    import cProfile
    import io
    import pstats
    profile = cProfile.Profile()
    with torch.no_grad():
        profile.enable()
        for _ in range(calls):
            fn(*args, **kwargs)
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return "\n".join(line[:220] for line in text.getvalue().splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", required=True)
    parser.add_argument("--size", default=None)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None)
    parser.add_argument("--plan", default="default", help="our plan (a name or a YAML path)")
    parser.add_argument("--train", action="store_true", help="time a training step (the zoo's) instead")
    parser.add_argument("--host-profile", type=int, default=0, metavar="CALLS",
                        help="also cProfile this many calls of Inductor and ours (host time by function)")
    args = parser.parse_args()
    size = args.size or ("full" if args.device == "cuda" else "small")
    dtype = torch.bfloat16 if args.device == "cuda" and not args.train else torch.float32
    load()
    lines = []
    for name in args.models.split(","):
        built = MODELS[name].build(args.device, dtype, size)
        inputs, kw = built.inputs(0)
        inputs = tuple(a.to(args.device) if isinstance(a, torch.Tensor) else a for a in inputs)
        kw = {k: (v.to(args.device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        plan = "training" if args.train and args.plan == "default" else args.plan
        variants = {"eager": built.module, "inductor": torch.compile(built.module),
                    "ours": compile_with_plan(built.module, plan)}
        if args.train:
            from zoo.runner import no_dropout
            built.module.train()
            no_dropout(built.module)
            variants = {label: train_step(fn, built, args.device) for label, fn in variants.items()}
        tables = {}
        for label, fn in variants.items():
            try:
                tables[label] = kernel_table(fn, inputs, kw, args.calls, args.device, args.train)
            except Exception as error:  # noqa: BLE001 - a probe reports and goes on
                lines.append(f"{name} {label}: {type(error).__name__}: {str(error)[:300]}")
        for label, (table, wall) in tables.items():
            total = sum(us for _, us in table.values())
            launches = sum(n for n, _ in table.values())
            lines.append(f"\n## {name} {label}: wall {wall:.3f} ms, kernel time {total / 1e3:.3f} ms, "
                         f"{launches:.0f} launches per call")
            for kernel, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][1])[:args.top]:
                lines.append(f"{us:9.1f} us {n:5.1f}x  {kernel[:150]}")
        for label in ("inductor", "ours") if args.host_profile else ():
            if label in tables:
                lines.append(f"\n## {name} {label}: host profile of {args.host_profile} calls\n"
                             + host_profile(variants[label], inputs, kw, args.host_profile, args.top))
        print("\n".join(lines), flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "zoo-kernels.txt").write_text("\n".join(lines))
        del variants, built
        torch._dynamo.reset()
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
