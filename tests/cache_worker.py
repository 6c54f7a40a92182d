"""A separate Python process for the compile-cache and artifacts tests: compiles the CPU two-block
transformer of ``benchmarks/workloads.py`` under the default plan, calls it once, and prints one
JSON line with what the compile did (cache statuses, passes run, compile seconds, error vs eager).

    python tests/cache_worker.py compile CACHE_DIR [--save BUNDLE] [--load BUNDLE] [--regions]
        [--model small] [--backend triton]

``--load`` loads a bundle into CACHE_DIR before compiling; ``--save`` writes one after the call;
``--model small`` compiles a linear layer with a softmax epilogue instead (small enough for the
Triton interpreter, ``TRITON_INTERPRET=1`` in the environment, with ``--backend triton``)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from workloads import TwoBlocks  # noqa: E402

import pipeline  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["compile"])
    parser.add_argument("cache_dir")
    parser.add_argument("--save", default=None)
    parser.add_argument("--load", default=None)
    parser.add_argument("--regions", action="store_true")
    parser.add_argument("--model", choices=["two-blocks", "small"], default="two-blocks")
    parser.add_argument("--backend", default=None)
    args = parser.parse_args()
    result: dict = {}
    if args.load:
        result["loaded"] = pipeline.load_artifacts(args.load, args.cache_dir)
    torch.manual_seed(0)
    if args.model == "small":
        from test_cache import Small
        model, x = Small().eval(), torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    else:
        model = TwoBlocks().eval()
        x = torch.randn(4, 128, 256, generator=torch.Generator().manual_seed(1))
    options: dict = {"capture": {"regions": ["Block"]}} if args.regions else {}
    if args.backend:
        options["codegen"] = {"backend": args.backend}
    compiled = pipeline.compile_with_plan(model, "default", cache={"dir": args.cache_dir}, options=options)
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(x)
    result["first_call_seconds"] = time.perf_counter() - start
    with torch.no_grad():
        expected = model(x)
    compilation = pipeline.compilation_of(compiled)
    result.update({
        "statuses": [g.cache.get("status") for g in compilation.graphs],
        "reasons": [g.cache.get("reason") for g in compilation.graphs],
        "passes_run": sum(len(g.passes) for g in compilation.graphs),
        "compile_seconds": compilation.compile_seconds,
        "kernels": sum(g.kernels for g in compilation.graphs),
        "max_error": (out - expected).abs().max().item(),
    })
    if args.save:
        result["manifest"] = str(pipeline.save_artifacts(compiled, args.save))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
