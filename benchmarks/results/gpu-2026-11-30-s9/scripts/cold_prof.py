"""Where does a cold first call go? cProfile of the first call of GPT-2 12L prefill (compile_time.py's
build), whole or regional, in this fresh process (empty caches set by the caller)."""
import cProfile, io, pstats, sys, time
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import torch
from compile_time import build
from pipeline import compilation_of, compile_with_plan
mode = sys.argv[1]
model, inputs, region, device = build("gpt2-12")
with torch.no_grad():
    model(*inputs)
torch.cuda.synchronize()
options = {"capture": {"regions": [region]}} if mode == "regional" else {}
compiled = compile_with_plan(model, "default", options=options)
pr = cProfile.Profile()
start = time.perf_counter()
pr.enable()
with torch.no_grad():
    compiled(*inputs)
torch.cuda.synchronize()
pr.disable()
total = time.perf_counter() - start
c = compilation_of(compiled)
print(f"== {mode}: first call {total:.2f} s (under cProfile), compile work {c.compile_seconds:.2f} s, graphs {len(c.graphs)}")
for g in c.graphs:
    print("   ", {e["pass"]: round(e["seconds"], 3) for e in g.passes})
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60); print(s.getvalue()[:14000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
