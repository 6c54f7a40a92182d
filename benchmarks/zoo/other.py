"""The zoo's models outside language and vision: speech (wav2vec2 on raw audio), a mixture of
experts (Mixtral), a state-space recurrent model (Mamba), all from Hugging Face transformers configs
with random weights, and a diffusion U-Net block written here in plain torch (diffusers is not a
dependency).

Size ``full`` keeps the real model's widths with the depth cut to 4 layers; ``small`` is 2 layers
of width 64 (a U-Net of 32 channels) on inputs quick enough for CPU runs and CI. The inputs of
each size are named in the builders.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import Built, mean_square_loss, padding_mask, randn, random_ids, register
from .language import NOTE, CausalLM, MaskedCausalLM, widths

HF = ("transformers",)


def wrapped(wrapper: type[nn.Module], model: nn.Module, device: str, dtype: torch.dtype) -> nn.Module:
    """``model`` in ``wrapper``, in eval mode on ``device`` in ``dtype``."""
    return wrapper(model).to(device=device, dtype=dtype).eval()


class AudioEncoder(nn.Module):
    """A speech encoder called on raw audio; returns the last hidden state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=input_values, return_dict=True).last_hidden_state


@register("wav2vec2", "speech", requires=HF,
          note=f"wav2vec2-base: {NOTE}, with its 7-conv feature extractor; 8 x 1 s of 16 kHz audio")
def wav2vec2(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=3072, vocab=32)
    if size == "full":
        convs = dict(conv_dim=(512,) * 7, conv_stride=(5, 2, 2, 2, 2, 2, 2), conv_kernel=(10, 3, 3, 3, 3, 2, 2),
                     num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16)
        batch, samples = 8, 16000
    else:  # three convs of stride 80 in all: 2560 samples make 31 frames
        convs = dict(conv_dim=(32,) * 3, conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4),
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
        batch, samples = 2, 2560
    # No SpecAugment masking nor LayerDrop, so that a training step is a function of its inputs.
    config = transformers.Wav2Vec2Config(hidden_size=w.hidden, num_attention_heads=w.heads,
                                         intermediate_size=w.intermediate, num_hidden_layers=w.layers,
                                         feat_extract_norm="group", mask_time_prob=0.0, layerdrop=0.0, **convs)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = transformers.Wav2Vec2Model(config)
    module = wrapped(AudioEncoder, model, device, dtype)

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        return (randn(generator, (batch, samples), device, dtype),), {}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


class MoECausalLM(MaskedCausalLM):
    """A mixture-of-experts causal LM on a right-padded batch, its experts through transformers'
    default ``grouped_mm`` kernels; those take no float64, so a float64 copy (the runner's accuracy
    reference) runs its experts one at a time (transformers' ``eager`` experts) instead."""

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MoECausalLM:
        """nn.Module's hook under ``.to()`` and ``.double()``: convert, then pick the experts' path."""
        super()._apply(fn, recurse)
        double = any(p.dtype == torch.float64 for p in self.parameters())
        self.model.set_experts_implementation("eager" if double else "grouped_mm")
        return self


@register("mixtral", "moe", requires=HF, ci=True,
          note="Mixtral-style MoE decoder at width 768: 8 experts of 1536, top-2, 4 layers; 8 x 256 tokens; "
               "experts through transformers' default grouped_mm (eager experts in a float64 copy)")
def mixtral(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, kv_heads=4, intermediate=1536, vocab=32000)
    batch, length = (8, 256) if size == "full" else (2, 32)
    config = transformers.MixtralConfig(hidden_size=w.hidden, num_attention_heads=w.heads,
                                        num_key_value_heads=w.kv_heads, intermediate_size=w.intermediate,
                                        num_hidden_layers=w.layers, vocab_size=w.vocab,
                                        num_local_experts=8 if size == "full" else 4, num_experts_per_tok=2)
    with torch.device(device):
        model = transformers.MixtralForCausalLM._from_config(config, attn_implementation="sdpa",
                                                             experts_implementation="grouped_mm")
    module = wrapped(MoECausalLM, model, device, dtype)

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        ids = random_ids(generator, (batch, length), config.vocab_size, device)
        return (ids,), {"attention_mask": padding_mask(generator, batch, length, device)}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


@register("mamba", "recurrent", requires=HF,
          note="mamba-130m: real widths, cut to 4 layers; 8 x 64 tokens, since without the mamba-ssm kernels "
               "eager runs a Python loop over time (compiled, transformers switches to associative_scan); logits "
               "come out in float32 whatever the dtype, as transformers upcasts them")
def mamba(device: str, dtype: torch.dtype, size: str) -> Built:
    import transformers
    w = widths(size, hidden=768, heads=12, intermediate=1536, vocab=50280)  # heads unused: no attention
    batch, length = (8, 64) if size == "full" else (2, 32)
    config = transformers.MambaConfig(hidden_size=w.hidden, num_hidden_layers=w.layers, vocab_size=w.vocab,
                                      state_size=16, expand=w.intermediate // w.hidden, conv_kernel=4)
    with torch.device(device):
        model = transformers.MambaForCausalLM(config)
    module = wrapped(CausalLM, model, device, dtype)

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        return (random_ids(generator, (batch, length), config.vocab_size, device),), {}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


# A diffusion U-Net block, after Stable Diffusion's: ResNet blocks taking the timestep embedding, one
# spatial transformer (self- then cross-attention to the text context, GEGLU feed-forward), a skip
# connection from the down stage to the up stage.

class ResnetBlock(nn.Module):
    """GroupNorm, SiLU, 3x3 conv twice, with the timestep embedding added per channel in between."""

    def __init__(self, channels_in: int, channels_out: int, time_dim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels_in)
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.time_proj = nn.Linear(time_dim, channels_out)
        self.norm2 = nn.GroupNorm(groups, channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.skip = nn.Conv2d(channels_in, channels_out, 1) if channels_in != channels_out else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Attention(nn.Module):
    """Multi-head attention of ``x`` over ``context`` (itself for self-attention)."""

    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, -1, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(batch, length, dim))


class GEGLU(nn.Module):
    """The gated-GELU feed-forward: a projection to twice the inner width, one half gating the other."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)
        self.out = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(x).chunk(2, dim=-1)
        return self.out(value * F.gelu(gate))


class SpatialTransformer(nn.Module):
    """One transformer block over the spatial positions of a feature map, with a residual around it."""

    def __init__(self, channels: int, context_dim: int, heads: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.proj_in = nn.Linear(channels, channels)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(channels) for _ in range(3))
        self.self_attn = Attention(channels, channels, heads)
        self.cross_attn = Attention(channels, context_dim, heads)
        self.ff = GEGLU(channels, 4 * channels)
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        h = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(batch, height * width, channels))
        h = h + self.self_attn(self.norm1(h), self.norm1(h))
        h = h + self.cross_attn(self.norm2(h), context)
        h = h + self.ff(self.norm3(h))
        h = self.proj_out(h).reshape(batch, height, width, channels).permute(0, 3, 1, 2)
        return x + h


class UNetBlock(nn.Module):
    """A down stage (ResNet block and spatial transformer at full resolution, then a strided conv), a
    mid stage of two ResNet blocks at twice the channels and half the resolution, and an up stage
    (nearest upsampling, concatenation with the down stage's output, a ResNet block); the output
    has the sample's shape, as a noise prediction does."""

    def __init__(self, latent_channels: int, channels: int, context_dim: int, heads: int, groups: int) -> None:
        super().__init__()
        self.channels = channels
        time_dim = 4 * channels
        self.time_mlp = nn.Sequential(nn.Linear(channels, time_dim), nn.SiLU(), nn.Linear(time_dim, time_dim))
        self.conv_in = nn.Conv2d(latent_channels, channels, 3, padding=1)
        self.down_resnet = ResnetBlock(channels, channels, time_dim, groups)
        self.down_attn = SpatialTransformer(channels, context_dim, heads, groups)
        self.downsample = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.mid_resnets = nn.ModuleList([ResnetBlock(channels, 2 * channels, time_dim, groups),
                                          ResnetBlock(2 * channels, 2 * channels, time_dim, groups)])
        self.upsample_conv = nn.Conv2d(2 * channels, 2 * channels, 3, padding=1)
        self.up_resnet = ResnetBlock(3 * channels, channels, time_dim, groups)
        self.norm_out = nn.GroupNorm(groups, channels)
        self.conv_out = nn.Conv2d(channels, latent_channels, 3, padding=1)

    def time_embedding(self, timestep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The sinusoidal embedding of the timesteps, through the time MLP."""
        half = self.channels // 2
        exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
        angles = timestep.float()[:, None] * torch.exp(exponent)[None, :]
        return self.time_mlp(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(dtype))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        temb = self.time_embedding(timestep, sample.dtype)
        h = self.conv_in(sample)
        skip = self.down_attn(self.down_resnet(h, temb), encoder_hidden_states)
        h = self.downsample(skip)
        for resnet in self.mid_resnets:
            h = resnet(h, temb)
        h = self.upsample_conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.up_resnet(torch.cat([h, skip], dim=1), temb)
        return self.conv_out(F.silu(self.norm_out(h)))


@register("unet-block", "diffusion", train=True, ci=True,
          note="a Stable-Diffusion-style U-Net block in plain torch: 320 channels (GroupNorm 32, 8 heads) on "
               "8 x 4 x 32 x 32 latents, 77 context tokens of 768")
def unet_block(device: str, dtype: torch.dtype, size: str) -> Built:
    if size == "full":
        channels, groups, heads, context_dim, context_len, side, batch = 320, 32, 8, 768, 77, 32, 8
    elif size == "small":
        channels, groups, heads, context_dim, context_len, side, batch = 32, 8, 4, 32, 8, 8, 2
    else:
        raise ValueError(f"unknown zoo size {size!r}; sizes: 'full', 'small'")
    with torch.device(device):
        model = UNetBlock(4, channels, context_dim, heads, groups)
    module = model.to(device=device, dtype=dtype).eval()

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        sample = randn(generator, (batch, 4, side, side), device, dtype)
        timestep = random_ids(generator, (batch,), 1000, device)
        context = randn(generator, (batch, context_len, context_dim), device, dtype)
        return (sample, timestep, context), {}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)
