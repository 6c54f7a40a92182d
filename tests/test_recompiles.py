"""Recompiles as torch.compile users expect them: hitting the recompile limit under the general
plans warns and runs new variants eagerly (a recorded fallback), serving plans can make it an
error, Dynamo's process-wide settings never outlive the call that needed them, each recompile
is recorded with the guard this call broke, and a graph rebuilt from the cache says so."""
from __future__ import annotations

import warnings

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.tools.report import build_report
from pipeline.tools.report_html import render_html


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Indexed(torch.nn.Module):
    """Every new value of ``n`` is a new variant: Dynamo guards on the list index."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.table = [float(i) for i in range(40)]

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return self.linear(x) * self.table[n]


@pytest.mark.parametrize("plan", ["default", "debug", "training"])
def test_hitting_the_recompile_limit_warns_and_runs_eagerly_under_the_general_plans(plan):
    model = Indexed()
    compiled = compile_with_plan(model, plan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 21):
            x = torch.randn(n, 8)
            with torch.no_grad():
                assert compare(model(x, n), compiled(x, n)) is None
    limit_warnings = [w for w in caught if "hit its recompile limit" in str(w.message)]
    assert len(limit_warnings) == 1, [str(w.message) for w in caught]
    fallbacks = compilation_of(compiled).summary()["fallbacks"]
    assert len(fallbacks) == 1 and fallbacks[0]["graph"] is None
    assert "recompile limit" in fallbacks[0]["reason"]
    report = build_report(compilation_of(compiled))
    assert report["summary"]["fallbacks"] == 1 and report["fallbacks"] == fallbacks
    assert "hit its recompile limit" in render_html(report)


def test_llm_serving_keeps_the_recompile_limit_an_error():
    capture = pipeline.load_plan("llm-serving").passes[0].options
    assert capture.on_recompile_limit == "error"


def test_a_plan_can_make_the_recompile_limit_an_error():
    model = Indexed()
    compiled = compile_with_plan(model, "default", options={"capture": {"on_recompile_limit": "error"}})
    with pytest.raises(pipeline.RecompileError, match="recompile_limit 8"):
        with torch.no_grad():
            for n in range(1, 21):
                compiled(torch.randn(n, 8), n)


STRICT = {"capture": {"recompile_limit": 3, "on_recompile_limit": "error", "ignore_logging": True,
                      "dict_tag_guards": True}}


def _settings() -> tuple:
    config = torch._dynamo.config
    return (config.recompile_limit, config.fail_on_recompile_limit_hit, config.use_recursive_dict_tags_for_guards,
            set(config.ignore_logging_functions))


@pytest.mark.parametrize("plan", ["default", "training"])
def test_dynamo_settings_do_not_outlive_the_call(plan):
    before = _settings()
    compiled = compile_with_plan(torch.nn.Linear(4, 4), plan, options=STRICT)
    compiled(torch.randn(2, 4)).sum().backward()
    assert _settings() == before


def test_an_unrelated_torch_compile_keeps_dynamos_default_limit_policy():
    model = Indexed()
    compiled = compile_with_plan(model, "default", options=STRICT)
    with torch.no_grad():
        compiled(torch.randn(2, 8), 2)

    def other(x, n):
        return x * [float(i) for i in range(40)][n]

    plain = torch.compile(other, backend="eager", dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in range(1, 20):                   # past Dynamo's limit of 8: eager, no error
            assert compare(other(torch.ones(3), n), plain(torch.ones(3), n)) is None


def test_each_recompile_is_recorded_with_the_guard_this_call_broke():
    def f(x, cache):
        return x.sum() + cache.sum()

    compiled = compile_with_plan(f, "default", options={"capture": {"dynamic": False}})
    for a, b in ((64, 10), (1, 10), (1, 11)):
        compiled(torch.randn(a), torch.randn(b))
    first, second = compilation_of(compiled).recompiles
    assert "'x'" in first and "expected 64, actual 1" in first
    assert "'cache'" in second and "expected 10, actual 11" in second


def test_a_graph_rebuilt_from_the_cache_says_so_in_the_report(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)     # the suite turns the graph cache off
    model = torch.nn.Linear(8, 8)
    for _ in range(2):
        compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)})
        with torch.no_grad():
            compiled(torch.randn(2, 8))
    assert compilation_of(compiled).graphs[0].cache["status"] == "hit"
    html = render_html(build_report(compilation_of(compiled)))
    assert "Rebuilt from the compile cache" in html and "no pass ran" in html
