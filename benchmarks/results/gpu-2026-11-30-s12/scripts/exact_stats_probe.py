"""codegen.eager_norm_statistics on the H200: GPT-2 prefill and the layer norm + GELU + residual
row, default plan with and without it (relerr against eager, ms per call, share of a device copy)."""
import sys

import torch

sys.path.insert(0, "benchmarks")
from gpu_suite import copy_time, cuda_time, gpt2, layer_norm_gelu_residual, relerr  # noqa: E402

from pipeline import compile_with_plan  # noqa: E402

EXACT = {"extends": "default", "options": {"codegen": {"eager_norm_statistics": True}}}
PLANS = {"default": "default", "default + eager_norm_statistics": EXACT}

torch.manual_seed(0)
x = torch.randn(8192, 4096, device="cuda").to(torch.bfloat16)
w, b = torch.randn(4096, device="cuda").to(torch.bfloat16), torch.randn(4096, device="cuda").to(torch.bfloat16)
copy = copy_time(3 * x.numel() * 2)
with torch.no_grad():
    expected = layer_norm_gelu_residual(x, w, b)
    for label, plan in PLANS.items():
        torch._dynamo.reset()
        fn = compile_with_plan(layer_norm_gelu_residual, plan)
        got = fn(x, w, b)
        ms = cuda_time(fn, (x, w, b))
        print(f"layer norm + GELU + residual, {label}: {ms:.4f} ms, {100 * copy / ms:.1f} % of copy "
              f"({copy:.4f} ms), relerr {relerr(expected, got):.2e}, {int((got != expected).sum())} values differ")
    torch.manual_seed(0)
    model = gpt2()
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    expected = model(ids)
    for rep in range(2):
        for label, plan in PLANS.items():
            torch._dynamo.reset()
            fn = compile_with_plan(model, plan)
            got = fn(ids)
            ms = cuda_time(fn, (ids,), iters=20)
            print(f"GPT-2 prefill, {label}: {ms:.3f} ms, relerr {relerr(expected, got):.4e}, "
                  f"{int((got != expected).sum())} of {got.numel()} logits differ")
