"""CPU benchmark: eager vs torch.compile (Inductor) vs our cpu-inference plan, in one run.

    .venv/bin/python benchmarks/cpu_suite.py [--quick] [--out benchmarks/results]

Prints a table and writes JSON (with date, machine and commit) and a Markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import cpu_workloads  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402
from pipeline.numerics import compare  # noqa: E402


def timed_interleaved(fns: dict, args, *, rounds: int, batch_time: float) -> dict:
    """Median ms per call of each function. The functions take turns in ``rounds`` rounds so that
    drift on a shared machine (other processes, frequency changes) hits them alike; each round
    times a batch of calls, and the result is the median over rounds of the per-batch median.
    Short batches and many rounds follow the drift more closely: on the 2-core CI VM an A/A test
    (the same eager MLP twice) spread 16 % over four repetitions with 9 rounds of 0.25 s, and
    2 % with 45 rounds of 0.05 s (2026-11-30, commit c48a91b)."""
    for fn in fns.values():
        for _ in range(3):
            fn(*args)
    per_round: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times: list[float] = []
            start_all = time.perf_counter()
            while len(times) < 3 or time.perf_counter() - start_all < batch_time:
                start = time.perf_counter()
                fn(*args)
                times.append((time.perf_counter() - start) * 1e3)
            per_round[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in per_round.items()}


def relerr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    e, a = expected.double(), actual.double()
    return float((e - a).norm() / e.norm().clamp_min(1e-30))


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter timing (for smoke runs)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--plan", default="cpu-inference")
    args = parser.parse_args()
    rounds, batch_time = (15, 0.02) if args.quick else (45, 0.05)
    rows = []
    with torch.no_grad():
        for name, model, inputs in cpu_workloads():
            row: dict = {"workload": name}
            expected = model(*inputs)
            torch._dynamo.reset()
            start = time.perf_counter()
            inductor = torch.compile(model)
            got = inductor(*inputs)
            row["inductor_compile_s"] = time.perf_counter() - start
            row["inductor_relerr"] = relerr(expected, got)
            start = time.perf_counter()
            ours = compile_with_plan(model, args.plan)
            got = ours(*inputs)
            row["ours_compile_s"] = time.perf_counter() - start
            row["ours_relerr"] = relerr(expected, got)
            row["ours_matches"] = compare(expected, got) is None
            comp = compilation_of(ours)
            row["ours_kernels"] = sum(r.kernels for r in comp.graphs)
            row["ours_graphs"] = comp.summary()["graph_count"]
            times = timed_interleaved({"eager": model, "inductor": inductor, "ours": ours}, inputs,
                                      rounds=rounds, batch_time=batch_time)
            row.update({f"{k}_ms": v for k, v in times.items()})
            row["speedup_inductor"] = row["eager_ms"] / row["inductor_ms"]
            row["speedup_ours"] = row["eager_ms"] / row["ours_ms"]
            rows.append(row)
            print(f"{name:40s} eager {row['eager_ms']:8.3f} ms  inductor {row['inductor_ms']:8.3f} ms "
                  f"({row['speedup_inductor']:.2f}x)  ours {row['ours_ms']:8.3f} ms ({row['speedup_ours']:.2f}x) "
                  f"kernels {row['ours_kernels']} relerr {row['ours_relerr']:.1e}", flush=True)
    geo = {k: math.exp(statistics.mean(math.log(r[k]) for r in rows)) for k in ("speedup_inductor", "speedup_ours")}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit(), "machine": machine(), "plan": args.plan, "rows": rows,
              "geomean_speedup": geo}
    print(f"geometric-mean speed-up over eager: inductor {geo['speedup_inductor']:.2f}x, "
          f"ours {geo['speedup_ours']:.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"cpu-{result['date'][:10]}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (out / f"{stem}.md").write_text(markdown(result))
    print(f"wrote {out / stem}.json and .md")
    return 0


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# CPU benchmark {result['date']} (commit {result['commit']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, torch {m['torch']}. "
             f"Plan: `{result['plan']}`. Median ms per call; eager, Inductor and ours take turns in "
             f"interleaved rounds.", "",
             "| workload | eager | Inductor | ours | Inductor speed-up | our speed-up | our kernels | our relerr |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['workload']} | {r['eager_ms']:.3f} | {r['inductor_ms']:.3f} | {r['ours_ms']:.3f} | "
                     f"{r['speedup_inductor']:.2f}x | {r['speedup_ours']:.2f}x | {r['ours_kernels']} | "
                     f"{r['ours_relerr']:.1e} |")
    g = result["geomean_speedup"]
    lines += ["", f"Geometric-mean speed-up over eager: Inductor {g['speedup_inductor']:.2f}x, "
                  f"ours {g['speedup_ours']:.2f}x.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
