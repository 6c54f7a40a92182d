"""With an attention mask, which fused attention does tracing pick (make_fx, fake tensors), for
bool and additive masks of aligned and misaligned key lengths, and with a misaligned length kept
in an aligned (padded) storage; plus what the zoo's ViT passes as its mask under Dynamo."""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx


def ops(q, k, v, mask):
    gm = make_fx(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), tracing_mode="fake")(q, k, v, mask)
    return sorted({str(n.target).replace("aten.", "") for n in gm.graph.nodes if n.op == "call_function"
                   and "getitem" not in str(n.target)})


for s in (197, 49, 256):
    q, k, v = (torch.randn(8, s, 12, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    for kind in ("bool", "bf16"):
        mask = torch.rand(8, 1, s, s, device="cuda") > 0.1
        if kind == "bf16":
            mask = torch.zeros(8, 1, s, s, device="cuda", dtype=torch.bfloat16).masked_fill(~mask, -1e4)
        padded = (-s) % 16
        aligned = F.pad(mask, (0, padded))[..., :s] if padded else mask
        for label, m in (("plain", mask), ("aligned storage", aligned), ("expanded over heads", mask.expand(8, 12, s, s)),
                         ("broadcast batch", mask[:1])):
            try:
                got = ops(q, k, v, m)
            except Exception as error:  # noqa: BLE001
                got = f"{type(error).__name__}: {str(error)[:120]}"
            print(f"s{s} {kind} {label} stride {m.stride()}: {got}", flush=True)
        eager = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        fixed = F.scaled_dot_product_attention(q, k, v, attn_mask=aligned)
        print(f"s{s} {kind}: aligned-storage result equals plain: {torch.equal(eager, fixed)}", flush=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zoo import MODELS, load  # noqa: E402
load()
for name in ("vit", "wav2vec2"):
    built = MODELS[name].build("cuda", torch.bfloat16, "full")
    args, kwargs = built.inputs(0)
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}

    def backend(gm, example_inputs, name=name):
        for node in gm.graph.nodes:
            if "scaled_dot_product" in str(node.target):
                mask = node.kwargs.get("attn_mask")
                value = mask.meta.get("example_value") if hasattr(mask, "meta") else mask
                desc = (tuple(value.shape), value.stride(), value.dtype) if isinstance(value, torch.Tensor) else value
                print(f"{name}: mask {desc}; made by {getattr(mask, 'format_node', lambda: mask)()}", flush=True)
                for n in list(gm.graph.nodes)[:60]:
                    if n is mask or (hasattr(mask, 'all_input_nodes') and n in mask.all_input_nodes):
                        print("   ", n.format_node(), flush=True)
                break
        return gm
    with torch.no_grad():
        torch.compile(built.module, backend=backend)(*args, **kwargs)
    torch._dynamo.reset()
