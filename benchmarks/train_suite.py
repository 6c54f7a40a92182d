"""Training benchmark: one train step (forward under the compiled model, backward through the compiled
backward, an AdamW step outside the compiled region) for eager, Inductor default and our
``training`` plan with one or more ``partition`` strategies, in one run.

    .venv/bin/python benchmarks/train_suite.py --device cpu [--quick] [--small]
    python benchmarks/train_suite.py --device cuda --out "$OUT"            # on the H200

Workloads: CPU, two transformer blocks d256 h4 b4 t128 (fp32); CUDA, GPT-2 (transformers, from
config, 6 layers, d768) b8 s512 under bf16 autocast. ``--small`` shrinks both to seconds (smoke
tests of the code path). All variants are compiled first, each training its own copy of the same
initial weights, then timed in interleaved rounds. Per variant: median ms per step; on CUDA the step's peak memory
(``torch.cuda.max_memory_allocated`` during a step minus what was allocated when it started:
activations, gradients and temporaries, not the weights or optimizer state; for a plan recording
CUDA graphs, plus what their memory pool keeps allocated between steps); for ours, the bytes
the forward saves for the backward from the compile report; and the first step's loss and
gradients compared with eager's from the same weights (relative error of the loss, largest
relative error over parameter gradients).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import TwoBlocks  # noqa: E402

from pipeline import compilation_of, compile_report, compile_with_plan  # noqa: E402


class SquaredOutputLoss(torch.nn.Module):
    """A model whose call returns a scalar loss (mean square of the wrapped model's output)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).square().mean()


def gpt2_train(layers: int = 6, d: int = 768, heads: int = 12, vocab: int = 50257) -> torch.nn.Module:
    """GPT-2 from a transformers config (no weights downloaded) returning its LM loss; dropout off
    so eager and compiled steps see the same computation."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=1024,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)

    class LMLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids, use_cache=False).loss

    return LMLoss()


def workloads(model: str, small: bool) -> list[tuple[str, Callable[[], tuple], torch.dtype | None]]:
    """(name, build() -> (model returning a loss, inputs), autocast dtype or None) for ``model``:
    ``blocks`` (the CPU row) or ``gpt2`` (the GPU row)."""
    g = torch.Generator().manual_seed(0)
    if model == "blocks":
        d, b, t = (64, 2, 32) if small else (256, 4, 128)
        return [(f"2 transformer blocks d{d} h4 b{b} t{t} train step fp32",
                 lambda: (SquaredOutputLoss(TwoBlocks(d, 4)), (torch.randn(b, t, d, generator=g),)), None)]
    layers, d, heads, vocab, b, s = (2, 128, 4, 1000, 2, 64) if small else (6, 768, 12, 50257, 8, 512)
    return [(f"gpt2 {layers}L d{d} train step b{b} s{s} bf16 autocast",
             lambda: (gpt2_train(layers, d, heads, vocab),
                      (torch.randint(0, vocab, (b, s), generator=g),)), torch.bfloat16)]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple, device: str,
               autocast: torch.dtype | None) -> torch.Tensor:
    """One step: zero grads, forward (under autocast when asked), backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        loss = model(*inputs)
    loss.backward()
    optimizer.step()
    return loss.detach()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_interleaved(steps_by_label: dict[str, Callable[[], Any]], device: str, *, steps: int,
                     rounds: int) -> dict[str, float]:
    """Median over rounds of the mean ms per step of each variant. The variants take turns in every
    round, so drift on a shared machine (other processes, clock changes) hits them alike; CUDA
    events time the GPU, the wall clock the CPU."""
    results: dict[str, list[float]] = {label: [] for label in steps_by_label}
    for _ in range(rounds):
        for label, step in steps_by_label.items():
            synchronize(device)
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(steps):
                    step()
                end.record()
                torch.cuda.synchronize()
                results[label].append(start.elapsed_time(end) / steps)
            else:
                begin = time.perf_counter()
                for _ in range(steps):
                    step()
                results[label].append((time.perf_counter() - begin) * 1e3 / steps)
    return {label: statistics.median(values) for label, values in results.items()}


def peak_step_mb(step: Callable[[], Any]) -> float:
    """CUDA memory a step adds at its peak over what was allocated when it started, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def graph_pool_mb(device: str) -> float:
    """MiB of device memory in private pools: what recorded CUDA graphs (ours, or Inductor's
    CUDA-graph trees) keep allocated between steps (activations, temporaries, static buffers),
    which a step's peak over its starting allocation does not show."""
    if device != "cuda":
        return 0.0
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)) / 2**20


def relerr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    e, a = expected.double(), actual.double()
    return float((e - a).norm() / e.norm().clamp_min(1e-30))


def first_step_gradients(model: torch.nn.Module, inputs: tuple, device: str,
                         autocast: torch.dtype | None, call: Callable | None = None) -> tuple[torch.Tensor, dict]:
    """Loss and parameter gradients (by ``model``'s parameter names) of one forward/backward from
    the current weights, calling ``call`` (the compiled model; default ``model`` itself)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        loss = (call if call is not None else model)(*inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def prepare_variant(label: str, make: Callable[[torch.nn.Module], torch.nn.Module], initial: torch.nn.Module,
                    inputs: tuple, device: str, autocast: torch.dtype | None,
                    reference: tuple | None) -> tuple[dict, Callable[[], Any]]:
    """Compile a copy of ``initial`` (timed, with its first forward/backward), compare that first
    step's loss and gradients with ``reference``, and return the measurements and a step function
    (already warmed up) that trains the copy with its own AdamW."""
    out: dict = {}
    model = copy.deepcopy(initial)
    start = time.perf_counter()
    compiled = make(model)
    loss, grads = first_step_gradients(model, inputs, device, autocast, call=compiled)
    synchronize(device)
    out[f"{label}_compile_s"] = time.perf_counter() - start
    if reference is not None:
        ref_loss, ref_grads = reference
        out[f"{label}_loss_relerr"] = relerr(ref_loss, loss)
        out[f"{label}_grad_relerr_max"] = max(relerr(ref_grads[n], grads[n]) for n in ref_grads if n in grads)
        out[f"{label}_grads_missing"] = sorted(set(ref_grads) - set(grads))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        return train_step(compiled, optimizer, inputs, device, autocast)

    for _ in range(2):
        step()
    if label.startswith("ours"):
        summary = compile_report(compiled)["summary"]
        out[f"{label}_saved_bytes"] = summary["saved_bytes"]
        out[f"{label}_activation_bytes"] = summary["activation_bytes"]
        out[f"{label}_kernels"] = sum(r.kernels for r in compilation_of(compiled).graphs)
        out[f"{label}_graphs"] = compilation_of(compiled).summary()["graph_count"]
    return out, step


def training_rows(device: str, *, strategies: list[str], model: str | None = None, small: bool = False,
                  quick: bool = False, only: str = "", skip: tuple[str, ...] = (),
                  plans: tuple[str, ...] = (), inductor_modes: tuple[str, ...] = ("default",)) -> list[dict]:
    """Measure the training workload ``model`` (default: ``blocks`` on CPU, ``gpt2`` on CUDA) on
    ``device``; one row (dict) per workload. ``skip``: variants left out (``inductor``: its cold
    compile of a GPT-2 train step takes minutes). ``plans``: more plans (names or files) to run
    as variants ``ours:<plan name>`` next to the ``training`` plan's strategies. ``inductor_modes``:
    torch.compile modes run (``inductor`` for ``default``, ``inductor:<mode>`` for the others)."""
    steps, rounds = (2, 2) if quick else ((5, 5) if device == "cpu" else (10, 5))
    rows = []
    for name, build, autocast in workloads(model or ("blocks" if device == "cpu" else "gpt2"), small):
        if only and only not in name:
            continue
        torch.manual_seed(0)
        model, inputs = build()
        initial = model.to(device)
        inputs = tuple(x.to(device) for x in inputs)
        row: dict = {"workload": name}
        reference = first_step_gradients(copy.deepcopy(initial), inputs, device, autocast)
        variants: list[tuple[str, Callable]] = [("eager", lambda m: m)]
        variants += [("inductor" if mode == "default" else f"inductor:{mode}",
                      lambda m, mode=mode: torch.compile(m, mode=mode)) for mode in inductor_modes]
        variants += [(f"ours:{s}", lambda m, s=s: compile_with_plan(m, "training",
                                                                    options={"partition": {"strategy": s}}))
                     for s in strategies]
        variants += [(f"ours:{Path(p).stem}", lambda m, p=p: compile_with_plan(m, p)) for p in plans]
        variants = [(label, make) for label, make in variants if label not in skip]
        torch._dynamo.reset()
        ready: dict[str, Callable] = {}
        for label, make in variants:
            try:
                pool_before = graph_pool_mb(device)
                out, ready[label] = prepare_variant(label, make, initial, inputs, device, autocast,
                                                    None if label == "eager" else reference)
                row.update(out)
                if graph_pool_mb(device) > pool_before:
                    row[f"{label}_graph_pool_mb"] = graph_pool_mb(device) - pool_before
            except Exception as exc:  # noqa: BLE001 - a failing variant is a row entry, not a crash
                row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
                traceback.print_exc()
        row.update({f"{label}_ms": ms for label, ms in
                    time_interleaved(ready, device, steps=steps, rounds=rounds).items()})
        if device == "cuda":
            for label, step in ready.items():
                row[f"{label}_peak_step_mb"] = peak_step_mb(step)
        del ready
        gc.collect()
        for label, _ in variants:
            if label != "eager" and f"{label}_ms" in row and "eager_ms" in row:
                row[f"{label}_speedup"] = row["eager_ms"] / row[f"{label}_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    lines = [f"# Training benchmark {result['date']} (commit {result['commit']}, {result['device']}, "
             f"torch {result['torch']})", "",
             "Median ms per train step (forward, backward, AdamW step); peak = CUDA memory a step adds "
             "over what it starts with, plus, for plans recording CUDA graphs, the memory their pool "
             "keeps between steps; saved = bytes our forward keeps for the backward (all / "
             "activations only); relerr = first step's loss / worst parameter gradient against eager.", "",
             "| workload | variant | ms/step | speed-up | peak MiB | saved MB (all / act.) | relerr loss / grad |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        labels = sorted({k[:-3] for k in r if k.endswith("_ms") and not k.endswith("_host_ms")},
                        key=lambda v: (v != "eager", not v.startswith("inductor"), v))
        for label in labels:
            peak = f"{r[label + '_peak_step_mb']:.0f}" if label + "_peak_step_mb" in r else "-"
            if label + "_graph_pool_mb" in r:
                peak = f"{r[label + '_peak_step_mb'] + r[label + '_graph_pool_mb']:.0f} ({peak} + graph pool)"
            saved = (f"{r[label + '_saved_bytes'] / 1e6:.1f} / {r[label + '_activation_bytes'] / 1e6:.1f}"
                     if label + "_saved_bytes" in r else "-")
            err = (f"{r[label + '_loss_relerr']:.1e} / {r[label + '_grad_relerr_max']:.1e}"
                   if label + "_loss_relerr" in r else "-")
            speed = f"{r[label + '_speedup']:.2f}x" if label + "_speedup" in r else "1.00x"
            lines.append(f"| {r['workload']} | {label} | {r[label + '_ms']:.2f} | {speed} | {peak} | {saved} | {err} |")
        for key in [k for k in r if k.endswith("_error")]:
            lines.append(f"| {r['workload']} | {key[:-6]} | error: {r[key][:120]} | | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--strategies", default=None,
                        help="partition strategies to run our plan with (default: cuda save-all,recompute-pointwise; "
                             "cpu recompute-pointwise)")
    parser.add_argument("--model", choices=["blocks", "gpt2"], default=None,
                        help="workload (default: blocks on cpu, gpt2 on cuda); gpt2 on cpu with --small "
                             "smoke-tests the GPU row's code path")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke test of the code path")
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--only", default="")
    parser.add_argument("--skip", default="", help="variants to leave out, e.g. inductor")
    parser.add_argument("--plans", default="", help="more plans (names or YAML files), comma-separated, "
                                                   "e.g. training-reduce-overhead")
    parser.add_argument("--inductor-modes", default="default",
                        help="torch.compile modes to run, comma-separated, e.g. default,reduce-overhead")
    parser.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    parser.add_argument("--name", default=None, help="file stem of the JSON and Markdown written under --out")
    args = parser.parse_args()
    default = "save-all,recompute-pointwise" if args.device == "cuda" else "recompute-pointwise"
    strategies = [s for s in (args.strategies or default).split(",") if s]
    rows = training_rows(args.device, strategies=strategies, model=args.model, small=args.small,
                         quick=args.quick, only=args.only, skip=tuple(v for v in args.skip.split(",") if v),
                         plans=tuple(p for p in args.plans.split(",") if p),
                         inductor_modes=tuple(m for m in args.inductor_modes.split(",") if m))
    # BENCH_COMMIT first: a copy of the tree (the device machine's) may carry an older .git
    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=Path(__file__).parent).stdout.strip() or "unknown"
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "device": device_name, "torch": torch.__version__, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"train-{args.device}-{result['date'][:10]}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
