"""Language models of the zoo: decoders (causal LMs), encoders and encoder-decoders from Hugging Face
transformers, each built from its config with random weights (nothing is downloaded).

Size ``full`` keeps the real checkpoint's widths, heads and vocabulary (named in each builder) but
cuts the depth to 4 layers, so that compiles stay short; inputs are decoders 8 x 512 tokens,
encoders 16 x 256 with a padding mask, encoder-decoders 8 x 256 source and 128 target tokens.
Size ``small`` is 2 layers of width 64 (4 heads of 16), a vocabulary of 1000 and 2 x 32 tokens
(16 target tokens), quick enough for CPU runs and CI.

Each Hugging Face model is wrapped in a module whose forward takes the model's own keyword inputs
(``input_ids`` positionally, the rest by keyword, as callers write it) and returns one plain tensor:
the logits of a causal LM or an encoder-decoder, the last hidden state of an encoder. Attention is
``sdpa`` throughout.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import torch
from torch import nn

from . import Built, mean_square_loss, padding_mask, random_ids, register

FULL_LAYERS = 4
NOTE = "real widths, cut to 4 layers"
HF = ("transformers",)


@attrs.frozen
class Widths:
    """The sizes a builder reads from: the real model's at ``full``, the common small ones at ``small``."""

    hidden: int
    heads: int
    intermediate: int
    vocab: int
    layers: int
    kv_heads: int
    head_dim: int


@attrs.frozen
class Shape:
    """The inputs' sizes: batch, (source) length and, for encoder-decoders, target length."""

    batch: int
    length: int
    target: int = 0


SHAPES = {
    ("decoder", "full"): Shape(8, 512), ("encoder", "full"): Shape(16, 256),
    ("encoder-decoder", "full"): Shape(8, 256, 128),
    ("decoder", "small"): Shape(2, 32), ("encoder", "small"): Shape(2, 32),
    ("encoder-decoder", "small"): Shape(2, 32, 16),
}


def widths(size: str, *, hidden: int, heads: int, intermediate: int, vocab: int, kv_heads: int | None = None,
           head_dim: int | None = None) -> Widths:
    """The real model's widths (given) at ``full`` with 4 layers; 2 layers of width 64 at ``small``
    (keeping grouped-query attention, as 4 query heads over 2 key/value heads, where the model has it)."""
    if size == "small":
        grouped = kv_heads is not None and kv_heads < heads
        return Widths(hidden=64, heads=4, intermediate=128, vocab=1000, layers=2, kv_heads=2 if grouped else 4,
                      head_dim=16)
    if size != "full":
        raise ValueError(f"unknown zoo size {size!r}; sizes: 'full', 'small'")
    return Widths(hidden=hidden, heads=heads, intermediate=intermediate, vocab=vocab, layers=FULL_LAYERS,
                  kv_heads=kv_heads or heads, head_dim=head_dim or hidden // heads)


class CausalLM(nn.Module):
    """A causal LM called on token ids alone (no padding); returns the logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


class MaskedCausalLM(CausalLM):
    """A causal LM called on a right-padded batch; returns the logits."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=True).logits


class Encoder(CausalLM):
    """An encoder called on a padded batch; returns the last hidden state."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state


class Seq2SeqLM(CausalLM):
    """An encoder-decoder called on a padded source batch and target ids (teacher forcing); returns
    the decoder's logits."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                          use_cache=False, return_dict=True).logits


def build_hf(family: str, config: Any, size: str, device: str, dtype: torch.dtype, *,
             masked: bool = True) -> Built:
    """Instantiate ``config`` with random weights (on ``device``, so that large embeddings are not
    initialised on the host), wrap it for ``family`` and draw its inputs."""
    import transformers
    config._attn_implementation = "sdpa"
    auto: Callable = {"decoder": transformers.AutoModelForCausalLM, "encoder": transformers.AutoModel,
                      "encoder-decoder": transformers.AutoModelForSeq2SeqLM}[family].from_config
    with torch.device(device):
        model = auto(config, attn_implementation="sdpa")
    wrapper = {"encoder": Encoder, "encoder-decoder": Seq2SeqLM}.get(family, MaskedCausalLM if masked else CausalLM)
    module = wrapper(model).to(device=device, dtype=dtype).eval()
    shape, vocab = SHAPES[family, size], config.vocab_size

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        ids = random_ids(generator, (shape.batch, shape.length), vocab, device)
        if wrapper is CausalLM:
            return (ids,), {}
        kwargs = {"attention_mask": padding_mask(generator, shape.batch, shape.length, device)}
        if family == "encoder-decoder":
            kwargs["decoder_input_ids"] = random_ids(generator, (shape.batch, shape.target), vocab, device)
        return (ids,), kwargs

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


# Decoders.

@register("gpt2", "decoder", requires=HF, train=True, ci=True, note=f"gpt2 (124M): {NOTE}; no attention mask")
def gpt2(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=50257)
    config = transformers.GPT2Config(n_embd=w.hidden, n_head=w.heads, n_inner=w.intermediate, n_layer=w.layers,
                                     vocab_size=w.vocab, n_positions=1024,
                                     bos_token_id=w.vocab - 1, eos_token_id=w.vocab - 1)
    return build_hf("decoder", config, size, device, dtype, masked=False)


@register("llama", "decoder", requires=HF, train=True, ci=True, note=f"Llama-3.2-1B: {NOTE}; grouped-query attention")
def llama(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
    config = transformers.LlamaConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                      num_key_value_heads=w.kv_heads, intermediate_size=w.intermediate,
                                      num_hidden_layers=w.layers, vocab_size=w.vocab, tie_word_embeddings=True)
    return build_hf("decoder", config, size, device, dtype)


@register("mistral", "decoder", requires=HF, note=f"Mistral-7B: {NOTE}; grouped-query attention")
def mistral(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000)
    config = transformers.MistralConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                        num_key_value_heads=w.kv_heads, intermediate_size=w.intermediate,
                                        num_hidden_layers=w.layers, vocab_size=w.vocab, sliding_window=4096)
    return build_hf("decoder", config, size, device, dtype)


@register("opt", "decoder", requires=HF, note=f"opt-125m: {NOTE}; learned positions")
def opt(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=50272)
    config = transformers.OPTConfig(hidden_size=w.hidden, num_attention_heads=w.heads, ffn_dim=w.intermediate,
                                    num_hidden_layers=w.layers, vocab_size=w.vocab, word_embed_proj_dim=w.hidden)
    return build_hf("decoder", config, size, device, dtype)


@register("gpt-neox", "decoder", requires=HF,
          note=f"pythia-160m: {NOTE}; parallel residual, rotary on a quarter of each head; no attention mask")
def gpt_neox(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=50304)
    config = transformers.GPTNeoXConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                        intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                        vocab_size=w.vocab, rotary_pct=0.25, use_parallel_residual=True)
    return build_hf("decoder", config, size, device, dtype, masked=False)


@register("qwen2", "decoder", requires=HF, note=f"Qwen2-0.5B: {NOTE}; grouped-query attention with q/k/v biases")
def qwen2(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
    config = transformers.Qwen2Config(hidden_size=w.hidden, num_attention_heads=w.heads,
                                      num_key_value_heads=w.kv_heads, intermediate_size=w.intermediate,
                                      num_hidden_layers=w.layers, vocab_size=w.vocab, tie_word_embeddings=True)
    return build_hf("decoder", config, size, device, dtype)


@register("phi", "decoder", requires=HF, note=f"phi-2: {NOTE}; parallel attention and MLP, partial rotary")
def phi(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=2560, heads=32, intermediate=10240, vocab=51200)
    config = transformers.PhiConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                    intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                    vocab_size=w.vocab, partial_rotary_factor=0.4)
    return build_hf("decoder", config, size, device, dtype)


@register("gemma", "decoder", requires=HF, note=f"gemma-2b: {NOTE}; multi-query attention, head dim 256")
def gemma(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=2048, heads=8, kv_heads=1, head_dim=256, intermediate=16384, vocab=256000)
    config = transformers.GemmaConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                      num_key_value_heads=w.kv_heads, head_dim=w.head_dim,
                                      intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                      vocab_size=w.vocab)
    return build_hf("decoder", config, size, device, dtype)


# Encoders, each called with a padding mask.

@register("bert", "encoder", requires=HF, train=True, ci=True, note=f"bert-base-uncased: {NOTE}")
def bert(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=30522)
    config = transformers.BertConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                     intermediate_size=w.intermediate, num_hidden_layers=w.layers, vocab_size=w.vocab)
    return build_hf("encoder", config, size, device, dtype)


@register("roberta", "encoder", requires=HF, train=True, note=f"roberta-base: {NOTE}; positions from the padding")
def roberta(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=50265)
    config = transformers.RobertaConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                        intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                        vocab_size=w.vocab, max_position_embeddings=514, pad_token_id=1)
    return build_hf("encoder", config, size, device, dtype)


@register("distilbert", "encoder", requires=HF, ci=True, note=f"distilbert-base-uncased: {NOTE}")
def distilbert(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=30522)
    config = transformers.DistilBertConfig(dim=w.hidden, n_heads=w.heads, hidden_dim=w.intermediate,
                                           n_layers=w.layers, vocab_size=w.vocab)
    return build_hf("encoder", config, size, device, dtype)


@register("albert", "encoder", requires=HF, note=f"albert-base-v2: {NOTE} (one shared layer applied 4 times)")
def albert(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=30000)
    config = transformers.AlbertConfig(embedding_size=128 if size == "full" else 32, hidden_size=w.hidden,
                                       num_attention_heads=w.heads, intermediate_size=w.intermediate,
                                       num_hidden_layers=w.layers, vocab_size=w.vocab)
    return build_hf("encoder", config, size, device, dtype)


@register("electra", "encoder", requires=HF, note=f"electra-base-discriminator: {NOTE}")
def electra(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=30522)
    config = transformers.ElectraConfig(embedding_size=w.hidden, hidden_size=w.hidden, num_attention_heads=w.heads,
                                        intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                        vocab_size=w.vocab)
    return build_hf("encoder", config, size, device, dtype)


# Encoder-decoders: padded source, teacher-forced target, decoder logits.

@register("t5", "encoder-decoder", requires=HF, train=True,
          note=f"t5-base: {NOTE} each side; relative position bias")
def t5(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=32128)
    config = transformers.T5Config(d_model=w.hidden, num_heads=w.heads, d_kv=w.head_dim, d_ff=w.intermediate,
                                   num_layers=w.layers, num_decoder_layers=w.layers, vocab_size=w.vocab)
    return build_hf("encoder-decoder", config, size, device, dtype)


@register("bart", "encoder-decoder", requires=HF, note=f"bart-base: {NOTE} each side")
def bart(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=50265)
    config = transformers.BartConfig(d_model=w.hidden, encoder_attention_heads=w.heads,
                                     decoder_attention_heads=w.heads, encoder_ffn_dim=w.intermediate,
                                     decoder_ffn_dim=w.intermediate, encoder_layers=w.layers,
                                     decoder_layers=w.layers, vocab_size=w.vocab)
    return build_hf("encoder-decoder", config, size, device, dtype)
