"""Serving benchmark (H200): one decode step of a 12-layer decoder with a static KV cache, and GPT-2
prefill at three sequence lengths; eager, Inductor (default, reduce-overhead) and our plans in one run.

    python benchmarks/serving_suite.py --out "$OUT" [--only decode,prefill] [--plans llm-serving,default]

The decoder (benchmarks/decoder.py: d 768, 12 heads, 12 layers, batch 8, cache 2048, bf16) keeps
every layer's keys and values in one 600 MB buffer written in place with ``index_copy_``. Each
variant starts from the same cache contents (random, as if 1000 tokens were already decoded) and
its logits are compared with eager's from that state. Per variant: median ms per call (CUDA
events), host ms per call, relative error, cold compile seconds, graphs and recompiles.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decoder import Decoder  # noqa: E402
from gpu_suite import cuda_time, first_tensor, gpt2, host_time, plot, print_table, relerr, write_result  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402

POSITION = 1000


def decode_case():
    """(model, inputs, reset): ``reset()`` restores the cache every variant starts from."""
    torch.manual_seed(0)
    model = Decoder().to("cuda", torch.bfloat16).eval()
    start = torch.randn_like(model.kv) * 0.5
    model.kv.copy_(start)

    def reset() -> None:
        model.kv.copy_(start)

    ids = torch.randint(0, 50257, (8, 1), device="cuda")
    pos = torch.tensor([POSITION], device="cuda")
    return model, (ids, pos), reset


def measure(label: str, make, inputs: tuple, expected: torch.Tensor, reset, row: dict) -> None:
    try:
        torch._dynamo.reset()
        reset()
        start = time.perf_counter()
        fn = make()
        got = first_tensor(fn(*inputs)).clone()
        torch.cuda.synchronize()
        row[f"{label}_compile_s"] = time.perf_counter() - start
        row[f"{label}_relerr"] = relerr(expected, got)
        row[f"{label}_ms"] = cuda_time(fn, inputs)
        row[f"{label}_host_ms"] = host_time(fn, inputs)
        reset()
        row[f"{label}_relerr_later_call"] = relerr(expected, first_tensor(fn(*inputs)))
        if label.startswith("ours"):
            comp = compilation_of(fn)
            row[f"{label}_graphs"] = comp.summary()["graph_count"]
            row[f"{label}_recompiles"] = len(comp.recompiles)
            row[f"{label}_cudagraphs"] = all(r.cudagraphs for r in comp.graphs)
            row[f"{label}_notes"] = [f"{n['pass']}: {n['message']}" for r in comp.graphs for n in r.notes
                                     if n["pass"] in ("reinplace", "cudagraphs")][:12]
            code = "\n".join(r.final_code for r in comp.graphs)
            row[f"{label}_in_place_writes"] = code.count("index_copy_")
            row[f"{label}_scatter_copies"] = code.count("scatter")
    except Exception as exc:  # noqa: BLE001 - a failing variant is a row entry, not a crash
        row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        traceback.print_exc()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    parser.add_argument("--only", default="")
    parser.add_argument("--plans", default="llm-serving,reduce-overhead,default")
    parser.add_argument("--inductor-modes", default="default,reduce-overhead")
    parser.add_argument("--name", default="serving")
    args = parser.parse_args()
    only = [w for w in args.only.split(",") if w]
    cases = []
    if not only or "decode" in only:
        cases.append(("decode step 12L d768 b8 cache2048 bf16", decode_case))
    if not only or "prefill" in only:
        prefill = gpt2()
        for seq in (128, 256, 512):
            ids = torch.randint(0, 50257, (8, seq), device="cuda")
            cases.append((f"gpt2 12L prefill b8 s{seq} bf16", lambda prefill=prefill, ids=ids: (prefill, (ids,), lambda: None)))
    rows = []
    with torch.no_grad():
        for name, build in cases:
            model, inputs, reset = build()
            row: dict = {"workload": name}
            reset()
            expected = first_tensor(model(*inputs)).clone()
            variants = [("inductor" if m == "default" else f"inductor-{m}",
                         lambda m=m: torch.compile(model, mode=m)) for m in args.inductor_modes.split(",")]
            variants += [(f"ours:{p}", lambda p=p: compile_with_plan(model, p)) for p in args.plans.split(",")]
            for label, make in variants:
                measure(label, make, inputs, expected, reset, row)
            reset()
            row["eager_ms"] = cuda_time(model, inputs)
            row["eager_host_ms"] = host_time(model, inputs)
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_result(args.out, rows, args.name)
            torch.cuda.empty_cache()
    result = write_result(args.out, rows, args.name)
    print_table(result)
    plot(result, Path(args.out) / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
