"""``reinplace.share_cat_prefixes``: concatenations that extend one another (a DenseNet block) share
one buffer; each piece is copied into it once and every concatenation reads a view of it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import compilation_of, compile_with_plan
from pipeline.testing import assert_preserves_semantics

FAST = settings(max_examples=15, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
NO_SHARING = {"extends": "default", "options": {"reinplace": {"share_cat_prefixes": False}}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


class DenseLayer(torch.nn.Module):
    def __init__(self, channels: int, growth: int):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(channels)
        self.conv = torch.nn.Conv2d(channels, growth, 3, padding=1, bias=False)

    def forward(self, features: list) -> torch.Tensor:
        return self.conv(torch.relu(self.norm(torch.cat(features, 1))))


class DenseBlock(torch.nn.Module):
    """torchvision's dense block: every layer reads the concatenation of all earlier features."""

    def __init__(self, channels: int = 8, growth: int = 4, layers: int = 7):
        super().__init__()
        self.layers = torch.nn.ModuleList(DenseLayer(channels + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def dense_block(channels_last: bool) -> DenseBlock:
    torch.manual_seed(0)
    block = DenseBlock().eval()
    for module in block.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_()
            module.bias.data.normal_()
    return block.to(memory_format=torch.channels_last) if channels_last else block


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_dense_block_copies_each_feature_once_and_matches_eager(channels_last):
    block = dense_block(channels_last)
    compiled = compile_with_plan(block, "default")
    unshared = compile_with_plan(block, NO_SHARING)
    for size in (9, 16):
        x = torch.randn(2, 8, size, size)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            expected, got = block(x), compiled(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            assert got.stride() == expected.stride()
            torch.testing.assert_close(got, unshared(x), rtol=0, atol=0)
    static = compilation_of(compiled).graphs[0]     # the second size compiled a dynamic graph: its cats stay
    assert "aten_cat" not in static.final_code and "torch.cat" not in static.final_code, static.final_code
    assert "copy_" in static.final_code
    assert "cat" in compilation_of(unshared).graphs[0].final_code
    notes = [n["message"] for n in static.notes if n["pass"] == "reinplace"]
    assert any("5 concatenation(s) that extend one another share buffers" in n for n in notes), notes


def test_a_returned_concatenation_is_not_extended():
    """The first cat is an output: it stays a cat of its own (a view of a larger buffer would come
    back with other strides), and the second keeps its values."""
    def f(a, b, c):
        first = torch.cat([a, b], 1)
        second = torch.cat([a, b, c * first[:, :3]], 1)
        return first, second.sin()

    a, b, c = torch.randn(4, 3), torch.randn(4, 2), torch.randn(4, 3)
    compiled = compile_with_plan(f, "default")
    for got, expected in zip(compiled(a, b, c), f(a, b, c)):
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()


def test_a_view_that_a_part_of_the_buffer_cannot_give_keeps_its_cat():
    """``flat`` is a view of the contiguous first cat; a part of the shared buffer is strided and
    cannot be viewed flat, so the first cat is not shared, and the result is still eager's."""
    def f(a, b, c):
        first = torch.cat([a, b], 1)
        flat = first.view(-1).sin().view(4, 5)
        second = torch.cat([a, b, flat[:, :1] * c], 1)
        third = torch.cat([a, b, flat[:, :1] * c, c], 1)
        return (second.cos() + 1).sum(1), third.exp()

    a, b, c = torch.randn(4, 3), torch.randn(4, 2), torch.randn(4, 1)
    compiled = compile_with_plan(f, "default")
    for got, expected in zip(compiled(a, b, c), f(a, b, c)):
        torch.testing.assert_close(got, expected)


@st.composite
def cat_chains(draw):
    """A function building a chain of concatenations along one dim, each piece a function of the
    previous concatenation (or an input), with a random layout and random cats returned."""
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 5)) for _ in range(rank)]
    dim = draw(st.integers(0, rank - 1))
    widths = [draw(st.integers(0, 4)) for _ in range(draw(st.integers(2, 6)))]
    widths[0] = max(widths[0], 1)
    returned = [draw(st.booleans()) for _ in widths]
    ops = [draw(st.sampled_from(["sin", "neg", "exp", "input"])) for _ in widths]
    order = list(range(rank))
    if rank > 1 and draw(st.booleans()):
        order = draw(st.permutations(range(rank)))

    def make(width: int, generator: torch.Generator) -> torch.Tensor:
        sizes = list(shape)
        sizes[dim] = width
        permuted = [sizes[i] for i in order]
        return torch.randn(permuted, generator=generator).permute(*[order.index(i) for i in range(rank)])

    def fn(*inputs):
        pieces, outputs = [inputs[0]], []
        cat = torch.cat(pieces, dim)
        for index, (width, op) in enumerate(zip(widths[1:], ops[1:]), 1):
            if op == "input" or width == 0:
                piece = inputs[index]
            else:
                piece = getattr(torch, op)(cat.narrow(dim, 0, 1).expand(*[width if d == dim else -1
                                                                         for d in range(rank)]))
            pieces.append(piece)
            if returned[index - 1]:
                outputs.append(cat)
            cat = torch.cat(pieces, dim) * 1.0 if index % 2 else torch.cat(pieces, dim)
        return (*outputs, cat.cos())

    def inputs(seed: int) -> list:
        generator = torch.Generator().manual_seed(seed)
        return [make(w if i else widths[0], generator) for i, w in enumerate(widths)]

    return fn, inputs


@FAST
@given(cat_chains())
def test_chains_of_concatenations_match_eager(chain):
    fn, inputs = chain
    torch._dynamo.reset()       # every example compiles its own static graph
    assert_preserves_semantics("default", fn, inputs(0))
