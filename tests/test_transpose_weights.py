"""``transpose-weights``: small-batch CPU matmuls read a kept row-major copy of their transposed
weight, made again whenever the weight changes, never for tensors that are not parameters, and
results always match eager. The pass is off unless a plan enables it (see its docstring for why)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import passes.transpose_weights as tw
from pipeline import compile_report, compile_with_plan
from pipeline.numerics import compare


@pytest.fixture()
def calls(monkeypatch):
    """Every TransposedWeight object called, in order of first call."""
    seen: list = []
    original = tw.TransposedWeight.__call__

    def spy(self, weight):
        if self not in seen:
            seen.append(self)
        return original(self, weight)

    monkeypatch.setattr(tw.TransposedWeight, "__call__", spy)
    torch._dynamo.reset()
    return seen


# pack-weights (on in cpu-inference) would take the same matmuls first.
PLAN = {"extends": "cpu-inference", "options": {"pack-weights": {"enabled": False}, "transpose-weights": {"enabled": True}}}


def two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()


def check(compiled, model, *args) -> None:
    with torch.no_grad():
        problem = compare(model(*args), compiled(*args))
    assert problem is None, problem


def test_a_linear_layer_reads_one_copy_made_once(calls):
    model, x = two_layers(), torch.randn(32, 48)
    compiled = compile_with_plan(model, PLAN, report=True)
    for _ in range(3):
        check(compiled, model, x)
    assert len(calls) == 2 and [c.copies for c in calls] == [1, 1]
    notes = [n["message"] for g in compile_report(compiled)["graphs"] for n in g["notes"]
             if n["pass"] == "transpose-weights"]
    assert len(notes) == 2 and all("kept copy" in n for n in notes)


@pytest.mark.parametrize("change", ["add_", "copy_", "data", "new parameter"])
def test_a_changed_weight_is_copied_again(calls, change):
    model, x = two_layers(), torch.randn(8, 48)
    compiled = compile_with_plan(model, PLAN)
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
    assert calls[0].copies == 2 and calls[1].copies == 1


def test_a_weight_passed_as_an_argument_is_never_copied(calls):
    def project(x, w, b):
        return F.linear(x, w, b).relu()

    compiled = compile_with_plan(project, PLAN)
    for _ in range(3):                            # a new weight every call
        args = (torch.randn(8, 48), torch.randn(16, 48), torch.randn(16))
        check(compiled, project, *args)
    assert calls and all(c.copies == 0 for c in calls)


def test_matmuls_with_more_rows_than_max_rows_read_the_view(calls):
    model = two_layers()
    compiled = compile_with_plan(model, {"extends": "cpu-inference",
                                         "options": {"pack-weights": {"enabled": False},
                                                     "transpose-weights": {"enabled": True, "max_rows": 16}}})
    check(compiled, model, torch.randn(32, 48))
    assert calls == []


def test_it_is_off_by_default(calls):
    model = two_layers()
    check(compile_with_plan(model, "cpu-inference"), model, torch.randn(8, 48))
    assert calls == []


def test_training_graphs_are_left_alone(calls):
    model = two_layers().train()
    compiled = compile_with_plan(model, {"extends": "training", "options": {"transpose-weights": {"enabled": True}}})
    x = torch.randn(8, 48)
    compiled(x).sum().backward()
    assert calls == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 300), inner=st.integers(1, 70), outer=st.integers(1, 70), bias=st.booleans(),
       updates=st.integers(0, 2))
def test_property_results_match_eager_through_weight_updates(rows, inner, outer, bias, updates):
    torch._dynamo.reset()
    model = torch.nn.Linear(inner, outer, bias=bias).eval()
    compiled = compile_with_plan(model, PLAN)
    x = torch.randn(rows, inner)
    for _ in range(updates + 1):
        check(compiled, model, x)
        with torch.no_grad():
            model.weight.mul_(-1.5)
