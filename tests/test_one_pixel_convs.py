"""decompose's one-pixel convolutions: a 1x1 convolution of a 1x1 image becomes a linear layer
(squeeze-and-excitation layers, pooled heads), and every other convolution stays a convolution;
results and gradients as eager's."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passes.decompose import Decompose, DecomposeOptions
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.testing import assert_gradients_match, assert_preserves_semantics

conv = torch.ops.aten.convolution.default


class SqueezeExcite(torch.nn.Module):
    """MobileNet-V3's squeeze-and-excitation: pool, 1x1 conv down, ReLU, 1x1 conv up, gate."""

    def __init__(self, channels: int, squeezed: int, bias: bool = True) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(channels, squeezed, 1, bias=bias)
        self.up = torch.nn.Conv2d(squeezed, channels, 1, bias=bias)
        self.body = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        y = self.body(x)
        scale = torch.nn.functional.hardsigmoid(self.up(self.down(y.mean((2, 3), keepdim=True)).relu()))
        return y * scale


@st.composite
def one_pixel_cases(draw):
    batch, cin, cout = draw(st.integers(1, 3)), draw(st.integers(1, 12)), draw(st.integers(1, 12))
    side = draw(st.sampled_from([1, 1, 2]))                 # a 2x2 image is not one pixel: kept
    kernel = draw(st.sampled_from([1, 1, 3]))
    padding = 1 if kernel == 3 else draw(st.sampled_from([0, 0, 1]))
    stride = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 1] + ([cin] if cin == cout else [])))
    bias = draw(st.booleans())
    layout = draw(st.sampled_from([torch.contiguous_format, torch.channels_last]))

    def fn(x, w, b):
        return conv(x, w, b, [stride, stride], [padding, padding], [1, 1], False, [0, 0], groups).sin()

    inputs = [torch.randn(batch, cin, side, side).contiguous(memory_format=layout),
              torch.randn(cout, cin // groups, kernel, kernel), torch.randn(cout) if bias else None]
    return fn, inputs


@settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(one_pixel_cases())
def test_the_rewrite_preserves_semantics(case):
    fn, inputs = case
    assert_preserves_semantics(Decompose(DecomposeOptions()), fn, inputs)


def test_squeeze_and_excitation_convolutions_become_linear_layers_and_the_body_stays_a_convolution():
    module = SqueezeExcite(16, 4).eval()
    compiled = compile_with_plan(module, "default", report=True)
    with torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, 16, 5, 5)
            assert compare(module(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs[:1]
    externs = record.contents["extern_calls"]
    assert externs.get("aten.convolution.default") == 1, externs
    assert externs.get("aten.linear.default") == 2, externs


def test_off_keeps_every_convolution():
    module = SqueezeExcite(16, 4, bias=False).eval()
    compiled = compile_with_plan(module, {"extends": "default",
                                          "options": {"decompose": {"one_pixel_convs_as_linear": False}}},
                                 report=True)
    with torch.no_grad():
        x = torch.randn(2, 16, 5, 5)
        assert compare(module(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs[:1]
    assert record.contents["extern_calls"].get("aten.convolution.default") == 3


def test_gradients_through_the_linear_layers_match_eager():
    module = SqueezeExcite(8, 2)
    assert_gradients_match("training", lambda x: module(x), [torch.randn(2, 8, 4, 4)])
