"""Share of output values where our default plan's fused kernel and eager differ (bf16, GPT-2 sizes).

    python kernel_fidelity.py   (on the GPU)
"""
import torch
import torch.nn.functional as F

from pipeline import compile_with_plan


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def add_layer_norm(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (768,), w, b, 1e-5)


def differing(expected, got):
    return sum(int((e != g).sum()) for e, g in zip(expected, got)), sum(e.numel() for e in expected)


torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
cases = {
    "gelu_new 4096x3072": (gelu_new, (torch.randn(4096, 3072, device=dev).to(dt),)),
    "residual add + layer norm 4096x768": (add_layer_norm, (torch.randn(4096, 768, device=dev).mul(0.05).to(dt),
                                                            torch.randn(4096, 768, device=dev).mul(0.05).to(dt),
                                                            torch.ones(768, device=dev, dtype=dt),
                                                            torch.zeros(768, device=dev, dtype=dt))),
}
with torch.no_grad():
    for name, (fn, args) in cases.items():
        torch._dynamo.reset()
        compiled = compile_with_plan(fn, "default")
        expected, got = fn(*args), compiled(*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        n, total = differing(expected, got)
        print(f"{name}: {n} of {total} values differ from eager ({n / total:.2e})")
        if len(expected) > 1:
            for i, (e, g) in enumerate(zip(expected, got)):
                print(f"  output {i}: {int((e != g).sum())} differ")
