"""GPT-2 prefill (12 layers, random weights) as a model script for ``pipeline tune`` and
``pipeline profile``: ``model_and_inputs()`` returns the model (logits only) and one batch of
token ids; bf16 on CUDA, a 2-layer float32 model on the CPU.

    pipeline profile benchmarks/probes/gpt2_prefill.py --device cuda
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workloads import LogitsOf  # noqa: E402


def model_and_inputs(batch: int = 8, length: int = 512) -> tuple:
    import transformers
    cuda = torch.cuda.is_available()
    config = transformers.GPT2Config(n_layer=12 if cuda else 2, n_positions=1024, attn_implementation="sdpa")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    torch.manual_seed(0)
    model = LogitsOf(transformers.GPT2LMHeadModel(config)).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, config.vocab_size, (batch, length), device=device)
    return model, (ids,)
