"""Shapes that change: our dynamic graph against our static graphs and Inductor's dynamic graph.

    python benchmarks/dynamic_shapes.py --device cuda --out DIR [--workloads mlp,block,encoder,gpt2]

Workloads (inference, no grad):

- ``mlp``: a two-layer MLP with layer norm, called with batch sizes 1..64;
- ``block``: a pre-norm transformer block (attention through SDPA, GELU MLP), batch sizes 1..64;
- ``encoder``: two such blocks with a key padding mask (a per-row additive mask in the
  attention), sequence lengths 64..512 in steps of 16;
- ``gpt2``: GPT-2 prefill (transformers, random weights; 12 layers in bf16 on CUDA, 2 layers in
  float32 on CPU) at 8 sequence lengths.

Every workload is called at all its sizes, in order, by ``ours-dynamic`` (the default plan:
Dynamo's ``dynamic=None``, so the first size change recompiles once with the size symbolic) and
``inductor-dynamic`` (``torch.compile``, ``dynamic=None``); each call is compared with eager. Then,
at the timed sizes, ``ours-static`` compiles one graph per size (``capture.dynamic: false``), and
eager, ours-dynamic, ours-static and inductor-dynamic are timed in interleaved rounds (the order
rotated and reversed round by round; on the CPU a pause and an untimed call before each variant, as
the zoo times): wall ms per call (synchronized) and host ms per call (the time to issue it). Each
sample is at least ``--iters`` calls and at least ``--sample-ms`` long (calls of a fraction of a
millisecond are timed over many calls, so one disturbance of the host moves a sample little).
``compiles`` counts the graphs each variant compiled; ``kernels`` the generated kernels of our dynamic graph.

Writes ``dynamic-shapes.json`` and ``dynamic-shapes.md`` under ``--out`` (the commit named there is
``PIPELINE_COMMIT`` when set: a copy of the tree without its git history names it so).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402
from workloads import LogitsOf  # noqa: E402
from zoo.measure import CPU_PAUSE, relerr, round_order, synchronize  # noqa: E402  (as the zoo measures)
from pipeline import compile_with_plan  # noqa: E402


class Block(nn.Module):
    """A pre-norm transformer block; ``mask`` (batch, seq) marks padded keys with True."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        bias = None
        if mask is not None:
            bias = torch.zeros(b, 1, 1, s, dtype=x.dtype, device=x.device).masked_fill(mask[:, None, None, :],
                                                                                       float("-inf"))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class Encoder(nn.Module):
    def __init__(self, hidden: int, heads: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)


class MLP(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden), nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def workloads(device: str, names: list[str]) -> list[dict]:
    """Each workload: its model, dtype, all sizes, the timed sizes and ``inputs(size, generator)``."""
    cuda = device == "cuda"
    hidden = 768 if cuda else 256
    out = []

    def tensor(*shape, g, dtype):
        return torch.randn(*shape, generator=g, device="cpu").to(device=device, dtype=dtype)

    if "mlp" in names:
        out.append({"name": "mlp", "model": MLP(hidden), "dtype": torch.float32, "sizes": list(range(1, 65)),
                    "timed": [1, 8, 33, 64], "inputs": lambda n, g: (tensor(n, hidden, g=g, dtype=torch.float32),)})
    if "block" in names:
        out.append({"name": "block", "model": Block(hidden, 12 if cuda else 4), "dtype": torch.float32,
                    "sizes": list(range(1, 65)), "timed": [1, 8, 33, 64],
                    "inputs": lambda n, g: (tensor(n, 64, hidden, g=g, dtype=torch.float32),)})
    if "encoder" in names:
        def encoder_inputs(s, g):
            lengths = torch.randint(s // 2, s + 1, (4,), generator=g)
            mask = (torch.arange(s)[None, :] >= lengths[:, None]).to(device)
            return tensor(4, s, hidden, g=g, dtype=torch.float32), mask
        out.append({"name": "encoder", "model": Encoder(hidden, 12 if cuda else 4, 2), "dtype": torch.float32,
                    "sizes": list(range(64, 513, 16)), "timed": [64, 128, 256, 512], "inputs": encoder_inputs})
    if "gpt2" in names:
        try:
            import transformers
        except ImportError:
            print("gpt2: skipped (transformers is not installed)")
        else:
            config = transformers.GPT2Config(n_layer=12 if cuda else 2, n_positions=1024,
                                             attn_implementation="sdpa")
            dtype = torch.bfloat16 if cuda else torch.float32
            model = LogitsOf(transformers.GPT2LMHeadModel(config))
            lengths = [32, 64, 96, 128, 192, 256, 384, 512]
            out.append({"name": "gpt2", "model": model, "dtype": dtype, "sizes": lengths, "timed": lengths,
                        "inputs": lambda s, g: (torch.randint(0, 50257, (1, s), generator=g).to(device),)})
    for w in out:
        w["model"] = w["model"].to(device=device, dtype=w["dtype"]).eval()
    return out


TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def graph_count(compiled) -> int:
    return len(pipeline.compilation_of(compiled).graphs)


def sweep(work: dict, variants: dict, device: str) -> tuple[dict, dict]:
    """Call every variant at every size in order: (largest error against eager, seconds spent in
    the variant's calls, compiles included) per variant."""
    g = torch.Generator().manual_seed(0)
    errors = {name: 0.0 for name in variants}
    seconds = {name: 0.0 for name in variants}
    for size in work["sizes"]:
        inputs = work["inputs"](size, g)
        expected = work["model"](*inputs)
        for name, fn in variants.items():
            synchronize(device)
            start = time.perf_counter()
            out = fn(*inputs)
            synchronize(device)
            seconds[name] += time.perf_counter() - start
            errors[name] = max(errors[name], relerr(out, expected))
    return errors, seconds


def timed(fn, inputs: tuple, iters: int, device: str) -> tuple[float, float]:
    """(wall ms, host ms) per call over ``iters`` calls."""
    synchronize(device)
    start = time.perf_counter()
    host = 0.0
    for _ in range(iters):
        t = time.perf_counter()
        fn(*inputs)
        host += time.perf_counter() - t
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / iters, host * 1e3 / iters


def sample_iters(variants: dict, inputs: tuple, iters: int, sample_ms: float, device: str) -> int:
    """Calls per timed sample: ``iters``, or more where the slowest variant's call is so short
    that ``iters`` calls would take less than ``sample_ms``."""
    slowest = max(timed(fn, inputs, 3, device)[0] for fn in variants.values())
    return max(iters, math.ceil(sample_ms / max(slowest, 1e-3)))


def run(work: dict, device: str, rounds: int, iters: int, save=lambda result: None, sample_ms: float = 0.0) -> dict:
    model = work["model"]
    print(f"{work['name']}: {len(work['sizes'])} sizes", flush=True)
    dynamic = compile_with_plan(model, "default")
    inductor = torch.compile(model)
    started = time.perf_counter()
    with torch.no_grad():
        errors, call_seconds = sweep(work, {"ours-dynamic": dynamic, "inductor-dynamic": inductor}, device)
        sweep_seconds = time.perf_counter() - started
        comp = pipeline.compilation_of(dynamic)
        dynamic_graphs = [r for r in comp.graphs if r.metrics.get("size_specializations")]
        result = {"sizes": [work["sizes"][0], work["sizes"][-1], len(work["sizes"])],
                  "dtype": str(work["dtype"]).removeprefix("torch."),
                  "errors": errors, "tolerance": TOLERANCE[work["dtype"]],
                  "passed": all(e <= TOLERANCE[work["dtype"]] for e in errors.values()),
                  "compiles": {"ours-dynamic": graph_count(dynamic)},
                  "dynamic_kernels": [r.metrics.get("kernels") for r in dynamic_graphs],
                  "specializations": [r.metrics["size_specializations"] for r in dynamic_graphs],
                  "sweep_seconds": sweep_seconds, "sweep_call_seconds": call_seconds, "times": {}}
        for size in work["timed"]:
            static = compile_with_plan(model, "default", options={"capture": {"dynamic": False, "recompile_limit": 64}})
            g = torch.Generator().manual_seed(size)
            inputs = work["inputs"](size, g)
            variants = {"eager": model, "ours-dynamic": dynamic, "ours-static": static, "inductor-dynamic": inductor}
            expected = model(*inputs)
            for fn in variants.values():     # warm: compiles the static graph
                fn(*inputs)
            result["errors"][f"ours-static@{size}"] = relerr(static(*inputs), expected)
            calls = sample_iters(variants, inputs, iters, sample_ms, device)
            samples = {name: [] for name in variants}
            for round_ in range(rounds):
                for name in round_order(list(variants), round_):
                    if device == "cpu":     # the previous variant's OpenMP threads stop spinning first
                        time.sleep(CPU_PAUSE)
                        variants[name](*inputs)
                    samples[name].append(timed(variants[name], inputs, calls, device))
            result["times"][size] = {name: {"wall_ms": statistics.median(s[0] for s in v),
                                            "host_ms": statistics.median(s[1] for s in v),
                                            "calls_per_sample": calls}
                                     for name, v in samples.items()}
            line = "  ".join(f"{n} {t['wall_ms']:.3f}" for n, t in result["times"][size].items())
            print(f"  {work['name']}@{size}: {line}", flush=True)
            save(result)
        result["compiles"]["ours-static"] = len(work["timed"])
    return result


def _builds(result: dict) -> str:
    """How often the dynamic graph generated kernels over the sweep, and how many."""
    specs = result["specializations"]
    if not specs:
        return "no symbolic groups"
    return ", ".join(f"{s.get('builds', len(s['sizes']))} build(s), {s['kernels']} kernel(s) for "
                     f"{s.get('seen', len(s['sizes']))} sizes" for s in specs)


def markdown(results: dict, meta: dict) -> str:
    lines = [f"# Dynamic shapes, {meta['date']}, {meta['machine']}, commit {meta['commit']}", "",
             f"Wall ms per call (median of {meta.get('rounds', '?')} interleaved rounds, each sample at least "
             f"{meta.get('iters', '?')} calls and {meta.get('sample_ms', 0):g} ms; host ms per call in brackets). "
             "dyn/static: ours dynamic over ours static; dyn/ind: ours dynamic over Inductor dynamic=None.", ""]
    for name, r in results.items():
        lines += [f"## {name} ({r['dtype']}, sizes {r['sizes'][0]}..{r['sizes'][1]}, {r['sizes'][2]} sizes)", "",
                  f"Every size against eager: {'passed' if r['passed'] else 'FAILED'} (largest norm-relative "
                  f"error {max(r['errors'].values()):.2e}, tolerance {r['tolerance']:.0e}); ours-dynamic compiled "
                  f"{r['compiles']['ours-dynamic']} graph(s), its dynamic graph calls {r['dynamic_kernels']} "
                  f"generated kernel(s) ({_builds(r)}); the sweep took {r['sweep_seconds']:.1f} s, of which "
                  f"calls of ours-dynamic {r['sweep_call_seconds']['ours-dynamic']:.1f} s and of inductor-dynamic "
                  f"{r['sweep_call_seconds']['inductor-dynamic']:.1f} s (compiles included).", "",
                  "| size | eager | ours dynamic | ours static | Inductor dynamic | dyn/static | dyn/ind |",
                  "|---|---|---|---|---|---|---|"]
        for size, t in r["times"].items():
            cell = {n: f"{v['wall_ms']:.3f} ({v['host_ms']:.3f})" for n, v in t.items()}
            dyn = t["ours-dynamic"]["wall_ms"]
            lines.append(f"| {size} | {cell['eager']} | {cell['ours-dynamic']} | {cell['ours-static']} | "
                         f"{cell['inductor-dynamic']} | {dyn / t['ours-static']['wall_ms']:.2f} | "
                         f"{dyn / t['inductor-dynamic']['wall_ms']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workloads", default="mlp,block,encoder,gpt2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--sample-ms", type=float, default=50.0,
                        help="each timed sample lasts at least this long (more calls for short calls)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch._dynamo.config.recompile_limit = 256     # ours-static compiles a graph per timed size
    commit = os.environ.get("PIPELINE_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=Path(__file__).parent).stdout.strip() or "unknown"
    machine = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": machine, "commit": commit, "torch": torch.__version__,
            "rounds": args.rounds, "iters": args.iters, "sample_ms": args.sample_ms}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for work in workloads(args.device, args.workloads.split(",")):
        torch._dynamo.reset()

        def save(result, name=work["name"]):    # after every timed size: a run cut short keeps what it measured
            results[name] = result
            (out / "dynamic-shapes.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                                                default=str))
            (out / "dynamic-shapes.md").write_text(markdown(results, meta))
        try:
            save(run(work, args.device, args.rounds, args.iters, save, args.sample_ms))
        except Exception:    # one workload failing leaves the others' results; the reason is printed
            print(f"{work['name']} failed:\n{traceback.format_exc()}", flush=True)
    print(markdown(results, meta))


if __name__ == "__main__":
    main()
