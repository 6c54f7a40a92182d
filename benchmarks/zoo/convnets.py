"""Plain-torch re-implementations of torchvision's ResNet, MobileNetV2 and MobileNetV3-Large, for
machines where torchvision does not import (its wheels are CUDA builds, so CPU runs and CI lack it).

They follow torchvision layer for layer: the same modules in the same order (conv-bn-relu, v1.5
bottlenecks with the stride on the 3x3, depthwise inverted residuals with ReLU6, squeeze-excitation
with hardsigmoid and hardswish activations), the same attribute names (so ``state_dict`` keys match
torchvision's and its checkpoints would load), the same in-place activations and the same weight
initialisation. Parameter counts equal torchvision's: resnet18 11,689,512; resnet50 25,557,032;
resnext50_32x4d 25,028,904; mobilenet_v2 3,504,872; mobilenet_v3_large 5,483,032. Checked against
torchvision 0.26: each model's state_dict loads strictly into its copy, and the copy's eval outputs
are then bit-identical (its training-mode gradients equal to float32 rounding).
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn


def _make_divisible(value: float, divisor: int = 8) -> int:
    """``value`` rounded to a multiple of ``divisor``, never more than 10% below it (torchvision's rule)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


def conv_norm_act(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                  norm: Callable[[int], nn.Module] = nn.BatchNorm2d,
                  act: Callable[..., nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """Conv (no bias, 'same' padding), batch norm, activation: torchvision's Conv2dNormActivation."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False), norm(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


def _init_weights(model: nn.Module, linear_std: float | None) -> None:
    """torchvision's initialisation: Kaiming-normal convs (fan out), unit batch norms, and linear
    layers normal(0, ``linear_std``) with zero bias (None: PyTorch's default, as ResNet keeps)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0, linear_std)
            nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------------- ResNet

class BasicBlock(nn.Module):
    """Two 3x3 conv-bn pairs and the shortcut (resnet18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64) -> None:
        super().__init__()
        if groups != 1 or base_width != 64:
            raise ValueError("BasicBlock only supports groups=1 and base_width=64")
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, grouped for ResNeXt), 1x1 expand by 4, and the shortcut (ResNet v1.5)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64) -> None:
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class ResNet(nn.Module):
    """7x7 stem, max pool, four stages of blocks (strides 1, 2, 2, 2), average pool, linear head."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000,
                 groups: int = 1, width_per_group: int = 64) -> None:
        super().__init__()
        self.inplanes = 64
        self.groups = groups
        self.base_width = width_per_group
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0], 1)
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        _init_weights(self, linear_std=None)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, 1, None, self.groups, self.base_width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


def resnext50_32x4d(num_classes: int = 1000) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, groups=32, width_per_group=4)


# ----------------------------------------------------------------------------------- MobileNetV2

class InvertedResidualV2(nn.Module):
    """1x1 expand (ReLU6), 3x3 depthwise (ReLU6), linear 1x1 project; residual when shapes allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(conv_norm_act(inp, hidden, 1, act=nn.ReLU6))
        layers += [conv_norm_act(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """Stem, seventeen inverted residuals in seven stages (t, c, n, s below), 1x1 to 1280, pool, head."""

    SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2) -> None:
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [conv_norm_act(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in self.SETTING:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidualV2(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(conv_norm_act(cin, self.last_channel, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))
        _init_weights(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetV2:
    return MobileNetV2(num_classes, width_mult)


# ----------------------------------------------------------------------------- MobileNetV3-Large

class SqueezeExcitation(nn.Module):
    """Global average pool, 1x1 squeeze (ReLU), 1x1 excite (hardsigmoid), channel-wise scale."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidualV3(nn.Module):
    """1x1 expand, kxk depthwise, optional squeeze-excitation, linear 1x1 project (ReLU or hardswish)."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, use_se: bool, act: type[nn.Module],
                 stride: int, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(conv_norm_act(cin, expanded, 1, norm=norm, act=act))
        layers.append(conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, norm=norm, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(conv_norm_act(expanded, cout, 1, norm=norm, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3(nn.Module):
    """Hardswish stem, fifteen inverted residuals (kernel, expanded, out, SE, activation, stride
    below), 1x1 to 960, pool, a 1280-wide hardswish hidden layer with dropout, head."""

    LARGE = [(16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
             (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
             (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
             (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
             (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1)]

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2) -> None:
        super().__init__()
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        adjust = lambda channels: _make_divisible(channels * width_mult)  # noqa: E731 - torchvision's adjust_channels
        setting = [(adjust(cin), k, adjust(exp), adjust(cout), se, nn.Hardswish if act == "HS" else nn.ReLU, s)
                   for cin, k, exp, cout, se, act, s in self.LARGE]
        layers: list[nn.Module] = [conv_norm_act(3, setting[0][0], 3, 2, norm=norm, act=nn.Hardswish)]
        layers += [InvertedResidualV3(*cnf, norm=norm) for cnf in setting]
        last_in = setting[-1][3]
        layers.append(conv_norm_act(last_in, 6 * last_in, 1, norm=norm, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        last_channel = adjust(1280)
        self.classifier = nn.Sequential(nn.Linear(6 * last_in, last_channel), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=dropout, inplace=True), nn.Linear(last_channel, num_classes))
        _init_weights(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


def mobilenet_v3_large(num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetV3:
    return MobileNetV3(num_classes, width_mult)
