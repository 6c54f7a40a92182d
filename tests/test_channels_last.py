"""channels-last: convolutions and the work between them in channels-last layout, results and
output layouts as eager's (tested on CPU, where the pass is opt-in)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passes.channels_last import ChannelsLast, ChannelsLastOptions
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.testing import assert_preserves_semantics

ON_CPU = {"extends": "default", "options": {"channels-last": {"devices": ["cpu"], "decide": "always"}}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


class Block(torch.nn.Module):
    """conv -> norm -> activation (-> + residual), a U-Net / ResNet-style unit."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, norm: str, depthwise: bool) -> None:
        super().__init__()
        groups = cin if depthwise and cin == cout else 1
        self.conv = torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups)
        self.norm = {"group": torch.nn.GroupNorm(4, cout), "batch": torch.nn.BatchNorm2d(cout),
                     "none": torch.nn.Identity()}[norm]
        self.residual = cin == cout and stride == 1

    def forward(self, x):
        y = torch.nn.functional.silu(self.norm(self.conv(x)))
        return y + x if self.residual else y


def _net(blocks: list, head: str) -> torch.nn.Module:
    body = torch.nn.Sequential(*blocks)
    if head == "pool":
        return torch.nn.Sequential(body, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    if head == "flatten":
        return torch.nn.Sequential(body, torch.nn.Flatten())
    return body


@st.composite
def conv_nets(draw):
    cin = draw(st.sampled_from([3, 16]))
    blocks, channels = [], cin
    for _ in range(draw(st.integers(1, 3))):
        cout = draw(st.sampled_from([16, 24] + ([channels] if channels % 4 == 0 else [])))
        blocks.append(Block(channels, cout, draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2])),
                            draw(st.sampled_from(["group", "batch", "none"])), draw(st.booleans())))
        channels = cout
    size = draw(st.sampled_from([5, 8, 12]))
    return _net(blocks, draw(st.sampled_from(["pool", "flatten", "none"]))).eval(), (draw(st.integers(1, 2)), cin,
                                                                                       size, size)


@settings(max_examples=20, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(conv_nets())
def test_channels_last_preserves_semantics(case):
    net, shape = case
    with torch.no_grad():
        assert_preserves_semantics(ChannelsLast(ChannelsLastOptions(devices=["cpu"], min_channels=1)), net,
                                   [torch.randn(shape)])


def test_a_convolution_net_runs_channels_last_and_returns_eagers_layout():
    net = _net([Block(16, 32, 3, 1, "group", False), Block(32, 32, 3, 1, "group", False),
                Block(32, 32, 3, 2, "batch", True)], "none").eval()
    compiled = compile_with_plan(net, ON_CPU, report=True)
    with torch.no_grad():
        for size in (8, 12):
            x = torch.randn(2, 16, size, size)
            expected, actual = net(x), compiled(x)
            assert compare(expected, actual) is None
            assert actual.stride() == expected.stride()
    (record,) = compilation_of(compiled).graphs[:1]
    notes = [n["message"] for n in record.notes if n["pass"] == "channels-last"]
    assert notes and notes[0].startswith("3 convolution(s) channels-last")


def test_a_channels_last_model_is_left_as_it_is():
    net = _net([Block(16, 32, 3, 1, "group", False)], "none").eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    compiled = compile_with_plan(net, ON_CPU, report=True)
    with torch.no_grad():
        assert compare(net(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs
    assert not [n for n in record.notes if n["pass"] == "channels-last"]


def _measured_notes(net: torch.nn.Module, x: torch.Tensor) -> list[str]:
    compiled = compile_with_plan(net, {"extends": "default", "options": {"channels-last": {"devices": ["cpu"]}}},
                                 report=True)
    with torch.no_grad():
        expected, actual = net(x), compiled(x)
    assert compare(expected, actual) is None and actual.stride() == expected.stride()
    (record,) = compilation_of(compiled).graphs
    return [n["message"] for n in record.notes if n["pass"] == "channels-last"]


def _mobile_unit() -> torch.nn.Module:
    """1x1 expand, 3x3 depthwise, 1x1 project, and the same again: four distinct convolutions of six."""
    unit = [Block(16, 64, 1, 1, "batch", False), Block(64, 64, 3, 1, "batch", True),
            Block(64, 16, 1, 1, "batch", False)]
    return _net(unit + [Block(16, 64, 1, 1, "batch", False), Block(64, 64, 3, 1, "batch", True),
                        Block(64, 24, 1, 1, "batch", False)], "none").eval()


@pytest.mark.parametrize("as_is, channels_last, converted", [(1.0, 2.0, False), (1.0, 0.97, False),
                                                              (1.0, 0.9, True)])
def test_measured_convolutions_decide_the_layout(monkeypatch, as_is, channels_last, converted):
    import passes.channels_last as module
    monkeypatch.setattr(module, "_measured", lambda convs: (as_is * 1e-3, channels_last * 1e-3, 4))
    notes = _measured_notes(_mobile_unit(), torch.randn(1, 16, 6, 6))
    timed = f"4 distinct convolution(s) timed: {as_is:.3f} ms as they are, {channels_last:.3f} ms channels-last"
    if converted:
        assert notes == [timed, "6 convolution(s) channels-last: 1 layout copies, 0 view(s) through a contiguous "
                                "copy, 1 output(s) restored"]
    else:
        assert notes == [f"convolutions kept in their layout: {timed}"]


def test_distinct_convolutions_are_timed_once_each_on_real_tensors():
    from passes.channels_last import _measured
    from pipeline.testing import prelude_for, run_passes

    conv = torch.ops.aten.convolution.default

    def fn(x, expand, depthwise, project):
        y = conv(x, expand, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1).relu()
        y = conv(y, depthwise, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 64).relu()
        z = conv(x, expand, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)     # the first one again
        return conv(y + z, project, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)

    inputs = [torch.randn(1, 16, 6, 6), torch.randn(64, 16, 1, 1), torch.randn(64, 1, 3, 3),
              torch.randn(16, 64, 1, 1)]
    layout = ChannelsLast(ChannelsLastOptions(devices=["cpu"]))
    graph = run_passes(prelude_for(layout), torch.fx.symbolic_trace(fn), inputs)
    convs = [n for n in graph.graph.nodes if n.target is conv]
    as_is, channels_last, distinct = _measured(convs)
    assert (len(convs), distinct) == (4, 3)
    assert 0 < as_is < 1 and 0 < channels_last < 1


def test_narrow_convolutions_keep_their_layout():
    net = _net([Block(3, 8, 3, 1, "none", False)], "pool").eval()
    compiled = compile_with_plan(net, ON_CPU, report=True)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert compare(net(x), compiled(x)) is None
    (record,) = compilation_of(compiled).graphs
    assert any("none has 16 channels" in n["message"] for n in record.notes if n["pass"] == "channels-last")


def test_a_graph_reading_a_changed_layout_through_as_strided_is_left_alone():
    from pipeline.testing import prelude_for, run_passes

    def fn(x, w):
        y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return torch.ops.aten.as_strided.default(y.relu(), [2, 16], [1, 2])

    inputs = [torch.randn(2, 16, 6, 6), torch.randn(16, 16, 3, 3)]
    layout = ChannelsLast(ChannelsLastOptions(devices=["cpu"]))
    before = run_passes(prelude_for(layout), torch.fx.symbolic_trace(fn), inputs)
    after = run_passes([layout], before, inputs)
    assert "as_strided" in before.code and "channels_last" not in after.code
    assert compare(fn(*inputs), after(*inputs)) is None


def test_a_cpp_kernel_writing_channels_last_loops_over_channels_innermost():
    """An elementwise kernel loops in its first output's memory order: a channels-last output is
    stored contiguously (the innermost loop runs over the 24 channels, H and W merged outside)."""
    from pipeline import compile_report

    def fn(x):
        return (x * 2 + 1).contiguous(memory_format=torch.channels_last)

    x = torch.randn(2, 24, 5, 7)
    compiled = compile_with_plan(fn, "cpu-inference", report=True)
    out = compiled(x)
    assert compare(fn(x), out) is None and out.stride() == fn(x).stride()
    (source,) = [k["source"] for g in compile_report(compiled)["graphs"] for k in g["kernels"]]
    assert "i2 < INT64_C(24)" in source and "o / INT64_C(35)" in source


@pytest.mark.parametrize("shape, groups", [((2, 24, 5, 7), 4), ((3, 12, 4, 4), 3)])
def test_a_cpp_reduction_over_a_channels_last_image_walks_channels_innermost(shape, groups):
    """A group norm of a channels-last image reduces each group's channels and pixels: the reduced
    loops run in memory order (pixels outside, the group's channels innermost at unit stride) and
    the result matches eager."""
    from pipeline import compile_report

    def fn(x, w, b):
        return torch.nn.functional.group_norm(x, groups, w, b).relu()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1], generator=generator), torch.randn(shape[1], generator=generator)
    compiled = compile_with_plan(fn, "cpu-inference", report=True)
    assert compare(fn(x, w, b), compiled(x, w, b)) is None
    sources = [k["source"] for g in compile_report(compiled)["graphs"] for k in g["kernels"] if k["reduced"]]
    per_group = shape[1] // groups
    assert sources and all(f"i3 < INT64_C({per_group})" in s and "+ i3]" in s for s in sources), sources


def test_calls_are_timed_in_turn_each_per_call():
    import time

    from passes.timing import fastest_per_call

    slow, fast = fastest_per_call([lambda: time.sleep(0.002), lambda: None], torch.device("cpu"), rounds=3)
    assert 0.002 <= slow < 0.05 and fast < 0.0005
