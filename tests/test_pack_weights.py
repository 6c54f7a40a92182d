"""``pack-weights``: fp32 CPU linear layers multiply by a kept MKL-packed copy of their weight,
packed again whenever the weight changes, never for tensors that are not parameters, and results
always match eager. The pass is on in ``cpu-inference`` and off in every other built-in plan."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import passes.pack_weights as pw
from pipeline import compilation_of, compile_report, compile_with_plan
from pipeline.numerics import compare

pytestmark = pytest.mark.skipif(not pw.mkl_packing_available(), reason="this torch build has no MKL")


@pytest.fixture()
def calls(monkeypatch):
    """Every PackedLinear object called, in order of first call."""
    seen: list = []
    original = pw.PackedLinear.__call__

    def spy(self, *args):
        if self not in seen:
            seen.append(self)
        return original(self, *args)

    monkeypatch.setattr(pw.PackedLinear, "__call__", spy)
    torch._dynamo.reset()
    return seen


def two_layers(width: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, width), torch.nn.ReLU(), torch.nn.Linear(width, 48)).eval()


def check(compiled, model, *args) -> None:
    with torch.no_grad():
        problem = compare(model(*args), compiled(*args))
    assert problem is None, problem


def test_each_linear_layer_packs_its_weight_once(calls):
    model, x = two_layers(), torch.randn(256, 48)
    compiled = compile_with_plan(model, "cpu-inference", report=True)
    for _ in range(3):
        check(compiled, model, x)
    assert len(calls) == 2 and [c.packings for c in calls] == [1, 1]
    notes = [n["message"] for g in compile_report(compiled)["graphs"] for n in g["notes"]
             if n["pass"] == "pack-weights"]
    assert len(notes) == 2 and all("MKL-packed copy" in n and "(256 rows)" in n for n in notes)


def test_results_are_bit_identical_to_eager():
    """MKL's packed GEMM runs the same blocked kernel as its sgemm on the repacked view."""
    model, x = two_layers(256), torch.randn(128, 48)
    compiled = compile_with_plan(model, "cpu-inference")
    with torch.no_grad():
        assert torch.equal(model(x), compiled(x))


@pytest.mark.parametrize("change", ["add_", "copy_", "data", "new parameter"])
def test_a_changed_weight_is_packed_again(calls, change):
    model, x = two_layers(), torch.randn(256, 48)
    compiled = compile_with_plan(model, "cpu-inference")
    check(compiled, model, x)
    with torch.no_grad():
        if change == "add_":                       # an optimizer step updates in place
            model[0].weight.add_(0.5)
        elif change == "copy_":
            model[0].weight.copy_(torch.randn(64, 48))
        elif change == "data":                     # same Parameter object, other storage
            model[0].weight.data = torch.randn(64, 48)
        else:                                      # another Parameter object of the same shape
            model[0].weight = torch.nn.Parameter(torch.randn(64, 48))
    check(compiled, model, x)
    assert calls[0].packings == 2 and calls[1].packings == 1


def test_a_weight_passed_as_an_argument_is_never_packed(calls):
    def project(x, w, b):
        return F.linear(x, w, b).relu()

    compiled = compile_with_plan(project, "cpu-inference")
    for _ in range(3):                            # a new weight every call
        args = (torch.randn(256, 48), torch.randn(64, 48), torch.randn(64))
        check(compiled, project, *args)
    assert calls and all(c.packings == 0 for c in calls)


def test_matmuls_below_min_flops_are_left_alone(calls):
    model = two_layers()                          # 2 x 8 x 48 x 64 flops each: far below the default
    check(compile_with_plan(model, "cpu-inference"), model, torch.randn(8, 48))
    assert calls == []


def test_it_is_off_in_the_default_plan(calls):
    model = two_layers()
    check(compile_with_plan(model, "default"), model, torch.randn(256, 48))
    assert calls == []


def test_training_graphs_are_left_alone(calls):
    model = two_layers().train()
    compiled = compile_with_plan(model, {"extends": "training", "options": {"pack-weights": {"enabled": True}}})
    compiled(torch.randn(256, 48)).sum().backward()
    assert calls == []


def test_a_linear_layer_sharing_its_weight_shares_one_packing(calls):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.proj(self.proj(x).relu())

    torch.manual_seed(0)
    model, x = Tied().eval(), torch.randn(256, 64)
    compiled = compile_with_plan(model, "cpu-inference")
    check(compiled, model, x)
    check(compiled, model, x)
    assert len(calls) == 2 and calls[0]._packing is calls[1]._packing and calls[0].packings == 1


def test_a_compiled_graph_loaded_from_the_cache_packs_on_its_first_call(tmp_path, calls, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)      # the test session turns graph caching off
    model, x = two_layers(), torch.randn(256, 48)
    plan = {"extends": "cpu-inference", "cache": {"dir": str(tmp_path)}}
    check(compile_with_plan(model, plan), model, x)
    torch._dynamo.reset()
    calls.clear()
    compiled = compile_with_plan(model, plan)
    check(compiled, model, x)
    assert [c.packings for c in calls] == [1, 1]
    assert [g.cache["status"] for g in compilation_of(compiled).graphs] == ["hit"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 300), inner=st.integers(1, 70), outer=st.integers(1, 70), bias=st.booleans(),
       updates=st.integers(0, 2))
def test_property_results_match_eager_through_weight_updates(rows, inner, outer, bias, updates):
    torch._dynamo.reset()
    model = torch.nn.Linear(inner, outer, bias=bias).eval()
    plan = {"extends": "cpu-inference", "options": {"pack-weights": {"min_flops": 0}}}
    compiled = compile_with_plan(model, plan)
    x = torch.randn(rows, inner)
    for _ in range(updates + 1):
        check(compiled, model, x)
        with torch.no_grad():
            model.weight.mul_(-1.5)
