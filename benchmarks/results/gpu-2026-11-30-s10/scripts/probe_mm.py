"""LM head x @ W.t(), M 4096, K 768, N 50257 bf16: padded weight (pad-mm today) vs writing the
product into a row-padded output buffer (ldc 50264) without copying the weight."""
import torch, torch.nn.functional as F
def cuda_ms(fn, iters=50):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters): fn()
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / iters)
    return sorted(ts)[3]
M, K, N, P = 4096, 768, 50257, 50264
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
buf = torch.empty(M, P, device="cuda", dtype=torch.bfloat16)
ref = (x.float() @ W.float().t())
def plain(): return torch.mm(x, W.t())
def padded_weight():
    Wp = F.pad(W, (0, 0, 0, P - N))
    return torch.mm(x, Wp.t())[:, :N]
def into_padded():
    out = torch.empty(M, P, device="cuda", dtype=torch.bfloat16)
    torch.mm(x, W.t(), out=out[:, :N])
    return out[:, :N]
def into_padded_reuse():
    torch.mm(x, W.t(), out=buf[:, :N]); return buf[:, :N]
for name, f in (("plain (ldc 50257)", plain), ("padded weight (pad-mm)", padded_weight),
                ("mm into padded output", into_padded), ("mm into a kept padded buffer", into_padded_reuse)):
    o = f(); torch.cuda.synchronize()
    err = ((o.float() - ref).norm() / ref.norm()).item()
    print(f"{name:32s} {cuda_ms(f):.4f} ms relerr {err:.2e} stride {o.stride()} data_ptr_moved {o.data_ptr() != o.untyped_storage().data_ptr()}", flush=True)
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
with prof:
    into_padded(); plain(); torch.cuda.synchronize()
for e in prof.key_averages():
    print(f"  {e.key[:90]:90s} {e.device_time_total/1e3:.3f} ms x{e.count}")
