"""LN+GELU+residual 8192x4096 bf16: the generated kernel with pp_erf (session 9) against the same
kernel with pp_gelu (session 10), timed alternately; error against an fp32 eager reference."""
import sys, os, torch, torch.nn.functional as F
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, here + "/../../gpu-2026-11-30-s9/scripts")   # ln_kernel.py: the generated kernel (pp_erf)
import ln_kernel, ln_gelu
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
torch.manual_seed(0)
x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16); b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(x)
ref = (F.gelu(F.layer_norm(x.float(), (4096,), w.float(), b.float())) + x.float())
eager = F.gelu(F.layer_norm(x, (4096,), w, b)) + x
def relerr(o): return ((o.float() - ref).norm() / ref.norm()).item()
print(f"eager bf16 relerr vs fp32 {relerr(eager):.2e}")
for rep in range(3):
    copy_ms = cuda_ms(lambda: out.copy_(x))
    line = [f"copy {copy_ms:.4f}"]
    for name, m in (("pp_erf", ln_kernel), ("pp_gelu", ln_gelu)):
        f = lambda: m.KERNEL[(rows,)](x, w, b, out, XBLOCK=1, RBLOCK=4096, num_warps=4)
        f(); torch.cuda.synchronize()
        err = relerr(out); same = (out == eager).float().mean().item()
        ms = cuda_ms(f)
        line.append(f"{name} {ms:.4f} ms {copy_ms/ms*100:5.1f}% relerr {err:.2e} equal-to-eager {same*100:.2f}%")
    print(" | ".join(line), flush=True)
k = ln_gelu.KERNEL.warmup(x, w, b, out, XBLOCK=1, RBLOCK=4096, num_warps=4, grid=(1,))
print("pp_gelu regs", k.n_regs, "spills", k.n_spills)
