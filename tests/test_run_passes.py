"""``pipeline.testing.run_passes`` runs passes the way the engine does, and the graph it returns
remembers the invariant tags they left, so a second call on it continues where the first stopped
(the plugin guide's ``prelude_for`` then ``run_passes`` example)."""
from __future__ import annotations

import pytest
import torch

from pipeline.errors import PassFailure
from pipeline.testing import prelude_for, run_passes, tags_of

REWRITES = ("cse", "reinplace")


def twice_sine(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.sin(x)


@pytest.fixture
def traced() -> tuple[torch.fx.GraphModule, list]:
    return torch.fx.symbolic_trace(twice_sine), [torch.randn(8)]


@pytest.mark.parametrize("name", REWRITES)
def test_passes_run_on_a_returned_graph_start_from_the_tags_it_remembers(traced, name):
    gm, inputs = traced
    before = run_passes(prelude_for(name), gm, inputs)
    after = run_passes([name], before, inputs)
    out = after(*inputs)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, twice_sine(*inputs))


def test_returned_graph_remembers_what_its_passes_provided_and_invalidated(traced):
    gm, inputs = traced
    functional = run_passes(["functionalize"], gm, inputs)
    assert {"captured", "functional", "aten"} <= tags_of(functional)
    decomposed = run_passes(["decompose", "reinplace"], functional, inputs)
    assert "decomposed" in tags_of(decomposed)
    assert "functional" not in tags_of(decomposed)     # reinplace invalidates it


def test_a_graph_the_helpers_did_not_produce_has_the_tags_of_a_captured_graph(traced):
    gm, inputs = traced
    assert tags_of(gm) == {"captured"}
    with pytest.raises(PassFailure, match="requires functional but the graph test only has captured"):
        run_passes(["cse"], gm, inputs)


def test_a_tags_set_given_is_used_and_updated_in_place(traced):
    gm, inputs = traced
    tags = {"captured"}
    before = run_passes(prelude_for("cse"), gm, inputs, tags=tags)
    assert "functional" in tags
    run_passes(["cse"], before, inputs, tags=tags)
    with pytest.raises(PassFailure, match="requires functional"):
        run_passes(["cse"], before, inputs, tags={"captured"})
