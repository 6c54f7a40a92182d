"""A plan's ``expect:`` is checked after every call that compiled something: a miss fails the
call (or warns, with ``on_miss: warn``) with a message naming the expectation, its limit and the
value the compile measured."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import pipeline
from sample_functions import branchy


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def scaled(x):
    return torch.softmax(x * 2, dim=-1)


def calls(compiled, *sizes):
    for size in sizes:
        compiled(torch.randn(size, 8))


@pytest.mark.parametrize("expect, fn, sizes, message", [
    ({"max_graph_breaks": 0}, branchy, (4,), "expect.max_graph_breaks is 0 but the compile measured 1"),
    ({"max_kernels": 0}, scaled, (4,), "expect.max_kernels is 0 but the compile measured 1"),
    ({"max_recompiles": 0}, scaled, (4, 6), "expect.max_recompiles is 0 but the compile measured 1"),
    ({"max_compile_seconds": 1e-6}, scaled, (4,), "expect.max_compile_seconds is 1e-06 but the compile measured "),
    ({"cudagraphs": "full"}, scaled, (4,), "expect.cudagraphs is 'full' but 0 of 1 graphs run under CUDA graphs"),
], ids=["max_graph_breaks", "max_kernels", "max_recompiles", "max_compile_seconds", "cudagraphs"])
def test_missed_expectation_fails_the_call_naming_it_and_the_measured_value(expect, fn, sizes, message):
    compiled = pipeline.compile_with_plan(fn, "default", expect=expect, options={"capture": {"dynamic": False}})
    with pytest.raises(pipeline.ExpectationError) as info:
        calls(compiled, *sizes)
    assert message in str(info.value)
    assert str(info.value).startswith("plan 'default' (")


def test_measured_compile_seconds_is_the_compile_time_in_the_message():
    compiled = pipeline.compile_with_plan(scaled, "default", expect={"max_compile_seconds": 1e-6})
    with pytest.raises(pipeline.ExpectationError) as info:
        calls(compiled, 4)
    measured = float(re.search(r"measured ([0-9.e-]+)", str(info.value)).group(1))
    assert measured == round(pipeline.compilation_of(compiled).compile_seconds, 3) > 0


def test_expectations_met_let_the_call_through():
    compiled = pipeline.compile_with_plan(branchy, "default",
                                          expect={"max_graph_breaks": 1, "max_kernels": 10, "max_recompiles": 0})
    x = torch.randn(8)
    assert torch.allclose(compiled(x), branchy(x))


def test_a_plan_file_expectation_names_the_file_and_can_warn(tmp_path):
    plan = tmp_path / "strict.yaml"
    plan.write_text("name: strict\nextends: default\nexpect:\n  max_kernels: 0\n  on_miss: warn\n")
    compiled = pipeline.compile_with_plan(scaled, str(plan))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls(compiled, 4)
    messages = [str(w.message) for w in caught if "expect." in str(w.message)]
    assert messages == [f"plan 'strict' ({plan}): expect.max_kernels is 0 but the compile measured 1"]


def test_expectations_are_checked_again_only_after_a_new_compile():
    compiled = pipeline.compile_with_plan(scaled, "default", expect={"max_recompiles": 0, "on_miss": "warn"},
                                          options={"capture": {"dynamic": False}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls(compiled, 4, 6, 6, 6)
    assert sum("max_recompiles" in str(w.message) for w in caught) == 1


def test_a_graph_break_before_any_graph_is_recorded_and_checked():
    """Dynamo compiles no graph for a function that breaks at its first operation: the break is
    still recorded, and an expectation on it still fails."""
    def scalar(x):
        return x.item() + 1

    no_scalars = {"capture": {"data_dependent": False}}     # item() breaks the graph
    compiled = pipeline.compile_with_plan(scalar, "default", options=no_scalars)
    assert compiled(torch.tensor(2.0)) == 3.0
    record = pipeline.compilation_of(compiled)
    assert not record.graphs and any("item()" in b for b in record.graph_breaks)
    strict = pipeline.compile_with_plan(scalar, "default", expect={"max_graph_breaks": 0}, options=no_scalars)
    with pytest.raises(pipeline.ExpectationError, match="max_graph_breaks"):
        strict(torch.tensor(2.0))


def test_the_summary_names_each_registered_metric_per_graph():
    compiled = pipeline.compile_with_plan(scaled, "default")
    compiled(torch.randn(4))
    summary = pipeline.compilation_of(compiled).summary()
    for name in pipeline.get_registry().metrics:
        assert all(name in g and g[name] == g["metrics"][name] for g in summary["graphs"])
    assert sum(g["kernels"] for g in summary["graphs"]) >= 1
