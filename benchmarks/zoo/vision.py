"""Vision models of the zoo: vision transformers from Hugging Face transformers, convnets and mobile
nets from torchvision, each built with random weights (nothing is downloaded).

Size ``full`` is what an H200 is timed on: convnets and mobile nets at batch 64 of 224x224 images
(channels_last on CUDA, module and inputs), vision transformers at batch 32 of 224x224 with the
real widths (ViT-B: hidden 768, 12 heads, patch 16) but 4 layers, so that compiles stay short.
Size ``small`` is for CPU runs and CI: convnets at batch 2 of 64x64 images with their real depth
and widths and 10 classes (a training step takes about 0.3 s on one core for resnet50, less for the
rest); vision transformers with 2 layers of width 64 (4 heads) on 32x32 images in patches of 8.

torchvision's wheels are CUDA builds, so where it does not import (CPU runs, CI) ResNet,
MobileNetV2 and MobileNetV3-Large fall back to the plain-torch copies in ``zoo/convnets.py``
(same layers, parameter counts and state_dict keys); the module's class tells which one was built
(``torchvision.models.*`` or ``zoo.convnets.*``). The other torchvision models have no copy and
need torchvision.
"""
from __future__ import annotations

from typing import Callable

import attrs
import torch
from torch import nn

from . import Built, convnets, mean_square_loss, randn, register

HF = ("transformers",)
TORCHVISION = ("torchvision",)
FALLBACK = "torchvision's {arch}(weights=None) where torchvision imports, else the plain-torch copy in zoo/convnets.py"
TV_ONLY = "torchvision's {arch}(weights=None); no CPU copy"
CUT = "real widths, cut to 4 layers"


def _size(table: dict, size: str):
    """The entry of ``table`` for ``size``, or a clear error."""
    if size not in table:
        raise ValueError(f"unknown zoo size {size!r}; sizes: {', '.join(repr(s) for s in table)}")
    return table[size]


# -- convnets and mobile nets -----------------------------------------------------------------------
@attrs.frozen
class ImageBatch:
    """A batch of square RGB images and the number of classes the head predicts."""

    batch: int
    image: int
    classes: int


CONV_SIZES = {"full": ImageBatch(batch=64, image=224, classes=1000),
              "small": ImageBatch(batch=2, image=64, classes=10)}


def _torchvision_builder(arch: str) -> Callable[..., nn.Module] | None:
    """``torchvision.models.<arch>``, or None where torchvision does not import."""
    try:
        import torchvision.models
    except Exception:  # noqa: BLE001 - any import failure (missing, CUDA-only build) means: use the copy
        return None
    return getattr(torchvision.models, arch)


def convnet(arch: str, device: str, dtype: torch.dtype, size: str,
            fallback: Callable[..., nn.Module] | None = None) -> Built:
    """torchvision's ``arch`` with random weights (or ``fallback``, the copy in zoo/convnets.py, where
    torchvision does not import), in eval mode; channels_last on CUDA, inputs likewise."""
    shape = _size(CONV_SIZES, size)
    builder = _torchvision_builder(arch)
    if builder is not None:
        module = builder(weights=None, num_classes=shape.classes)
    elif fallback is not None:
        module = fallback(num_classes=shape.classes)
    else:
        raise RuntimeError(f"{arch} needs torchvision, which does not import here (zoo/convnets.py has no copy)")
    channels_last = torch.device(device).type == "cuda"
    module = module.to(device=device, dtype=dtype).eval()
    if channels_last:
        module = module.to(memory_format=torch.channels_last)

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        images = randn(generator, (shape.batch, 3, shape.image, shape.image), device, dtype)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return (images,), {}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


@register("resnet18", "convnet", train=True, ci=True, note=FALLBACK.format(arch="resnet18"))
def resnet18(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("resnet18", device, dtype, size, convnets.resnet18)


@register("resnet50", "convnet", train=True, note=FALLBACK.format(arch="resnet50"))
def resnet50(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("resnet50", device, dtype, size, convnets.resnet50)


@register("resnext50_32x4d", "convnet", note=FALLBACK.format(arch="resnext50_32x4d") + "; grouped 3x3 convs")
def resnext50_32x4d(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("resnext50_32x4d", device, dtype, size, convnets.resnext50_32x4d)


@register("densenet121", "convnet", requires=TORCHVISION, cpu=False, note=TV_ONLY.format(arch="densenet121"))
def densenet121(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("densenet121", device, dtype, size)


@register("regnet_y_1_6gf", "convnet", requires=TORCHVISION, cpu=False,
          note=TV_ONLY.format(arch="regnet_y_1_6gf") + "; grouped convs and squeeze-excitation")
def regnet_y_1_6gf(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("regnet_y_1_6gf", device, dtype, size)


@register("convnext_tiny", "convnet", requires=TORCHVISION, cpu=False,
          note=TV_ONLY.format(arch="convnext_tiny") + "; 7x7 depthwise convs and LayerNorm, no batch norm")
def convnext_tiny(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("convnext_tiny", device, dtype, size)


@register("mobilenet_v2", "mobile", train=True, ci=True, note=FALLBACK.format(arch="mobilenet_v2"))
def mobilenet_v2(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("mobilenet_v2", device, dtype, size, convnets.mobilenet_v2)


@register("mobilenet_v3_large", "mobile", note=FALLBACK.format(arch="mobilenet_v3_large"))
def mobilenet_v3_large(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("mobilenet_v3_large", device, dtype, size, convnets.mobilenet_v3_large)


@register("efficientnet_b0", "mobile", requires=TORCHVISION, cpu=False,
          note=TV_ONLY.format(arch="efficientnet_b0") + "; SiLU, squeeze-excitation, stochastic depth")
def efficientnet_b0(device: str, dtype: torch.dtype, size: str) -> Built:
    return convnet("efficientnet_b0", device, dtype, size)


# -- vision transformers ----------------------------------------------------------------------------
@attrs.frozen
class ViTShape:
    """A vision transformer's widths and its inputs' sizes."""

    batch: int
    image: int
    patch: int
    hidden: int
    heads: int
    layers: int
    classes: int


VIT_SIZES = {"full": ViTShape(batch=32, image=224, patch=16, hidden=768, heads=12, layers=4, classes=1000),
             "small": ViTShape(batch=2, image=32, patch=8, hidden=64, heads=4, layers=2, classes=10)}


class PixelModel(nn.Module):
    """A Hugging Face vision model called on pixel values alone; returns one field of its output
    (``logits`` of a classifier, ``last_hidden_state`` of a bare model) as a plain tensor."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values=pixel_values), self.field)


def vision_transformer(model: nn.Module, field: str, batch: int, image: int, device: str,
                       dtype: torch.dtype) -> Built:
    """``model`` wrapped to return ``field``, in eval mode on ``device``, fed ``batch`` random
    ``image`` x ``image`` RGB images."""
    module = PixelModel(model, field).to(device=device, dtype=dtype).eval()

    def make_inputs(generator: torch.Generator | None) -> tuple[tuple, dict]:
        return (randn(generator, (batch, 3, image, image), device, dtype),), {}

    return Built(module=module, make_inputs=make_inputs, loss=mean_square_loss)


def _vit_widths(shape: ViTShape) -> dict:
    """The config fields ViT, DeiT and DINOv2 share, at ``shape``'s widths (MLP 4x hidden)."""
    return dict(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                image_size=shape.image, patch_size=shape.patch)


@register("vit", "vision-transformer", requires=HF, train=True, ci=True,
          note=f"ViTForImageClassification, ViT-B/16 {CUT}")
def vit(device: str, dtype: torch.dtype, size: str) -> Built:
    from transformers import ViTConfig, ViTForImageClassification
    shape = _size(VIT_SIZES, size)
    config = ViTConfig(**_vit_widths(shape), intermediate_size=4 * shape.hidden, num_labels=shape.classes)
    return vision_transformer(ViTForImageClassification(config), "logits", shape.batch, shape.image, device,
                              dtype)


@register("deit", "vision-transformer", requires=HF,
          note=f"DeiTModel (class and distillation tokens, no pooler), last hidden state; DeiT-B/16 {CUT}")
def deit(device: str, dtype: torch.dtype, size: str) -> Built:
    from transformers import DeiTConfig, DeiTModel
    shape = _size(VIT_SIZES, size)
    config = DeiTConfig(**_vit_widths(shape), intermediate_size=4 * shape.hidden)
    return vision_transformer(DeiTModel(config, add_pooling_layer=False), "last_hidden_state", shape.batch,
                              shape.image, device, dtype)


@register("dinov2", "vision-transformer", requires=HF,
          note=f"Dinov2Model (layer scale), last hidden state; DINOv2-B {CUT}, patch 14 at full")
def dinov2(device: str, dtype: torch.dtype, size: str) -> Built:
    from transformers import Dinov2Config, Dinov2Model
    shape = _size(VIT_SIZES, size)
    if size == "full":
        shape = attrs.evolve(shape, patch=14)  # DINOv2's own patch: 16x16 patches of a 224 image
    return vision_transformer(Dinov2Model(Dinov2Config(**_vit_widths(shape))), "last_hidden_state", shape.batch,
                              shape.image, device, dtype)


@attrs.frozen
class SwinShape:
    """A Swin transformer's stages (depths and heads), embedding width, window and its inputs' sizes."""

    batch: int
    image: int
    patch: int
    embed: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    window: int
    classes: int


SWIN_SIZES = {
    "full": SwinShape(batch=32, image=224, patch=4, embed=96, depths=(2, 2, 2, 2), heads=(3, 6, 12, 24), window=7,
                      classes=1000),
    # 8x8 patches: stage 1 has 2x2 windows of 4 (the second block shifted), stage 2 one 4x4 window.
    "small": SwinShape(batch=2, image=32, patch=4, embed=32, depths=(2, 2), heads=(2, 4), window=4, classes=10),
}


@register("swin", "vision-transformer", requires=HF, ci=True,
          note="SwinForImageClassification, Swin-T widths (embed 96, heads 3/6/12/24, window 7) with depths cut "
               "from 2/2/6/2 to 2/2/2/2")
def swin(device: str, dtype: torch.dtype, size: str) -> Built:
    from transformers import SwinConfig, SwinForImageClassification
    shape = _size(SWIN_SIZES, size)
    config = SwinConfig(image_size=shape.image, patch_size=shape.patch, embed_dim=shape.embed, depths=shape.depths,
                        num_heads=shape.heads, window_size=shape.window, num_labels=shape.classes)
    return vision_transformer(SwinForImageClassification(config), "logits", shape.batch, shape.image, device,
                              dtype)
