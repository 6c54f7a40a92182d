"""``pipeline.explain(model, *inputs, plan=...)``: graph count, graph breaks with reasons and source
lines, kernels, extern calls, recompiles seen and the input changes that would recompile."""
from __future__ import annotations

import pytest
import torch

import pipeline


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def branchy(x):
    y = torch.softmax(x, -1) * 2
    if y.sum().item() > 0:
        return y.cos()
    return y.tanh()


def test_explain_counts_graphs_and_names_each_break_with_its_line():
    explanation = pipeline.explain(branchy, torch.randn(16))
    assert explanation.graph_count == 2
    (brk,) = explanation.graph_breaks
    assert brk["file"].endswith("test_explain.py") and brk["code"] == "if y.sum().item() > 0:"
    assert "data-dependent branching" in explanation.break_reasons[0].lower()


def test_explain_lists_kernels_and_extern_calls():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    with torch.no_grad():
        explanation = pipeline.explain(model, torch.randn(4, 8))
    assert [k["kernel"] for k in explanation.kernels] == ["cpp_fused_0"]
    assert any(op.startswith("aten.") for op in explanation.extern_calls)
    assert explanation.graph_breaks == []


def test_explain_says_which_input_changes_recompile():
    static = pipeline.explain(lambda x, n: x * n, torch.randn(16), 3,
                              overrides={"options": {"capture": {"dynamic": False}}})
    assert any("L['x'] with a shape other than [16]" in text for text in static.expected_recompiles)
    assert any("L['n'] with another value" in text for text in static.expected_recompiles)
    dynamic = pipeline.explain(lambda x: x * 3, torch.randn(16), overrides={"options": {"capture": {"dynamic": True}}})
    assert any("L['x'] with another dtype" in text and "dynamic" in text for text in dynamic.expected_recompiles)


def test_explain_text_is_a_readable_summary():
    text = str(pipeline.explain(branchy, torch.randn(16)))
    assert text.splitlines()[0] == "plan 'default': 2 graph(s), 1 graph break(s), 2 kernel(s), 0 recompile(s)"
    assert "break 1 at " in text and "would recompile:" in text


def test_explain_report_is_the_full_compile_report():
    explanation = pipeline.explain(branchy, torch.randn(16), plan="debug")
    assert explanation.report["plan"]["name"] == "debug"
    assert all(g["sources"] for g in explanation.report["graphs"])


def test_explain_passes_keyword_inputs_to_the_model():
    class Keyworded(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return input_ids.float() * attention_mask

    ids, mask = torch.randint(0, 9, (2, 8)), torch.ones(2, 8)
    explanation = pipeline.explain(Keyworded(), input_ids=ids, attention_mask=mask)
    assert explanation.graph_count == 1
    debug = pipeline.explain(Keyworded(), input_ids=ids, attention_mask=mask, overrides={"verify": "final"})
    assert debug.report["graphs"][0]["verified"].startswith("passed")
