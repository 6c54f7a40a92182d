"""Which part of a GPT-2 block makes our default plan's values differ from eager's? (on the GPU)

Each submodule of block 0 (ln_1, attn, ln_2, mlp) is compiled alone and run on the exact input
eager gave it; the share of its output values that differ from eager's output is printed.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline import compile_with_plan

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=50257)
model = GPT2LMHeadModel(config).to("cuda", torch.bfloat16).eval()
ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")
block = model.transformer.h[0]
seen = {}


def keep(name):
    def hook(module, args, kwargs, output):
        seen[name] = (args, kwargs, output)
    return hook


parts = {"ln_1": block.ln_1, "attn": block.attn, "ln_2": block.ln_2, "mlp": block.mlp,
         "mlp.c_fc": block.mlp.c_fc, "mlp.c_proj": block.mlp.c_proj, "attn.c_attn": block.attn.c_attn,
         "attn.c_proj": block.attn.c_proj}
handles = [m.register_forward_hook(keep(n), with_kwargs=True) for n, m in parts.items()]
with torch.no_grad():
    model(ids)
for h in handles:
    h.remove()


def first(x):
    return x[0] if isinstance(x, tuple) else x


with torch.no_grad():
    for name, module in parts.items():
        args, kwargs, expected = seen[name]
        torch._dynamo.reset()
        compiled = compile_with_plan(module, "default")
        got = first(compiled(*args, **kwargs))
        expected = first(expected)
        n = int((got != expected).sum())
        print(f"{name:12s}: {n:9d} of {expected.numel()} values differ ({n / expected.numel():.2e})")
    x = seen["mlp.c_fc"][0][0].reshape(-1, 768)
    w, b = block.mlp.c_fc.weight, block.mlp.c_fc.bias
    for label, fn in (("addmm", lambda x, w, b: torch.addmm(b, x, w)),
                      ("mm + bias", lambda x, w, b: torch.mm(x, w) + b)):
        torch._dynamo.reset()
        got = compile_with_plan(fn, "default")(x, w, b)
        n = int((got != fn(x, w, b)).sum())
        print(f"{label:12s}: {n:9d} of {got.numel()} values differ from the same call in eager")
    print("eager addmm vs eager mm+bias:", int((torch.addmm(b, x, w) != torch.mm(x, w) + b).sum()))
