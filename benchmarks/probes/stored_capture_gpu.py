"""Which plans store their captures on the GPU (a small GPT-2 under default, reduce-overhead, llm-serving)."""
import torch, sys, traceback
sys.path.insert(0, ".")
from transformers import GPT2Config, GPT2LMHeadModel
config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=256, use_cache=False)
config._attn_implementation = "sdpa"
m = GPT2LMHeadModel(config).eval().cuda().to(torch.bfloat16)
import pipeline
from pipeline import compile_with_plan, compilation_of
for plan in ("default", "reduce-overhead", "llm-serving"):
    c = compile_with_plan(m, plan, cache={"dir": f"/tmp/c-{plan}"}, options={"capture": {"precompile": True}},
                          **({"shapes": {"axes": {"batch": [1, 2], "seq": [16, 32]}}} if plan == "llm-serving" else {}))
    with torch.no_grad():
        try:
            out = c(input_ids=torch.randint(0, 500, (2, 16), device="cuda"))
        except Exception:
            traceback.print_exc()
    st = compilation_of(c).runtime["stored_captures"]; print(plan, st.counts(), st.notes, flush=True)
