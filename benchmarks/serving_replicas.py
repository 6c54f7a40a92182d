"""Serving replicas in fresh processes: how long a replica takes to be ready (compile and warm up
every shape bucket), cold and with a previous replica's cache, and how fast it then serves random
requests; ours (``llm-serving``) against Inductor ``reduce-overhead`` with the same buckets padded
by hand and its Mega-Cache (``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``).

    python benchmarks/serving_replicas.py [--layers 12] [--batches 1,4,8] [--seqs 128,256,512]
                                          [--requests 100] [--plan llm-serving] [--out DIR]

Per variant, in this order, each a new Python process sharing one work folder:
``ours cold`` (empty cache folder), ``ours second`` (the cache folder the cold replica filled:
stored captures and compiled graphs), ``inductor cold`` (empty ``TORCHINDUCTOR_CACHE_DIR`` and
Triton cache; saves its Mega-Cache artifacts), ``inductor second`` (the caches the cold replica
filled, and its artifacts loaded before compiling): second replicas on the same machine. Each process builds GPT-2 (random weights, bf16, CUDA), then times
``ready_s``: compile plus one call per bucket combination, from ``compile_with_plan`` /
``torch.compile`` to the last warm-up call finished; ``process_s`` is the same end point from
process start (imports and model building included). Then it serves ``--requests`` requests of a
random batch and sequence length (at most the largest buckets; the same requests for every
variant), one at a time: latency per request (synchronized), p50 and p90; every request's logits
at the real positions are compared with eager's on the unpadded input (``max_rel_err``: largest
relative error over requests)."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = ["ours cold", "ours second", "inductor cold", "inductor second"]


def _error_summary(stderr: str) -> str:
    """A failed child's exception lines (``SomethingError: ...``, which can sit above a long graph
    dump) and the end of its stderr."""
    raised = [line for line in stderr.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return "\n".join(line[:800] for line in raised[-3:]) + "\n...\n" + stderr.strip()[-1200:]


def _model(layers: int, longest: int):
    """GPT-2 (d 768, 12 heads) with ``layers`` layers and random weights; its position table holds
    GPT-2's 1024 positions, or ``longest`` where a bucket is longer (llm-serving's reaches 2048)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=max(1024, longest),
                        use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval().to("cuda", torch.bfloat16)


def _requests(count: int, batches: list[int], seqs: list[int]) -> list[tuple[int, int, int]]:
    import random
    rng = random.Random(1)
    return [(rng.randint(1, max(batches)), rng.randint(1, max(seqs)), rng.randrange(2**31)) for _ in range(count)]


def _pad_to(ids, batches: list[int], seqs: list[int]):
    """Inductor's inputs padded by hand to the smallest bucket holding them (pad id 0)."""
    import bisect

    import torch
    b, s = ids.shape
    pb, ps = batches[bisect.bisect_left(batches, b)], seqs[bisect.bisect_left(seqs, s)]
    padded = torch.zeros(pb, ps, dtype=ids.dtype, device=ids.device)
    padded[:b, :s] = ids
    return padded


def child(variant: str, work: str, layers: int, batches: list[int], seqs: list[int], requests: int,
          plan: str = "llm-serving") -> dict:
    import torch
    model = _model(layers, max(seqs))
    example = torch.randint(0, 50257, (max(batches), max(seqs)), device="cuda")
    with torch.no_grad():
        model(input_ids=example)
    torch.cuda.synchronize()
    artifacts = Path(work) / "inductor-mega-cache.bin"
    start = time.perf_counter()
    if variant.startswith("ours"):
        sys.path.insert(0, str(ROOT))
        import pipeline
        compiled = pipeline.compile_with_plan(model, plan, cache={"dir": f"{work}/ours-cache"},
                                              shapes={"axes": {"batch": batches, "seq": seqs}})
        with torch.no_grad():
            record = pipeline.warmup(compiled, input_ids=example)

        def serve(ids):
            return compiled(input_ids=ids).logits
    else:
        if variant == "inductor second":
            torch.compiler.load_cache_artifacts(artifacts.read_bytes())
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for b in batches:
                for s in seqs:
                    compiled(input_ids=example[:b, :s].contiguous())
        record = {"combinations": len(batches) * len(seqs)}

        def serve(ids):
            b, s = ids.shape
            return compiled(input_ids=_pad_to(ids, batches, seqs)).logits[:b, :s]
    torch.cuda.synchronize()
    ready = time.perf_counter() - start
    result = {"variant": variant, "ready_s": round(ready, 2), "process_s": round(time.perf_counter() - START, 2),
              "warmup": record}
    if variant == "inductor cold":
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            artifacts.write_bytes(saved[0])
            result["mega_cache_bytes"] = len(saved[0])
    if variant.startswith("ours"):
        compilation = pipeline.compilation_of(compiled)
        stored = compilation.runtime.get("stored_captures")
        result["graphs"] = len(compilation.graphs)
        result["cache"] = sorted({g.cache.get("status") for g in compilation.graphs})
        result["stored_captures"] = stored.counts() if stored is not None else None
        result["stored_capture_notes"] = stored.notes if stored is not None else None
    latencies, worst = [], 0.0
    with torch.no_grad():
        for b, s, seed in _requests(requests, batches, seqs):
            ids = torch.randint(0, 50257, (b, s), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = serve(ids)
            torch.cuda.synchronize()
            latencies.append((time.perf_counter() - t) * 1e3)
            expected = model(input_ids=ids).logits
            worst = max(worst, float((out.float() - expected.float()).abs().max() / expected.float().abs().max()))
    latencies.sort()
    result.update(requests=len(latencies), p50_ms=round(latencies[len(latencies) // 2], 3),
                  p90_ms=round(latencies[int(len(latencies) * 0.9)], 3), max_rel_err=round(worst, 5))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--seqs", default="128,256,512")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--plan", default="llm-serving", help="our plan (a name or a YAML path; its buckets are "
                                                                 "replaced by --batches and --seqs)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    batches, seqs = [int(v) for v in args.batches.split(",")], [int(v) for v in args.seqs.split(",")]
    if args.child:
        print(json.dumps(child(args.child, args.work, args.layers, batches, seqs, args.requests, args.plan)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="serving-replicas-") as work:
        for variant in args.variants.split(","):
            family = variant.split()[0]     # a second replica on the same machine keeps the caches
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{work}/inductor", TRITON_CACHE_DIR=f"{work}/triton-{family}")
            env.pop("PIPELINE_CACHE_GRAPHS", None)
            command = [sys.executable, __file__, "--child", variant, "--work", work, "--layers", str(args.layers),
                       "--batches", args.batches, "--seqs", args.seqs, "--requests", str(args.requests),
                       "--plan", args.plan]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
                lines = done.stdout.strip().splitlines()
                row = json.loads(lines[-1]) if done.returncode == 0 and lines else \
                    {"variant": variant, "error": _error_summary(done.stderr)}
            except subprocess.TimeoutExpired:
                row = {"variant": variant, "error": f"timed out after {args.timeout:.0f} s"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        from record import write_record
        path = write_record(args.out, "serving-replicas", {"layers": args.layers, "batches": batches, "seqs": seqs,
                                                            "plan": args.plan, "rows": rows})
        print(f"written {path}")

if __name__ == "__main__":
    main()
