"""``diff_plans(a, b)`` and ``pipeline plan diff A B``: passes added (+), removed (-), reordered
(~ order) and options or settings changed (~ key: old -> new); nothing for equal plans."""
from __future__ import annotations

from pathlib import Path

import attrs
import pytest

import pipeline
from pipeline import load_plan
from pipeline.tools.cli import main
from pipeline.plan.text import diff_plans

REPO = Path(__file__).resolve().parents[1]
BASE = {"name": "p", "passes": ["capture", "functionalize", "decompose", "dce", "cse"]}


def plan(**changes):
    return load_plan({**BASE, **changes})


def test_equal_plans_have_no_differences():
    assert diff_plans(plan(), plan()) == []


def test_plans_differing_only_in_where_they_came_from_have_no_differences():
    assert diff_plans(load_plan("default"), load_plan(load_plan("default").source)) == []


def test_added_pass_is_reported_with_its_position():
    after = plan(passes=["capture", "functionalize", "decompose", "constant-fold", "dce", "cse"])
    assert diff_plans(plan(), after) == ["+ pass constant-fold (at position 3)"]


def test_removed_pass_is_reported_with_its_old_position():
    after = plan(passes=["capture", "functionalize", "decompose", "dce"])
    assert diff_plans(plan(), after) == ["- pass cse (was at position 4)"]


def test_reordered_passes_are_reported_as_an_order_change():
    after = plan(passes=["capture", "functionalize", "decompose", "cse", "dce"])
    assert diff_plans(plan(), after) == [
        "~ order: capture -> functionalize -> decompose -> dce -> cse  "
        "became  capture -> functionalize -> decompose -> cse -> dce"]


def test_removing_one_of_a_repeated_pass_is_not_a_reorder():
    before = plan(passes=["capture", "functionalize", "dce", "cse", "dce"])
    after = plan(passes=["capture", "functionalize", "dce", "cse"])
    assert diff_plans(before, after) == ["- pass dce (was at position 4)"]


def test_removing_passes_from_the_middle_is_not_a_reorder():
    after = plan(passes=["capture", "functionalize", "cse"])
    assert diff_plans(plan(), after) == ["- pass decompose (was at position 2)", "- pass dce (was at position 3)"]


def test_changed_option_is_reported_with_old_and_new_value():
    after = plan(passes=[{"capture": {"fullgraph": True}}, "functionalize", "decompose", "dce", "cse"])
    assert diff_plans(plan(), after) == ["~ capture.fullgraph: false -> true"]


def test_changed_list_option_is_reported():
    after = plan(passes=["capture", "functionalize", {"decompose": {"keep": ["aten.addmm"]}}, "dce", "cse"])
    assert diff_plans(plan(), after) == ["~ decompose.keep: [] -> ['aten.addmm']"]


def test_changed_option_of_a_moved_pass_is_still_reported():
    after = plan(passes=["capture", "functionalize", "decompose", {"cse": {"exclude": ["aten.clone"]}}, "dce"])
    lines = diff_plans(plan(), after)
    assert lines[0].startswith("~ order: ")
    assert lines[1:] == ["~ cse.exclude: [] -> ['aten.clone']"]


def test_changed_settings_are_reported_by_key_path():
    after = plan(verify="each", expect={"max_graph_breaks": 0}, cache={"enabled": False})
    assert diff_plans(plan(), after) == ["~ verify: 'off' -> 'each'", "~ cache.enabled: true -> false",
                                         "~ expect.max_graph_breaks: null -> 0"]


@attrs.frozen
class _ScaleOptions:
    scale: dict[str, float] = pipeline.option({}, "Per-operator scale (a mapping-valued option).")


class _Scale(pipeline.Pass):
    """A do-nothing pass whose option is a mapping, registered only for the test below."""

    name = "diff-test-scale"
    Options = _ScaleOptions
    version = "1"

    def run(self, graph, context):
        return graph


class _ScalePlugin:
    @pipeline.hookimpl
    def pipeline_register_passes(self):
        return [_Scale]


@pytest.fixture
def scale_pass():
    plugin = _ScalePlugin()
    pipeline.register_plugin(plugin)
    try:
        yield _Scale.name
    finally:
        pipeline.unregister_plugin(plugin)


def test_entry_added_to_a_mapping_option_is_reported(scale_pass):
    before = plan(passes=["capture", scale_pass])
    after = plan(passes=["capture", {scale_pass: {"scale": {"aten.mul": 2.0}}}])
    assert diff_plans(before, after) == [f"~ {scale_pass}.scale.aten.mul: null -> 2.0"]
    assert diff_plans(after, before) == [f"~ {scale_pass}.scale.aten.mul: 2.0 -> null"]


def test_diff_is_directional():
    after = plan(passes=["capture", "functionalize", "decompose", "dce"])
    assert diff_plans(after, plan()) == ["+ pass cse (at position 4)"]


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_diff_prints_the_same_lines(capsys):
    assert main(["plan", "diff", "default", "llm-serving"]) == 0
    expected = diff_plans(load_plan("default"), load_plan("llm-serving"))
    assert expected and capsys.readouterr().out.splitlines() == expected


def test_cli_diff_exit_code_is_1_when_plans_differ():
    assert main(["plan", "diff", "--exit-code", "default", "llm-serving"]) == 1


def test_cli_diff_exit_code_is_0_for_plans_that_compile_the_same_way(capsys):
    assert main(["plan", "diff", "--exit-code", "default", str(REPO / "plans" / "default.yaml")]) == 0
    assert "no differences" in capsys.readouterr().out


def test_cli_diff_of_a_bad_plan_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\npasses: [captur]\n")
    assert main(["plan", "diff", "default", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}:2: passes[0]: unknown pass 'captur'")


@pytest.mark.parametrize("flag", [[], ["--exit-code"]])
def test_cli_diff_of_a_plan_with_itself_exits_0(flag):
    assert main(["plan", "diff", *flag, "llm-serving", "llm-serving"]) == 0
