"""Where do our default plan's GPT-2 prefill activations first differ from eager's? (on the GPU)

Per layer: how many hidden-state values differ from eager's, and the relative error; plus the
attention kernels eager and ours launch.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline import compile_with_plan

torch.manual_seed(0)
config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257)
model = GPT2LMHeadModel(config).to("cuda", torch.bfloat16).eval()
ids = torch.randint(0, config.vocab_size, (8, 512), device="cuda")


def hidden(ids):
    out = model(ids, output_hidden_states=True)
    return out.logits, out.hidden_states


compiled = compile_with_plan(hidden, "default")
with torch.no_grad():
    e_logits, e_hidden = hidden(ids)
    o_logits, o_hidden = compiled(ids)
    for i, (e, o) in enumerate(zip(e_hidden, o_hidden)):
        n = int((e != o).sum())
        rel = float((e.double() - o.double()).norm() / e.double().norm())
        print(f"hidden {i:2d}: {n:9d} of {e.numel()} differ ({n / e.numel():.2e}), relerr {rel:.2e}")
    n = int((e_logits != o_logits).sum())
    print(f"logits: {n} of {e_logits.numel()} differ, relerr "
          f"{float((e_logits.double() - o_logits.double()).norm() / e_logits.double().norm()):.3e}")
    from torch.profiler import ProfilerActivity, profile
    for name, fn in (("eager", hidden), ("ours", compiled)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(ids)
            torch.cuda.synchronize()
        names = sorted({e.name[:110] for e in prof.events() if e.device_type.name == "CUDA"
                        and any(k in e.name.lower() for k in ("sdpa", "flash", "fmha", "attention", "softmax"))})
        print(name, "attention kernels:", names)
