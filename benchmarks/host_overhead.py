"""Where does the host time of a compiled step go? (a GPU probe)

    python benchmarks/host_overhead.py [--out DIR] [--layers 6] [--skip eager]

On a host-bound GPU step the wall time is the host's time to issue it, so this measures that time
directly, next to Inductor's in the same process:

- ``phases``: the GPT-2 train step (train_suite's sizes) split into zero_grad, forward (the
  compiled call under autocast), backward and optimizer, in host ms per step. Every step starts on
  an idle GPU (synchronized); ``backward_idle`` is the backward's host time when it too starts on
  an idle GPU (above ``backward``: the host waited for the GPU during the backward).
- ``launch``: host µs per call of tiny compiled functions (a pointwise chain and a row softmax),
  where the kernel is negligible and the call's host path is everything, plus its pieces
  (``torch.empty_strided`` on the device, our kernel object's call alone).

Prints the tables and writes ``host-overhead.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_suite import gpt2_train  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402


def phase_times(compiled, model: torch.nn.Module, ids: torch.Tensor, steps: int = 30) -> dict[str, float]:
    """Median host ms per phase of a train step (each step starts on an idle GPU)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples: dict[str, list[float]] = {"zero_grad": [], "forward": [], "backward": [], "optimizer": [], "step": [],
                                       "backward_idle": []}
    for i in range(2 * steps + 3):
        idle = i % 2 == 1          # every other step: the backward starts on an idle GPU
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids)
        t2 = time.perf_counter()
        if idle:
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            loss.backward()
            if i >= 3:
                samples["backward_idle"].append((time.perf_counter() - t2) * 1e3)
            optimizer.step()
            continue
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        if i >= 3:
            for key, (a, b) in {"zero_grad": (t0, t1), "forward": (t1, t2), "backward": (t2, t3),
                                "optimizer": (t3, t4), "step": (t0, t4)}.items():
                samples[key].append((b - a) * 1e3)
    torch.cuda.synchronize()
    return {key: statistics.median(v) for key, v in samples.items()}


def trace_table(compiled, model: torch.nn.Module, ids: torch.Tensor, out: str | None, label: str,
                rows: int = 45) -> str:
    """One profiled step (host and CUDA activity): host self time per event name, the driver and
    runtime launch calls (a long one waits on a full launch queue), and the GPU's idle time."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids)
        with torch.profiler.record_function("## backward"):
            loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    host = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    lines = [f"== {label}: host self time per step by event (us), count per step"]
    for e in host[:rows]:
        lines.append(f"   {e.self_cpu_time_total / 3:9.1f} {e.count / 3:7.1f}  {e.key[:90]}")
    kernels = sorted((k for k in prof.events() if k.device_type == torch.autograd.DeviceType.CUDA
                      and k.time_range.elapsed_us() > 0), key=lambda k: k.time_range.start)
    if kernels:
        busy, end = 0.0, kernels[0].time_range.start
        for k in kernels:
            start = max(k.time_range.start, end)
            if k.time_range.end > start:
                busy += k.time_range.end - start
            end = max(end, k.time_range.end)
        span = kernels[-1].time_range.end - kernels[0].time_range.start
        lines.append(f"   GPU span {span / 3 / 1e3:.2f} ms/step, busy {busy / 3 / 1e3:.2f}, idle {(span - busy) / 3 / 1e3:.2f}")
    launches = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU
                and ("LaunchKernel" in e.name or "cuLaunch" in e.name)]
    if launches:
        durations = sorted(e.time_range.elapsed_us() for e in launches)
        lines.append(f"   launch calls {len(launches) / 3:.0f}/step: median {durations[len(durations) // 2]:.1f} us, "
                     f"p99 {durations[int(len(durations) * 0.99)]:.1f} us, max {durations[-1]:.1f} us, "
                     f"sum {sum(durations) / 3 / 1e3:.2f} ms/step")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(out) / f"trace-{label.replace(':', '-')}.json"))
    return "\n".join(lines)


def host_us(fn, calls: int = 2000) -> float:
    """Median over 5 rounds of the host µs per call of ``fn`` (no synchronization inside a round)."""
    for _ in range(50):
        fn()
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def pointwise(x):
    return torch.sigmoid(x) * 2.0 + 1.0


def row_softmax(x):
    return torch.softmax(x, dim=-1)


def launch_table() -> dict[str, dict[str, float]]:
    from passes.codegen.triton.runtime import TritonKernel
    rows = {}
    for name, fn, shape in (("pointwise 4096", pointwise, (4096,)), ("softmax 64x1024", row_softmax, (64, 1024))):
        x = torch.randn(*shape, device="cuda")
        ours = compile_with_plan(fn, "default")
        inductor = torch.compile(fn)
        row = {"eager": host_us(lambda: fn(x)), "inductor": host_us(lambda: inductor(x)),
               "ours": host_us(lambda: ours(x))}
        kernels = []
        original = TritonKernel.__call__

        def spy(self, *inputs, **launch):
            kernels.append((self, inputs))
            return original(self, *inputs, **launch)
        TritonKernel.__call__ = spy
        try:
            fresh = compile_with_plan(lambda v: fn(v) + 0.0, "default")   # a new graph binds the spy
            fresh(x)
        finally:
            TritonKernel.__call__ = original
        if kernels:
            kernel, inputs = kernels[0]
            row["ours: kernel call alone"] = host_us(lambda: kernel(*inputs))
        row["torch.empty_strided"] = host_us(lambda: torch.empty_strided(shape, x.stride(), device="cuda"))
        rows[name] = row
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--skip", default="", help="variants left out: eager, inductor, launch")
    parser.add_argument("--plans", default="training", help="our plans, comma-separated")
    parser.add_argument("--trace", action="store_true", help="also profile one step per variant (host events, "
                        "launch calls, GPU idle time) and save Chrome traces under --out")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    result: dict = {}
    if "launch" not in skip:
        result["launch_us"] = launch_table()
        print("host µs per call:")
        for name, row in result["launch_us"].items():
            print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    torch.manual_seed(0)
    initial = gpt2_train(layers=args.layers).cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    variants = [("eager", lambda m: m), ("inductor", torch.compile)]
    variants += [(f"ours:{p}", lambda m, p=p: compile_with_plan(m, p)) for p in args.plans.split(",")]
    result["phases_ms"] = {}
    print("host ms per phase of a train step:")
    for label, make in variants:
        if label.split(":")[0] in skip:
            continue
        model = copy.deepcopy(initial)
        compiled = make(model)
        times = phase_times(compiled, model, ids)
        result["phases_ms"][label] = times
        print(f"  {label:28s} " + "  ".join(f"{k} {v:6.2f}" for k, v in times.items()), flush=True)
        if args.trace:
            text = trace_table(compiled, model, ids, args.out, label)
            result.setdefault("trace", {})[label] = text
            print(text, flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "host-overhead.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
