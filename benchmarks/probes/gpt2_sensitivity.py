"""How far apart can two correct bf16 evaluations of GPT-2 prefill be? (the GPU suite's GPT-2 row)

    python benchmarks/probes/gpt2_sensitivity.py [--device cuda] [--batch 8] [--seq 512] [--out DIR]

The GPU suite compares each compiled model's logits with eager's by relative error,
``||a - b|| / ||b||``. This measures what that number can be for computations that differ from
eager only in rounding, all in eager PyTorch:

- ``flips``: eager, except that a fraction ``p`` of the elements of every layer's GELU output is
  moved by one bf16 step (the next representable value): the smallest change a kernel that
  rounds one value differently makes;
- ``variants``: eager with another of PyTorch's own kernel choices (cuBLAS without reduced-
  precision bf16 reductions, the math attention kernel instead of the fused one);
- ``fp32``: eager bf16 against the same weights in fp32 (the rounding error of bf16 itself).

Model: transformers' GPT-2 built from its config (12 layers, d 768) as in the suite, random ids.
Prints a table and writes ``gpt2-sensitivity.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch


def relerr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    e, a = expected.double(), actual.double()
    return float((e - a).norm() / e.norm().clamp_min(1e-30))


class Flips:
    """A forward hook moving a fixed random fraction of a module's output by one bf16 step."""

    def __init__(self) -> None:
        self.fraction = 0.0
        self.moved = 0

    def __call__(self, module, inputs, output):
        if self.fraction == 0.0:
            return output
        generator = torch.Generator(device=output.device).manual_seed(1234)
        chosen = torch.rand(output.shape, generator=generator, device=output.device) < self.fraction
        self.moved += int(chosen.sum())
        bits = output.view(torch.int16).clone()
        bits[chosen] += 1               # sign and magnitude: the next bf16 value away from zero
        return bits.view(torch.bfloat16)


def variants(device: str) -> dict:
    """Context managers selecting another of eager's own kernels."""
    found: dict = {}
    if device == "cuda":
        @contextlib.contextmanager
        def full_precision_reductions():
            matmul = torch.backends.cuda.matmul
            before = matmul.allow_bf16_reduced_precision_reduction
            matmul.allow_bf16_reduced_precision_reduction = not before
            try:
                yield
            finally:
                matmul.allow_bf16_reduced_precision_reduction = before
        found["cublas_bf16_reduced_precision_toggled"] = full_precision_reductions
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        found["attention_math_kernel"] = lambda: sdpa_kernel([SDPBackend.MATH])
    except ImportError:
        pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--fractions", default="1e-7,1e-6,1e-5,1e-4,1e-3")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=50257)
    model = GPT2LMHeadModel(config).to(args.device, torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
    flips = Flips()
    for block in model.transformer.h:
        block.mlp.act.register_forward_hook(flips)
    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                    "torch": torch.__version__, "batch": args.batch, "seq": args.seq, "layers": args.layers,
                    "date": time.strftime("%Y-%m-%d"), "flips": [], "variants": {}}
    with torch.no_grad():
        reference = model(ids).logits
        result["eager_again"] = relerr(reference, model(ids).logits)
        gelu_elements = args.batch * args.seq * 4 * 768 * args.layers
        for fraction in (float(f) for f in args.fractions.split(",")):
            flips.fraction, flips.moved = fraction, 0
            moved = relerr(reference, model(ids).logits)
            result["flips"].append({"fraction": fraction, "values_moved": flips.moved,
                                    "of_gelu_values": gelu_elements, "relerr": moved})
        flips.fraction = 0.0
        for name, make in variants(args.device).items():
            with make():
                result["variants"][name] = relerr(reference, model(ids).logits)
        fp32 = GPT2LMHeadModel(config).to(args.device).eval()
        fp32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        result["bf16_vs_fp32"] = relerr(fp32(ids).logits, reference)
    print(f"GPT-2 {args.layers} layers, b{args.batch} s{args.seq} bf16 on {result['device']}, torch {torch.__version__}")
    print(f"eager against itself: {result['eager_again']:.2e}; eager bf16 against fp32: {result['bf16_vs_fp32']:.3e}")
    print("| GELU values moved one bf16 step | of all | logits relerr against eager |\n|---|---|---|")
    for row in result["flips"]:
        print(f"| {row['values_moved']} | {row['values_moved'] / row['of_gelu_values']:.1e} | {row['relerr']:.3e} |")
    for name, value in result["variants"].items():
        print(f"eager with {name}: relerr {value:.3e}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpt2-sensitivity.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
