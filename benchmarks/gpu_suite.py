"""GPU benchmark (H200): eager vs torch.compile (Inductor default, max-autotune-no-cudagraphs) vs our
plans, in one run. Prints a table; writes JSON (and a PNG plot when matplotlib is present).

    python benchmarks/gpu_suite.py --out "$OUT" [--only softmax,layernorm] [--skip-autotune]
        [--plans default,max-autotune] [--name gpu]
    python benchmarks/gpu_suite.py --out "$OUT" --only train --name gpu-train   # GPT-2 6L train step

Per row and variant: median ms per call (CUDA events), host ms per call (CPU time of issuing the
calls, from perf_counter around calls that are not synchronized: it measures the generated
wrapper's per-call overhead plus launch costs), relative error against eager, cold compile
seconds, and for memory-bound rows the percentage of copy bandwidth: against a device copy of
the same bytes timed in the same run (``pct_of_measured_copy``) and against the nominal 4.26 TB/s
(``pct_of_copy_bw``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import MLP  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402

COPY_BANDWIDTH = 4.26e12  # bytes/s, measured device copy (read + write) on the H200


def gelu_epilogue(x, w, b, s):
    return F.gelu(x @ w + b) * s


def layer_norm_gelu_residual(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + x


def softmax(x):
    return torch.softmax(x, dim=-1)


def gpt2(layers: int = 12):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config).eval().to("cuda", torch.bfloat16)

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).logits

    return Prefill()


def workloads(dev: str = "cuda"):
    bf = torch.bfloat16

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=dev, dtype=dtype)

    yield "softmax 8192x8192 bf16", lambda: (softmax, (r(8192, 8192, dtype=bf),)), 2 * 8192 * 8192 * 2
    yield ("layernorm+gelu+residual 8192x4096 bf16",
           lambda: (layer_norm_gelu_residual, (r(8192, 4096, dtype=bf), r(4096, dtype=bf), r(4096, dtype=bf))),
           2 * 8192 * 4096 * 2)
    yield "mlp 8xLinear(256) b128 fp32", lambda: (MLP().to(dev).eval(), (r(128, 256),)), None
    yield ("gelu(x@w+b)*s 8192x4096 bf16",
           lambda: (gelu_epilogue, (r(8192, 4096, dtype=bf), r(4096, 4096, dtype=bf) * 0.02,
                                    r(4096, dtype=bf), r(4096, dtype=bf))), None)
    yield ("gpt2 12L prefill b8 s512 bf16",
           lambda: (gpt2(), (torch.randint(0, 50257, (8, 512), device=dev),)), None)


def cuda_time(fn, args, *, iters: int = 50, rounds: int = 5) -> float:
    """Median over rounds of the mean ms per call, timed with CUDA events."""
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    results = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        results.append(start.elapsed_time(end) / iters)
    return statistics.median(results)


def copy_time(floor_bytes: int) -> float:
    """ms of a device copy moving the same bytes (half read, half written), timed like the rows:
    the bandwidth this GPU reaches in this run, which moves by several percent between machines."""
    src = torch.empty(floor_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time(lambda: dst.copy_(src), ())
    del src, dst
    return ms


def host_time(fn, args, *, iters: int = 20) -> float:
    """Mean CPU ms to issue one call (no synchronization inside the timed loop)."""
    fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / iters * 1e3


def relerr(expected, actual) -> float:
    e, a = expected.double(), actual.double()
    return float((e - a).norm() / e.norm().clamp_min(1e-30))


def fp32_reference(model, inputs):
    """The output of an fp32 copy of a bf16/fp16 module (None for anything else)."""
    if not isinstance(model, torch.nn.Module):
        return None
    dtypes = {p.dtype for p in model.parameters()}
    if not dtypes & {torch.bfloat16, torch.float16}:
        return None
    import copy
    reference = copy.deepcopy(model).float()
    out = first_tensor(reference(*inputs)).float()
    del reference
    torch.cuda.empty_cache()
    return out


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--only", default="")
    parser.add_argument("--skip-autotune", action="store_true")
    parser.add_argument("--plans", default="default,max-autotune-no-cudagraphs,reduce-overhead")
    parser.add_argument("--inductor-modes", default="default,max-autotune-no-cudagraphs,reduce-overhead",
                        help="torch.compile modes to compare (--skip-autotune drops max-autotune ones)")
    parser.add_argument("--name", default="gpu", help="file stem of the JSON and PNG written under --out")
    parser.add_argument("--train-strategies", default="save-all,recompute-pointwise",
                        help="partition strategies of our training plan in the GPT-2 train-step row, which "
                             "runs only when --only names it (--only train): see benchmarks/train_suite.py")
    args = parser.parse_args()
    only = [w for w in args.only.split(",") if w]
    rows = []
    with torch.no_grad():
        for name, build, floor_bytes in workloads():
            if only and not any(o in name for o in only):
                continue
            torch.manual_seed(0)
            model, inputs = build()
            row: dict = {"workload": name}
            expected = first_tensor(model(*inputs))
            # bf16 models are also compared with the same model in fp32: bf16 eager itself is off by
            # about 1e-2 after 12 layers, so "ours vs fp32" next to "eager vs fp32" is the fair check.
            expected32 = fp32_reference(model, inputs)
            if expected32 is not None:
                row["eager_relerr_fp32"] = relerr(expected32, expected)
            compilers = []
            for mode in args.inductor_modes.split(","):
                if args.skip_autotune and "autotune" in mode:
                    continue
                label = "inductor" if mode == "default" else f"inductor-{mode}"
                compilers.append((label, lambda mode=mode: torch.compile(model, mode=mode)))
            compilers += [(f"ours:{Path(p).stem}", (lambda p=p: compile_with_plan(model, p)))
                          for p in args.plans.split(",") if not (args.skip_autotune and "autotune" in p)]
            for label, make in compilers:
                try:
                    torch._dynamo.reset()
                    start = time.perf_counter()
                    fn = make()
                    got = first_tensor(fn(*inputs))
                    torch.cuda.synchronize()
                    row[f"{label}_compile_s"] = time.perf_counter() - start
                    row[f"{label}_relerr"] = relerr(expected, got)
                    if expected32 is not None:
                        row[f"{label}_relerr_fp32"] = relerr(expected32, got)
                    row[f"{label}_ms"] = cuda_time(fn, inputs)
                    row[f"{label}_host_ms"] = host_time(fn, inputs)
                    # later calls take other paths (direct kernel launches, CUDA-graph replays): check them too
                    row[f"{label}_relerr_later_call"] = relerr(expected, first_tensor(fn(*inputs)))
                    if label.startswith("ours"):
                        comp = compilation_of(fn)
                        row[f"{label}_kernels"] = sum(r.kernels for r in comp.graphs)
                        row[f"{label}_graphs"] = comp.summary()["graph_count"]
                        row[f"{label}_notes"] = [n["message"] for r in comp.graphs for n in r.notes
                                                 if n["pass"] == "codegen"][:12]
                        # the matmul-template pass: its notes (template and extern times, the decision)
                        # and how many template kernels the graphs call (known on a cache hit too)
                        template = [n["message"] for r in comp.graphs for n in r.notes
                                    if n["pass"] == "matmul-template"]
                        if template:
                            row[f"{label}_matmul_template_notes"] = template[:12]
                        used = sum("matmul template" in k.get("source", "") for r in comp.graphs
                                   for k in r.contents.get("kernels", []))
                        row[f"{label}_matmul_template_kernels"] = used
                        row[f"{label}_matmul_path"] = "template" if used else "extern"
                except Exception as exc:  # noqa: BLE001 - a failing variant is a row entry, not a crash
                    row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                    traceback.print_exc()
            row["eager_ms"] = cuda_time(model, inputs)
            row["eager_host_ms"] = host_time(model, inputs)
            if floor_bytes:
                row["floor_ms"] = floor_bytes / COPY_BANDWIDTH * 1e3
                row["copy_ms"] = copy_time(floor_bytes)
                for key in [k for k in row if k.endswith("_ms") and k not in ("floor_ms", "copy_ms")
                            and not k.endswith("host_ms")]:
                    row[key.replace("_ms", "_pct_of_copy_bw")] = 100 * row["floor_ms"] / row[key]
                    row[key.replace("_ms", "_pct_of_measured_copy")] = 100 * row["copy_ms"] / row[key]
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_result(args.out, rows, args.name)
            del model, inputs
            torch.cuda.empty_cache()
    if any("train" in o for o in only):
        # Training rows: eager, Inductor default and our training plan per partition strategy; step
        # time, peak step memory and saved-activation bytes (benchmarks/train_suite.py).
        from train_suite import training_rows
        for row in training_rows("cuda", strategies=[s for s in args.train_strategies.split(",") if s]):
            rows.append(row)
            write_result(args.out, rows, args.name)
    result = write_result(args.out, rows, args.name)
    print_table(result)
    plot(result, Path(args.out) / f"{args.name}.png")
    return 0


def write_result(out_dir: str, rows: list, name: str = "gpu") -> dict:
    """Write everything measured so far (so a run cut short still leaves its rows)."""
    # BENCH_COMMIT first: a copy of the tree (the device machine's) may carry an older .git
    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit or "unknown", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "rows": rows}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result


def variants(result: dict) -> list[str]:
    return sorted({k[:-3] for r in result["rows"] for k in r
                   if k.endswith("_ms") and k not in ("floor_ms", "copy_ms") and not k.endswith("host_ms")})


def plot(result: dict, path: Path) -> None:
    """Speed-up over eager per workload and variant, as grouped bars (skipped without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return
    labels = [v for v in variants(result) if v != "eager"]
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(max(8, 2.2 * len(rows)), 4.5))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        speedups = [r["eager_ms"] / r[label + "_ms"] if label + "_ms" in r else 0.0 for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], speedups, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["workload"] for r in rows], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("speed-up over eager (higher is better)")
    ax.set_title(f"{result['device']}, torch {result['torch']}, commit {result['commit']}, {result['date'][:10]}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def print_table(result: dict) -> None:
    labels = variants(result)
    print(f"\n{result['device']} torch {result['torch']} commit {result['commit']} (median ms per call)")
    print("| workload | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for r in result["rows"]:
        cells = [f"{r[l + '_ms']:.3f}" if l + "_ms" in r else "error" for l in labels]
        print(f"| {r['workload']} | " + " | ".join(cells) + " |")
    for r in result["rows"]:
        if "copy_ms" in r:
            print(f"{r['workload']}: copy of the same bytes {r['copy_ms']:.4f} ms; % of it: " + ", ".join(
                f"{l} {r[l + '_pct_of_measured_copy']:.1f}" for l in labels if l + "_pct_of_measured_copy" in r))


if __name__ == "__main__":
    sys.exit(main())
