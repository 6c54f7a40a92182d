"""``pipeline.testing.graphs`` draws a share of large shapes by default (tens of thousands of
elements, odd and prime sizes), so a pass that is wrong only past some size fails a plugin
author's property test at the default example count, whatever ``max_dim`` says."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

import pipeline
from pipeline.testing import SemanticsError, assert_preserves_semantics, graphs
from pipeline.testing.strategies import LARGE_MIN_ELEMENTS

# Hypothesis's default example count, with a fixed sequence of examples so CI sees the same ones.
DEFAULT_COUNT = settings(max_examples=100, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))


class WrongPastAThousand(pipeline.Pass):
    """Scales every floating-point value of more than 1000 elements by 1.5: the kind of mistake a
    rewrite makes when only its path for large tensors (tiles, vector loops, split work) is wrong."""

    name = "wrong-past-a-thousand"
    version = "1"
    requires = frozenset({"functional"})

    def run(self, graph: torch.fx.GraphModule, context: pipeline.PassContext) -> torch.fx.GraphModule:
        for node in list(graph.graph.nodes):
            value = node.meta.get("val")
            if not (node.op == "call_function" and isinstance(value, torch.Tensor)
                    and value.dtype.is_floating_point and value.numel() > 1000):
                continue
            with graph.graph.inserting_after(node):
                wrong = graph.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.5))
            node.replace_all_uses_with(wrong, delete_user_cb=lambda user: user is not wrong)
            wrong.meta = dict(node.meta)
        graph.recompile()
        return graph


@pytest.mark.parametrize("options", [{}, {"max_dim": 6}], ids=["default", "max_dim-6"])
def test_default_strategy_catches_a_pass_that_is_wrong_only_above_a_thousand_elements(options):
    @settings(DEFAULT_COUNT, phases=[Phase.generate], report_multiple_bugs=False)
    @given(graphs(**options))
    def preserves(case):
        assert_preserves_semantics(WrongPastAThousand, case)

    with pytest.raises(SemanticsError, match="pass 'wrong-past-a-thousand' changed the result"):
        preserves()


def drawn_shapes(**options) -> list[tuple[int, ...]]:
    """The shape of the first input of each of 200 cases ``graphs(**options)`` draws."""
    shapes = []

    @settings(DEFAULT_COUNT, max_examples=200)
    @given(graphs(max_ops=1, **options))
    def record(case):
        shapes.append(case.inputs[0].shape)

    record()
    return shapes


def test_default_strategy_draws_a_share_of_large_shapes_whose_sizes_are_all_odd():
    shapes = drawn_shapes()
    large = [s for s in shapes if math.prod(s) >= LARGE_MIN_ELEMENTS]
    assert len(shapes) / 16 <= len(large) <= len(shapes) / 4
    assert all(size % 2 == 1 for shape in large for size in shape), large
    assert max(math.prod(s) for s in large) <= 1 << 16
    assert any(max(s) > 1000 for s in large), large


def test_max_elements_bounds_the_large_shapes():
    shapes = drawn_shapes(max_elements=20_000)
    assert max(math.prod(s) for s in shapes) <= 20_000
    assert any(math.prod(s) >= LARGE_MIN_ELEMENTS for s in shapes)


def test_no_large_shapes_keeps_every_size_within_max_dim():
    assert max(max(s) for s in drawn_shapes(large_shapes=0, max_dim=6)) <= 6


@pytest.mark.parametrize("options, message", [
    ({"large_shapes": 1.5}, r"graphs\(large_shapes=1.5\): a share, from 0 \(never\) to 1 \(always\)"),
    ({"max_elements": 500}, r"graphs\(max_elements=500\): large shapes have at least 10000 elements"),
])
def test_out_of_range_shape_options_are_a_clear_error(options, message):
    @settings(DEFAULT_COUNT, max_examples=1)
    @given(graphs(**options))
    def draw(case):
        pass

    with pytest.raises(ValueError, match=message):
        draw()
