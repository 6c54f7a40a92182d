"""Where does our backward's host time go? Per variant: phase times, our generated backward's own
wall time (timed inside autograd's thread), and torch.profiler's CPU-side table (ATen ops and CUDA
runtime calls such as cudaMalloc / cudaStreamSynchronize / cudaLaunchKernel) over 5 steps."""
import os, sys, time, statistics, torch
sys.path.insert(0, "benchmarks")
import torch._functorch._aot_autograd.utils as autils
from train_suite import gpt2_train
from pipeline import compile_with_plan
TIMES = []
orig_boxed = autils.make_boxed_func
def boxed(fn):
    inner = orig_boxed(fn)
    def wrapped(args):
        t = time.perf_counter()
        try:
            return inner(args)
        finally:
            TIMES.append((wrapped.idx, (time.perf_counter() - t) * 1e3))
    wrapped._boxed_call = True
    wrapped.idx = len(boxed.made); boxed.made.append(wrapped)
    return wrapped
boxed.made = []
autils.make_boxed_func = boxed
for plan in sys.argv[1:]:
    torch._dynamo.reset(); TIMES.clear()
    torch.manual_seed(0)
    model = gpt2_train().cuda()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    compiled = torch.compile(model) if plan == "inductor" else compile_with_plan(model, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ph = {"fw": [], "bw": [], "opt": [], "bw_sync": []}
    def step(record=False, sync_bw=False):
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if sync_bw:
            torch.cuda.synchronize(); t2s = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if record:
            ph["fw"].append((t1 - t0) * 1e3); ph["bw"].append((t2 - t1) * 1e3); ph["opt"].append((t3 - t2) * 1e3)
            if sync_bw: ph["bw_sync"].append((t2s - t1) * 1e3)
    for _ in range(5): step()
    torch.cuda.synchronize(); TIMES.clear()
    t = time.perf_counter()
    for i in range(30):
        step(record=True)
    torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 30 * 1e3
    for i in range(10):
        torch.cuda.synchronize(); step(record=True, sync_bw=True)
    by = {}
    for idx, ms in TIMES: by.setdefault(idx, []).append(ms)
    print(f"== {plan}: wall {wall:.2f} ms/step; host ms median fw {statistics.median(ph['fw']):.2f} bw {statistics.median(ph['bw']):.2f} "
          f"opt {statistics.median(ph['opt']):.2f}; bw until GPU done (idle start) {statistics.median(ph['bw_sync']):.2f}")
    print("   compiled functions' own wall ms (median):", {k: round(statistics.median(v), 3) for k, v in by.items()})
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5): step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
