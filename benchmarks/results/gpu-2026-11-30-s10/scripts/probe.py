"""LN+GELU+residual 8192x4096 bf16: persistent / pipelined variants against the generated kernel."""
import sys, torch, triton
here = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, here + "/../../gpu-2026-11-30-s9/scripts")   # ln_kernel.py: the generated kernel
import ln_kernel, v8
def cuda_ms(fn, iters=300):
    for _ in range(20): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters): fn()
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / iters)
    return sorted(ts)[3]
rows, cols = 8192, 4096
torch.manual_seed(0)
x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
w = torch.randn(cols, device="cuda", dtype=torch.bfloat16); b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
copy_ms = cuda_ms(lambda: out.copy_(x))
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"copy {copy_ms:.4f} ms, {sms} SMs")
ln_kernel.KERNEL[(rows,)](x, w, b, out, XBLOCK=1, RBLOCK=4096, num_warps=4); torch.cuda.synchronize()
ref = out.float().clone()
def run(name, f, kernel=None, args=None):
    out.zero_()
    try:
        f(); torch.cuda.synchronize()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        ms = cuda_ms(f)
        print(f"{name:40s} {ms:.4f} ms {copy_ms/ms*100:5.1f}% err={err:.1e}", flush=True)
    except Exception as e:
        print(name, "failed", type(e).__name__, str(e)[:300], flush=True)
run("generated w4", lambda: ln_kernel.KERNEL[(rows,)](x, w, b, out, XBLOCK=1, RBLOCK=4096, num_warps=4))
for per_sm in (2, 4, 6, 8):
    n = sms * per_sm
    for warps in (4, 8):
        run(f"persist prefetch P={per_sm}/SM w{warps}", lambda: v8.ln_persist[(n,)](x, w, b, out, ROWS=rows, RBLOCK=4096, NPROG=n, num_warps=warps))
for per_sm in (4, 6, 8):
    n = sms * per_sm
    for stages in (2, 3):
        run(f"tl.range stages={stages} P={per_sm}/SM w4", lambda: v8.ln_stages[(n,)](x, w, b, out, ROWS=rows, RBLOCK=4096, NPROG=n, STAGES=stages, num_warps=4))
for per_sm in (2, 3, 4):
    n = sms * per_sm
    for warps in (4, 8):
        run(f"two rows P={per_sm}/SM w{warps}", lambda: v8.ln_two[(n,)](x, w, b, out, ROWS=rows, RBLOCK=4096, NPROG=n, num_warps=warps))
run("generated w4 again", lambda: ln_kernel.KERNEL[(rows,)](x, w, b, out, XBLOCK=1, RBLOCK=4096, num_warps=4))
