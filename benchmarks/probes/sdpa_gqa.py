"""Which scaled_dot_product_attention kernel runs for grouped-query attention with a mask, and how
fast: key/value repeated per query head (transformers' repeat_kv) against enable_gqa=True.
Run on the GPU: python benchmarks/probes/sdpa_gqa.py"""
import torch
import torch.nn.functional as F

B, H, KV, S, D = 8, 32, 8, 512, 64
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
q = torch.randn(B, H, S, D, device=device, dtype=dtype)
k, v = (torch.randn(B, KV, S, D, device=device, dtype=dtype) for _ in range(2))
causal = torch.ones(S, S, dtype=torch.bool, device=device).tril()
masks = {"bool mask": causal[None, None].expand(B, 1, S, S).contiguous(),
         "float mask": torch.zeros(B, 1, S, S, device=device, dtype=dtype).masked_fill(~causal, float("-inf")),
         "no mask": None}


def repeated(x):
    return x[:, :, None].expand(B, KV, H // KV, S, D).reshape(B, H, S, D)


def timed(fn, n=20):
    for _ in range(3):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n
    import time
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


for label, mask in masks.items():
    variants = {"repeat_kv": lambda: F.scaled_dot_product_attention(q, repeated(k), repeated(v), attn_mask=mask),
                "enable_gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)}
    diff = (variants["repeat_kv"]().float() - variants["enable_gqa"]().float()).abs().max().item()
    for name, fn in variants.items():
        with torch.profiler.profile() as prof:
            fn()
        kernels = sorted({e.key for e in prof.key_averages() if "attention" in e.key.lower() or "fmha" in e.key.lower()
                          or "flash" in e.key.lower() or "bmm" in e.key.lower() or "softmax" in e.key.lower()})
        print(f"{label:10s} {name:10s} {timed(fn):8.3f} ms  max diff {diff:.3g}  {kernels[:6]}")
