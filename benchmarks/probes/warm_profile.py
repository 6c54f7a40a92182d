"""A warm process's first call under cProfile: a cold child process fills a cache folder, then
this process compiles the same workload against it and profiles only the first call.

    python benchmarks/probes/warm_profile.py [--workload gpt2-12] [--precompile] [--out DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt2-12")
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="warm-profile-")
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=f"{work}/inductor", TRITON_CACHE_DIR=f"{work}/triton")
    os.environ.pop("PIPELINE_CACHE_GRAPHS", None)
    mode = "ours precompile" if args.precompile else "ours"
    cold = subprocess.run([sys.executable, str(HERE.parent / "compile_time.py"), "--child", args.workload,
                           f"{mode} cold", f"{work}/cache"], capture_output=True, text=True)
    if cold.returncode != 0:
        raise SystemExit(cold.stderr[-3000:])
    import torch
    import compile_time
    from pipeline import compilation_of, compile_with_plan
    model, inputs, _, device = compile_time.build(args.workload)
    with torch.no_grad():
        model(*inputs)
    options = {"capture": {"precompile": True}} if args.precompile else {}
    compiled = compile_with_plan(model, "default", cache={"dir": f"{work}/cache"}, options=options)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    with torch.no_grad():
        compiled(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    profile.disable()
    seconds = time.perf_counter() - start
    compilation = compilation_of(compiled)
    stored = compilation.runtime.get("stored_captures")
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(70)
    stats.sort_stats("tottime").print_stats(30)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"warm-profile-{args.workload}-{mode.replace(' ', '-')}.txt").write_text(
        json.dumps({"first_call_s": round(seconds, 3), "compile_work_s": round(compilation.compile_seconds, 3),
                    "stored": stored.counts() if stored else None,
                    "stored_load_s": round(stored.load_seconds, 3) if stored else None}) + "\n" + text.getvalue())
    print(f"first call {seconds:.3f} s")


if __name__ == "__main__":
    main()
