"""pp_gelu LN+GELU+residual kernel: launch-shape variants (warps, register cap, rows per program)."""
import sys, os, torch
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, here + "/../../gpu-2026-11-30-s9/scripts")   # ln_kernel.py: the generated kernel (pp_erf)
import ln_gelu
def cuda_ms(fn, iters=300):
    for _ in range(20): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters): fn()
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / iters)
    return sorted(ts)[3]
rows = 8192
x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16); b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
for rep in range(2):
    copy_ms = cuda_ms(lambda: out.copy_(x))
    for warps, xb, maxnreg in ((4, 1, None), (8, 1, None), (4, 1, 64), (8, 2, None), (2, 1, None), (4, 1, 72)):
        kw = {"num_warps": warps}
        if maxnreg: kw["maxnreg"] = maxnreg
        f = lambda: ln_gelu.KERNEL[(rows // xb,)](x, w, b, out, XBLOCK=xb, RBLOCK=4096, **kw)
        try:
            ms = cuda_ms(f)
            k = ln_gelu.KERNEL.warmup(x, w, b, out, XBLOCK=xb, RBLOCK=4096, grid=(1,), **kw)
            print(f"w{warps} XBLOCK{xb} maxnreg={maxnreg}: {ms:.4f} ms {copy_ms/ms*100:5.1f}% (copy {copy_ms:.4f}) regs {k.n_regs} spills {k.n_spills}", flush=True)
        except Exception as e:
            print(warps, xb, maxnreg, "failed", type(e).__name__, str(e)[:200], flush=True)
