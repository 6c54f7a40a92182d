"""How much of GPT-2's logits difference from eager is the padded LM head? (on the GPU)

pad-mm pads the tied LM head's 50257 rows to 50264 so cuBLAS picks its fast kernels; the padded
matmul may round differently from eager's. Compares (1) the LM head alone on eager's final hidden
states, padded against eager, and (2) the whole model through the default plan with and without
pad-mm, against eager (relerr of the logits, and the time per call).
"""
import time

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline import compile_with_plan


def relerr(e, a):
    return float((e.double() - a.double()).norm() / e.double().norm())


torch.manual_seed(0)
config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
model = GPT2LMHeadModel(config).to("cuda", torch.bfloat16).eval()
ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")
with torch.no_grad():
    out = model(ids, output_hidden_states=True)
    hidden, logits = out.hidden_states[-1], out.logits
    w = model.lm_head.weight
    padded = F.pad(w, (0, 0, 0, 7))
    again = F.linear(hidden, w)
    print("LM head, eager again:", relerr(logits, again))
    print("LM head padded to 50264 rows:", relerr(logits, F.linear(hidden, padded)[..., :50257]))
    head = compile_with_plan(lambda h, w: F.linear(h, w), "default")
    print("LM head through the default plan:", relerr(logits, head(hidden, w)))
    for label, plan in (("default", "default"), ("default without pad-mm", {"extends": "default", "remove": ["pad-mm"]})):
        torch._dynamo.reset()
        compiled = compile_with_plan(model, plan)
        got = compiled(ids).logits
        for _ in range(10):
            compiled(ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(30):
            compiled(ids)
        torch.cuda.synchronize()
        print(f"whole model, {label}: relerr {relerr(logits, got):.4e}, {(time.perf_counter() - start) / 30 * 1e3:.3f} ms")
