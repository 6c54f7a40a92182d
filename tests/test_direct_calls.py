"""Direct calls (``capture.direct_calls``): a call whose guards pass runs Dynamo's cached code
without Dynamo's per-call wrappers; everything else goes through Dynamo, and either way the
result is eager's."""
from __future__ import annotations

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare

STATIC = {"options": {"capture": {"dynamic": False}}}


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.tanh(self.b(torch.relu(self.a(x)))) * 2


def counts(compiled) -> dict:
    return compilation_of(compiled).runtime["direct_calls"].counts()


def test_calls_after_the_first_run_directly_and_match_eager():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    for _ in range(4):
        x = torch.randn(3, 8)
        assert compare(model(x), compiled(x)) is None
    assert counts(compiled) == {"direct": 3, "through_dynamo": 1}
    assert compilation_of(compiled).summary()["calls"] == {"direct_calls": {"direct": 3, "through_dynamo": 1}}


def test_a_new_shape_goes_through_dynamo_then_both_variants_run_directly():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    shapes = [(3, 8), (5, 8), (3, 8), (5, 8)]
    for shape in shapes:
        x = torch.randn(*shape)
        assert compare(model(x), compiled(x)) is None
    assert len(compilation_of(compiled).recompiles) == 1
    assert counts(compiled) == {"direct": 2, "through_dynamo": 2}


def test_sizes_of_an_older_entry_and_of_the_dynamic_one_alternate_directly_and_match_eager():
    """Size 1 keeps its own entry beside the dynamic graph (Dynamo specializes 0 and 1); the
    direct path tries the entry its previous call ran first, and any passing entry is valid."""
    model = TwoLayers()
    compiled = compile_with_plan(model, "default")
    with torch.no_grad():
        for batch in (1, 2, 3):                 # size 1, then a size change: one dynamic graph
            compiled(torch.randn(batch, 8))
        before = counts(compiled)
        for batch in (1, 1, 5, 1, 7, 7, 1):
            x = torch.randn(batch, 8)
            assert compare(model(x), compiled(x)) is None
    after = counts(compiled)
    assert after["through_dynamo"] == before["through_dynamo"] and after["direct"] == before["direct"] + 7
    assert len(compilation_of(compiled).graphs) == 2


def test_grad_mode_is_guarded_so_each_mode_runs_its_own_variant():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        assert not compiled(x).requires_grad
    out = compiled(x)
    assert out.requires_grad
    out.sum().backward()
    expected = model.a.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    assert compare(model.a.weight.grad, expected) is None
    compiled(x).sum().backward()     # the training variant, now run directly
    assert counts(compiled)["direct"] >= 2


def test_parameters_are_read_at_each_call():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        model.a.weight.mul_(-1)
        assert compare(model(x), compiled(x)) is None
        model.b.weight = torch.nn.Parameter(torch.randn(4, 16))   # a new tensor of the same shape
        assert compare(model(x), compiled(x)) is None
    assert counts(compiled)["direct"] == 2


def test_force_eager_goes_through_dynamo_and_compiles_nothing_new():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    x = torch.randn(3, 8)
    compiled(x)
    with pipeline.stance("force_eager"):
        y = torch.randn(6, 8)     # a new shape: eager, no recompile
        assert compare(model(y), compiled(y)) is None
        assert compare(model(x), compiled(x)) is None
    assert counts(compiled) == {"direct": 0, "through_dynamo": 3}
    assert compilation_of(compiled).recompiles == []


def test_fail_on_recompile_keeps_direct_calls_for_compiled_shapes():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    compiled(torch.randn(3, 8))
    with pipeline.stance("fail_on_recompile"):
        compiled(torch.randn(3, 8))
        with pytest.raises(pipeline.RecompileError):
            compiled(torch.randn(7, 8))
    assert counts(compiled)["direct"] == 1


def test_a_graph_break_turns_direct_calls_off():
    def with_break(x):
        y = x.sin()
        if y.sum().item() > 0:    # a graph break
            return y * 2
        return y - 1
    compiled = compile_with_plan(with_break, "default", **STATIC)
    for _ in range(3):
        x = torch.randn(16)
        assert compare(with_break(x), compiled(x)) is None
    assert compilation_of(compiled).graph_breaks
    assert counts(compiled)["direct"] == 0


def test_a_graph_break_with_grad_enabled_keeps_no_grad_calls_direct():
    """Dynamo guards its cache entries on the grad mode: an inference model called once with grad
    enabled, where the graph breaks (a library's backward formula, say), keeps running its whole
    no-grad graph directly."""
    def breaks_with_grad(x):
        y = x.sin() * 2
        if torch.is_grad_enabled():
            torch._dynamo.graph_break()
        return y + 1
    compiled = compile_with_plan(breaks_with_grad, "default", **STATIC)
    x = torch.randn(16)
    with torch.no_grad():
        for _ in range(2):
            assert compare(breaks_with_grad(x), compiled(x)) is None
    assert counts(compiled)["direct"] == 1
    assert compare(breaks_with_grad(x), compiled(x)) is None          # grad enabled: a graph break
    assert compilation_of(compiled).graph_breaks
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(16)
            assert compare(breaks_with_grad(x), compiled(x)) is None
    assert counts(compiled)["direct"] == 4
    direct = counts(compiled)["direct"]
    assert compare(breaks_with_grad(x), compiled(x)) is None          # grad enabled: through Dynamo
    assert counts(compiled)["direct"] == direct


def test_code_with_resume_functions_is_never_run_directly():
    """Even where no graph break was recorded, an entry whose code continues in a resume function
    (which only Dynamo's frame hook compiles) is left to Dynamo."""
    from pipeline import compat

    def branchy(x):
        y = x.sin()
        if y.sum() > 0:
            return y * 2
        return y - 1

    def backend(gm, example_inputs):
        return gm.forward
    compiled = torch.compile(branchy, backend=backend)
    direct = compat.DirectCall(branchy, backend)            # allowed() always says yes here
    x = torch.randn(16)
    compiled(x)
    assert direct((x,), {}) is compat.MISS
    assert direct.counts() == {"direct": 0, "through_dynamo": 1}


def test_functions_with_defaults_and_keyword_arguments():
    def scaled(x, y=None, *, shift=1.0):
        return x * 2 + (y if y is not None else 0) + shift
    compiled = compile_with_plan(scaled, "default", **STATIC)
    x, y = torch.randn(5), torch.randn(5)
    calls = [((x,), {}), ((x,), {}), ((x, y), {}), ((x, y), {}), ((x,), {"shift": 3.0}), ((x,), {"shift": 3.0})]
    for args, kwargs in calls:
        assert compare(scaled(*args, **kwargs), compiled(*args, **kwargs)) is None
    assert counts(compiled)["direct"] == 3


def test_called_inside_another_compiled_function_it_goes_through_dynamo():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", **STATIC)
    x = torch.randn(3, 8)
    compiled(x)

    def outer(x):
        return compiled(x) + 1
    result = torch.compile(outer, backend="eager")(x)
    assert compare(model(x) + 1, result) is None


def test_the_plan_can_turn_direct_calls_off():
    model = TwoLayers()
    compiled = compile_with_plan(model, "default", options={"capture": {"dynamic": False, "direct_calls": False}})
    x = torch.randn(3, 8)
    compiled(x)
    assert compare(model(x), compiled(x)) is None
    assert "direct_calls" not in compilation_of(compiled).runtime


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = TwoLayers()
        self.scale = 2.0

    def forward(self, x):
        return self.inner(x) * self.scale


def test_changed_module_attributes_are_seen_with_dictionary_tag_guards():
    model = Scaled()
    compiled = compile_with_plan(model, "default", **STATIC)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        model.scale = 3.0                                  # a float the graph specialized on
        assert compare(model(x), compiled(x)) is None
        model.inner.b.bias.zero_()                          # a parameter changed in place
        assert compare(model(x), compiled(x)) is None
        model.inner.a = torch.nn.Linear(8, 16)              # a submodule replaced
        assert compare(model(x), compiled(x)) is None
