"""GPT-2 prefill: wall (CUDA events, back to back), host issue time, direct-call counts and
synchronizing calls, for ours (direct on/off) and Inductor default, interleaved."""
import sys, time, statistics, warnings, json
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import torch
from gpu_suite import gpt2, cuda_time, host_time
from pipeline import compile_with_plan, compilation_of
torch.manual_seed(0)
model = gpt2()
ids = torch.randint(0, 50257, (8, 512), device="cuda")
variants = {
    "ours": compile_with_plan(model, "default"),
    "ours-nodirect": compile_with_plan(model, str(__import__("pathlib").Path(__file__).with_name("nodirect.yaml"))),
    "inductor": torch.compile(model),
}
res = {k: {"wall": [], "host": []} for k in variants}
with torch.no_grad():
    ref = model(ids).float()
    for k, f in variants.items():
        out = f(ids).float()
        print(k, "relerr", float((out - ref).norm() / ref.norm()), flush=True)
    for k, f in variants.items():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(1)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            f(ids)
        torch.cuda.set_sync_debug_mode(0)
        print(k, "synchronizing calls:", len(w), [str(x.message)[:120] for x in w][:3], flush=True)
    for r in range(4):
        for k, f in variants.items():
            res[k]["wall"].append(cuda_time(f, (ids,), iters=30, rounds=3))
            res[k]["host"].append(host_time(f, (ids,), iters=30))
for k in variants:
    print(f"{k:15s} wall {statistics.median(res[k]['wall']):.3f} ms  host {statistics.median(res[k]['host']):.3f} ms  "
          f"walls {[round(v, 3) for v in res[k]['wall']]} hosts {[round(v, 3) for v in res[k]['host']]}")
for k in ("ours", "ours-nodirect"):
    print(k, compilation_of(variants[k]).runtime.get("direct_calls").counts() if "direct_calls" in compilation_of(variants[k]).runtime else "no direct")
json.dump(res, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/r/prefill_probe.json", "w"))
