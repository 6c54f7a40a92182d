"""Compile-time benchmark: cold compile, warm-process first call and regional compilation, against
Inductor's default cold compile, in one run. Every measurement runs in a fresh Python process.

    python benchmarks/compile_time.py [--workloads cpu-two-blocks,gpt2-12] [--out DIR] [--repeats N]

Per workload, in this order (each a new process):
- ``ours cold``: our ``default`` plan with an empty cache folder (graph cache and kernel cache);
- ``ours warm process``: the same plan and cache folder in a second process (cache hit);
- ``ours regional cold``: ``capture: {regions: [<block class>]}`` with an empty cache folder;
- ``ours regional warm process``: the regional compile again in a second process;
- ``ours precompile cold`` / ``ours precompile warm process``: ``capture: {precompile: true}`` (the
  capture is stored beside the compiled graph, so the warm process traces nothing);
- ``inductor cold``: ``torch.compile`` (mode default) with an empty ``TORCHINDUCTOR_CACHE_DIR``;
- ``inductor warm process``: Inductor again in a second process with that cache folder.

For each: the first call's wall time (capture + compile + run, what a user waits for), our compile
work (``compilation_of(model).compile_seconds``: the graph passes, or rebuilding from the cache),
graphs compiled, cache statuses, passes run, and the first call's max error against eager.

Workloads: ``cpu-two-blocks`` (benchmarks/workloads.py TwoBlocks, fp32 b4 t128 d256, CPU),
``gpt2-12`` (transformers GPT-2 12 layers from config, bf16 prefill b8 s512, CUDA), ``gpt2-2-cpu``
(GPT-2 with 2 layers, fp32 b1 s64 on CPU: a smoke test of the GPT-2 path without a GPU). The default
is ``cpu-two-blocks`` plus ``gpt2-12`` when CUDA is available.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = ["ours cold", "ours warm process", "ours regional cold", "ours regional warm process",
         "ours precompile cold", "ours precompile warm process", "inductor cold", "inductor warm process"]


# -- the measured process --------------------------------------------------------------------------
def build(workload: str):
    """(model, inputs, region class name, device) of a workload."""
    import torch
    sys.path.insert(0, str(HERE))
    torch.manual_seed(0)
    if workload == "cpu-two-blocks":
        from workloads import TwoBlocks
        x = torch.randn(4, 128, 256, generator=torch.Generator().manual_seed(1))
        return TwoBlocks().eval(), (x,), "Block", "cpu"
    if workload.startswith("gpt2-"):
        from transformers import GPT2Config, GPT2LMHeadModel
        cuda = workload == "gpt2-12"
        layers = 12 if cuda else 2
        config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        config._attn_implementation = "sdpa"
        device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
        gpt2 = GPT2LMHeadModel(config).eval().to(device, dtype)

        batch, seq = (8, 512) if cuda else (1, 64)
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device,
                            generator=torch.Generator(device=device).manual_seed(1))
        from workloads import LogitsOf
        return LogitsOf(gpt2).eval(), (ids,), "GPT2Block", device
    raise SystemExit(f"unknown workload {workload!r}")


def child(workload: str, mode: str, cache: str) -> dict:
    """Run one measurement in this (fresh) process; returns its record."""
    import torch
    model, inputs, region, device = build(workload)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        expected = model(*inputs)
    sync()
    result: dict = {"workload": workload, "mode": mode}
    if mode.startswith("inductor"):
        compiled = torch.compile(model)
    else:
        sys.path.insert(0, str(ROOT))
        from pipeline import compilation_of, compile_with_plan
        options = ({"capture": {"regions": [region]}} if "regional" in mode
                   else {"capture": {"precompile": True}} if "precompile" in mode else {})
        compiled = compile_with_plan(model, "default", cache={"dir": cache}, options=options)
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(*inputs)
    sync()
    result["first_call_s"] = round(time.perf_counter() - start, 3)
    result["max_error"] = float((out.float() - expected.float()).abs().max())
    if not mode.startswith("inductor"):
        compilation = compilation_of(compiled)
        result["compile_work_s"] = round(compilation.compile_seconds, 3)
        result["graphs"] = len(compilation.graphs)
        result["passes_run"] = sum(len(g.passes) for g in compilation.graphs)
        per_pass: dict = {}
        for g in compilation.graphs:
            for entry in g.passes:
                per_pass[entry["pass"]] = round(per_pass.get(entry["pass"], 0.0) + entry["seconds"], 3)
        result["pass_seconds"] = per_pass     # where the compile work went (codegen: Triton/g++ included)
        result["cache"] = sorted({g.cache.get("status") for g in compilation.graphs})
        result["keys"] = [g.cache.get("key") for g in compilation.graphs]
        result["not_cached"] = sorted({g.cache.get("reason") for g in compilation.graphs
                                       if g.cache.get("status") != "hit" and not g.cache.get("stored")})
        result["graph_breaks"] = len(compilation.graph_breaks)
        stored = compilation.runtime.get("stored_captures")
        if stored is not None:
            result["stored_captures"] = stored.counts()
            result["stored_capture_load_s"] = round(stored.load_seconds, 3)
            result["stored_capture_notes"] = stored.notes
    return result


# -- the driver ------------------------------------------------------------------------------------
def measure(workload: str, mode: str, cache: str, inductor_cache: str, triton_cache: str,
            timeout: float = 900) -> dict:
    """One measurement in a fresh process. ``triton_cache`` is Triton's own binary cache: empty for a
    cold compile (ours and Inductor's alike), shared with the matching warm run."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor_cache, TORCHINDUCTOR_VEC_ISA_OK="1",
               TRITON_CACHE_DIR=triton_cache)
    env.pop("PIPELINE_CACHE_GRAPHS", None)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", workload, mode, cache], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "mode": mode, "error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"workload": workload, "mode": mode, "error": done.stderr.strip()[-1500:]}
    return json.loads(lines[-1])


def _family(mode: str) -> str:
    for family in ("inductor", "regional", "precompile"):
        if family in mode:
            return family
    return "ours"


def run(workloads: list[str], repeats: int, timeout: float = 900, modes: list[str] = MODES) -> list[dict]:
    rows = []
    for workload in workloads:
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory(prefix="compile-time-") as work:
                inductor = f"{work}/inductor"
                for mode in modes:
                    family = _family(mode)
                    row = measure(workload, mode, f"{work}/{family}", inductor, f"{work}/triton-{family}", timeout)
                    row["repeat"] = repeat
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['workload']:<15} {row['mode']:<28} ERROR {row['error'].splitlines()[-1] if row['error'] else ''}"
    ours = (f"compile work {row['compile_work_s']:7.3f} s  graphs {row['graphs']}  passes {row['passes_run']:3d}  "
            f"cache {'/'.join(row['cache'])}") if "compile_work_s" in row else ""
    return (f"{row['workload']:<15} {row['mode']:<28} first call {row['first_call_s']:7.3f} s  {ours}  "
            f"err {row['max_error']:.2e}")


def summary(rows: list[dict]) -> list[str]:
    """Ratios per workload (medians over repeats): warm vs cold, regional vs whole, ours vs Inductor."""
    import statistics
    out = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        def med(mode: str, key: str = "first_call_s"):
            values = [r[key] for r in rows if r["workload"] == workload and r["mode"] == mode and key in r]
            return statistics.median(values) if values else None
        cold, warm, regional, inductor = (med("ours cold"), med("ours warm process"), med("ours regional cold"),
                                          med("inductor cold"))
        parts = [f"{workload}:"]
        if cold and inductor:
            parts.append(f"ours cold / inductor cold = {cold / inductor:.2f}")
        if cold and regional:
            parts.append(f"cold whole / cold regional = {cold / regional:.2f}x")
        if warm is not None:
            warm_rows = [r for r in rows if r["workload"] == workload and r["mode"] == "ours warm process"]
            hits = sum(1 for r in warm_rows if r.get("cache") == ["hit"])
            parts.append(f"warm first call {warm:.3f} s (compile work {med('ours warm process', 'compile_work_s'):.3f} s, "
                         f"{hits}/{len(warm_rows)} warm runs were cache hits)")
        precompiled = med("ours precompile warm process")
        if precompiled is not None:
            parts.append(f"precompile cold {med('ours precompile cold')} s, warm first call {precompiled:.3f} s")
        if inductor is not None:
            parts.append(f"inductor cold {inductor:.2f} s, warm {med('inductor warm process')} s")
        out.append("  ".join(parts))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "MODE", "CACHE"), help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default=None, help="comma-separated workload names")
    parser.add_argument("--repeats", type=int, default=1, help="repeat every measurement N times (fresh folders)")
    parser.add_argument("--out", default=None, help="folder for compile_time-<date>.json")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one measurement may take")
    parser.add_argument("--modes", default=None, help=f"comma-separated subset of: {', '.join(MODES)}")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.workloads:
        workloads = args.workloads.split(",")
    else:
        import torch
        workloads = ["cpu-two-blocks"] + (["gpt2-12"] if torch.cuda.is_available() else [])
    modes = args.modes.split(",") if args.modes else MODES
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; valid: {', '.join(MODES)}")
    rows = run(workloads, args.repeats, args.timeout, modes)
    lines = summary(rows)
    print("\n".join(lines))
    if args.out:
        from record import write_record
        path = write_record(args.out, "compile_time", {"rows": rows, "summary": lines})
        print(f"written {path}")

if __name__ == "__main__":
    main()
