"""``resolve`` prints the fully defaulted plan as YAML that loads back to an equal plan, and
``extends`` layers a child plan over its parent with documented merge rules."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline import Plan, get_registry, load_plan
from pipeline.plan.text import resolve_text

REPO = Path(__file__).resolve().parents[1]
BUILTIN_PLANS = sorted(get_registry().plans)


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    """Write a dedented plan; its first non-empty line is line 1."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def body(resolved: str) -> str:
    """The resolved YAML without its ``# resolved from ...`` header comment."""
    header, rest = resolved.split("\n", 1)
    assert header.startswith("# resolved from ")
    return rest


def option(plan: Plan, pass_name: str):
    (spec,) = [p for p in plan.passes if p.name == pass_name]
    return spec.options


# -- round trip ------------------------------------------------------------------------------------

def test_the_builtin_plans_exist():
    assert {"default", "debug", "llm-serving"} <= set(BUILTIN_PLANS)


@pytest.mark.parametrize("name", BUILTIN_PLANS)
def test_resolved_builtin_plan_loads_back_equal(tmp_path, name):
    plan = load_plan(name)
    path = tmp_path / "resolved.yaml"
    path.write_text(resolve_text(plan))
    assert load_plan(path) == plan


@pytest.mark.parametrize("name", BUILTIN_PLANS)
def test_resolving_a_resolved_plan_gives_the_same_yaml(tmp_path, name):
    first = resolve_text(load_plan(name))
    path = tmp_path / "resolved.yaml"
    path.write_text(first)
    assert body(resolve_text(load_plan(path))) == body(first)


@pytest.mark.parametrize("name", BUILTIN_PLANS)
def test_resolving_twice_gives_identical_text(name):
    assert resolve_text(load_plan(name)) == resolve_text(load_plan(name))


def test_resolved_text_names_its_source_and_what_it_extends():
    header = resolve_text(load_plan("llm-serving")).splitlines()[0]
    assert header.startswith("# resolved from ") and header.endswith(")")
    assert "llm-serving.yaml (extends " in header and "default.yaml" in header


def test_resolved_plan_spells_out_every_default():
    resolved = resolve_text(load_plan({"name": "p", "passes": ["capture"]}))
    for key in ("frontend: dynamo", "fullgraph: false", "dynamic: null", "recompile_limit: 8",
                "verify: 'off'", "on_error: raise", "enabled: true", "max_graph_breaks: null"):
        assert key in resolved


def test_cli_resolve_output_validates_and_loads_back_equal(tmp_path):
    resolved = tmp_path / "r.yaml"
    run = [sys.executable, "-m", "pipeline.tools.cli"]
    with resolved.open("w") as out:
        done = subprocess.run(run + ["plan", "resolve", "plans/llm-serving.yaml"], cwd=REPO, stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    check = subprocess.run(run + ["plan", "validate", str(resolved)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(f"ok: {resolved} (plan 'llm-serving'")
    assert load_plan(resolved) == load_plan(REPO / "plans" / "llm-serving.yaml")


def test_plans_are_equal_wherever_they_were_loaded_from(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: {fullgraph: true}
          - functionalize
    """)
    from_dict = load_plan({"name": "p", "passes": [{"capture": {"fullgraph": True}}, "functionalize"]})
    assert load_plan(path) == from_dict
    assert load_plan(path).source != from_dict.source


def test_load_plan_returns_a_plan_instance_unchanged():
    plan = load_plan("default")
    assert load_plan(plan) is plan


# -- extends ---------------------------------------------------------------------------------------

@pytest.fixture
def parent(tmp_path: Path) -> Path:
    return write(tmp_path, """
        name: parent
        description: the parent
        target: cpu
        passes:
          - capture: {fullgraph: false, recompile_limit: 3, stance: eager_on_recompile}
          - functionalize
          - decompose: {keep: [aten.addmm]}
          - dce
          - cse
          - dce
        cache: {enabled: false, dir: /tmp/parent-cache}
        expect: {max_graph_breaks: 0, max_kernels: 10}
    """, name="parent.yaml")


def test_child_scalar_replaces_the_parents(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        verify: each
    """, name="child.yaml"))
    base = load_plan(parent)
    assert (child.name, child.verify) == ("child", "each")
    assert (child.target, child.description, child.passes) == (base.target, base.description, base.passes)


def test_child_without_a_name_keeps_the_parents_name(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        on_error: eager
    """, name="child.yaml"))
    assert (child.name, child.on_error) == ("parent", "eager")


def test_child_options_merge_into_the_parents_pass_keeping_its_other_options(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        options:
          capture: {fullgraph: true}
    """, name="child.yaml"))
    capture = option(child, "capture")
    assert capture.fullgraph is True
    assert (capture.recompile_limit, capture.stance) == (3, "eager_on_recompile")
    assert option(child, "decompose").keep == ["aten.addmm"]


def test_child_remove_drops_every_pass_of_that_name(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        remove: [dce]
    """, name="child.yaml"))
    assert child.pass_names() == ["capture", "functionalize", "decompose", "cse"]


def test_child_passes_replace_the_whole_list(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        passes:
          - capture
          - functionalize
    """, name="child.yaml"))
    assert child.pass_names() == ["capture", "functionalize"]
    assert option(child, "capture").recompile_limit == 8


def test_child_cache_merges_key_by_key(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        cache: {dir: /tmp/child-cache}
    """, name="child.yaml"))
    assert (child.cache.enabled, child.cache.dir) == (False, "/tmp/child-cache")


def test_child_expect_merges_key_by_key(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        expect: {max_kernels: 5, on_miss: warn}
    """, name="child.yaml"))
    assert (child.expect.max_graph_breaks, child.expect.max_kernels, child.expect.on_miss) == (0, 5, "warn")


def test_child_can_reset_an_expectation_to_null(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        name: child
        extends: parent.yaml
        expect: {max_graph_breaks: null}
    """, name="child.yaml"))
    assert (child.expect.max_graph_breaks, child.expect.max_kernels) == (None, 10)


def test_extends_path_is_relative_to_the_child_file_not_the_working_directory(tmp_path, parent):
    nested = tmp_path / "nested"
    nested.mkdir()
    child = load_plan(write(nested, """
        name: child
        extends: ../parent.yaml
    """, name="child.yaml"))
    assert child.pass_names() == load_plan(parent).pass_names()


def test_grandchild_sees_every_layer(tmp_path, parent):
    write(tmp_path, """
        name: child
        extends: parent.yaml
        options:
          capture: {fullgraph: true}
    """, name="child.yaml")
    grandchild = load_plan(write(tmp_path, """
        name: grandchild
        extends: child.yaml
        remove: [cse]
    """, name="grandchild.yaml"))
    assert option(grandchild, "capture").fullgraph is True
    assert option(grandchild, "capture").recompile_limit == 3
    assert "cse" not in grandchild.pass_names()
    assert grandchild.lineage == (str(tmp_path / "child.yaml"), str(parent))


def test_debug_plan_extends_default_and_verifies_each_pass():
    debug = load_plan("debug")
    assert debug.verify == "each"
    assert Path(debug.lineage[-1]).name == "default.yaml"
    assert debug.pass_names()[:2] == ["capture", "functionalize"]


# -- overrides -------------------------------------------------------------------------------------

def test_overrides_replace_scalars_of_a_named_plan():
    plan = load_plan("default", {"verify": "each"})
    assert plan.verify == "each"
    assert plan.passes == load_plan("default").passes


def test_override_options_merge_into_the_plans_passes():
    plan = load_plan("llm-serving", {"options": {"capture": {"recompile_limit": 2}}})
    capture = option(plan, "capture")
    assert (capture.recompile_limit, capture.fullgraph) == (2, True)
