"""``insert:`` puts a pass before or after a named pass of the parent plan, keeping every other pass
and its options as the parent has them; and a child that restates the parent's ``passes:`` list
instead is warned about every option of the parent it silently drops."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from pipeline import PlanError, load_plan
from pipeline.plan import PlanWarning
from pipeline.plan.text import diff_plans, resolve_text

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    """Write a dedented plan; its first non-empty line is line 1."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_error(plan, overrides=None) -> PlanError:
    with pytest.raises(PlanError) as info:
        load_plan(plan, overrides)
    return info.value


def assert_located(exc: PlanError, file, line: int | None, key: str | None, *fragments: str) -> None:
    where = str(file) + (f":{line}" if line is not None else "")
    head = f"{where}: {key}: " if key else f"{where}: "
    assert str(exc).startswith(head), f"{str(exc)!r} does not start with {head!r}"
    assert (exc.file, exc.line, exc.key) == (str(file), line, key)
    for fragment in fragments:
        assert fragment in str(exc), f"{fragment!r} not in {str(exc)!r}"


def plan_warnings(plan, overrides=None) -> list[PlanWarning]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_plan(plan, overrides)
    return [w.message for w in caught if isinstance(w.message, PlanWarning)]


PARENT = """
    name: parent
    passes:
      - capture: {recompile_limit: 3}
      - functionalize
      - decompose: {keep: [aten.addmm], add: [aten._softmax]}
      - dce
      - cse
      - dce
      - fuse: {max_group_size: 16}
      - codegen: {backend: auto}
"""


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    return write(tmp_path, PARENT, name="parent.yaml")


def others_unchanged(child, base, inserted: set[int]) -> None:
    """Every pass of ``child`` but the ``inserted`` positions equals the parent's, options included."""
    kept = [spec for index, spec in enumerate(child.passes) if index not in inserted]
    assert kept == list(base.passes)


# -- inserting -------------------------------------------------------------------------------------

def test_insert_after_a_pass_puts_it_right_after_and_keeps_every_parent_option(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: fuse
            pass: constant-fold
            options: {max_bytes: 7}
    """))
    assert child.pass_names() == ["capture", "functionalize", "decompose", "dce", "cse", "dce", "fuse",
                                  "constant-fold", "codegen"]
    assert child.passes[7].options.max_bytes == 7
    others_unchanged(child, load_plan(parent), {7})


def test_insert_before_a_pass_puts_it_right_before(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {before: decompose, pass: constant-fold}
    """))
    assert child.pass_names()[1:4] == ["functionalize", "constant-fold", "decompose"]
    others_unchanged(child, load_plan(parent), {2})


def test_inserts_apply_in_order_so_one_can_anchor_on_a_pass_an_earlier_one_inserted(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: fuse, pass: constant-fold}
          - {after: constant-fold, pass: cudagraphs}
    """))
    assert child.pass_names()[-4:] == ["fuse", "constant-fold", "cudagraphs", "codegen"]


def test_an_anchor_the_plan_repeats_needs_an_occurrence(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: dce, pass: constant-fold}
    """)
    assert_located(load_error(path), path, 3, "insert[0].after", "'dce' appears 2 times",
                   "positions 3 and 5", "occurrence")


def test_occurrence_picks_which_of_a_repeated_anchor(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: dce, occurrence: 2, pass: constant-fold}
    """))
    assert child.pass_names()[3:7] == ["dce", "cse", "dce", "constant-fold"]


def test_an_occurrence_past_the_last_is_an_error(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: dce
            occurrence: 3
            pass: constant-fold
    """)
    assert_located(load_error(path), path, 4, "insert[0].occurrence", "'dce' appears 2 times", "got 3")


def test_an_inserted_pass_can_name_its_graph_roles(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {before: fuse, pass: constant-fold, on: [inference]}
    """))
    assert child.passes[6].name == "constant-fold" and child.passes[6].roles == ("inference",)


def test_insert_then_remove_replaces_a_pass(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {before: cse, pass: constant-fold}
        remove: [cse]
    """))
    assert child.pass_names()[3:6] == ["dce", "constant-fold", "dce"]


def test_options_can_then_change_an_inserted_pass(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: fuse, pass: constant-fold}
        options:
          constant-fold: {max_bytes: 5}
    """))
    assert child.passes[7].options.max_bytes == 5


def test_insert_works_through_an_extends_chain(tmp_path, parent):
    write(tmp_path, """
        name: child
        extends: parent.yaml
        insert:
          - {after: fuse, pass: constant-fold}
    """, name="child.yaml")
    grandchild = load_plan(write(tmp_path, """
        name: grandchild
        extends: child.yaml
        insert:
          - {before: constant-fold, pass: cudagraphs}
        options:
          capture: {fullgraph: true}
    """, name="grandchild.yaml"))
    assert grandchild.pass_names()[-4:] == ["fuse", "cudagraphs", "constant-fold", "codegen"]
    capture = grandchild.passes[0].options
    assert (capture.fullgraph, capture.recompile_limit) == (True, 3)


def test_insert_into_a_builtin_plan_keeps_its_options():
    base = load_plan("default")
    plan = load_plan({"name": "mine", "extends": "default",
                      "insert": [{"after": "decompose", "pass": "cudagraphs"}]})
    assert diff_plans(base, plan) == ["+ pass cudagraphs (at position 3)", "~ name: 'default' -> 'mine'"]


def test_insert_in_overrides(parent):
    plan = load_plan(parent, {"insert": [{"before": "codegen", "pass": "cudagraphs"}]})
    assert plan.pass_names()[-2:] == ["cudagraphs", "codegen"]


def test_a_plan_with_inserts_round_trips_through_resolve(tmp_path, parent):
    child = load_plan(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: fuse, pass: constant-fold, options: {max_bytes: 9}, on: [inference, forward]}
    """))
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(resolve_text(child))
    assert load_plan(resolved) == child


# -- insert errors ---------------------------------------------------------------------------------

def test_an_unknown_anchor_suggests_the_plans_pass(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: fsue
            pass: constant-fold
    """)
    assert_located(load_error(path), path, 3, "insert[0].after", "the plan has no pass 'fsue' to insert after",
                   "did you mean 'fuse'?")


def test_an_anchor_the_plan_lacks_is_an_error(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - {before: reinplace, pass: constant-fold}
    """)
    assert_located(load_error(path), path, 3, "insert[0].before", "no pass 'reinplace' to insert before")


def test_an_entry_needs_exactly_one_anchor(tmp_path, parent):
    both = write(tmp_path, """
        extends: parent.yaml
        insert:
          - {before: fuse, after: cse, pass: constant-fold}
    """, name="both.yaml")
    assert_located(load_error(both), both, 3, "insert[0]", "exactly one of 'before' or 'after'")
    neither = write(tmp_path, """
        extends: parent.yaml
        insert:
          - {pass: constant-fold}
    """, name="neither.yaml")
    assert_located(load_error(neither), neither, 3, "insert[0]", "exactly one of 'before' or 'after'")


def test_an_entry_needs_a_pass(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: fuse}
    """)
    assert_located(load_error(path), path, 3, "insert[0]", "missing 'pass'")


def test_an_unknown_entry_key_suggests_the_nearest(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: fuse
            pas: constant-fold
    """)
    assert_located(load_error(path), path, 4, "insert[0].pas", "unknown key 'pas'", "did you mean 'pass'?")


def test_an_unknown_inserted_pass_suggests_a_registered_one(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: fuse
            pass: constant-flod
    """)
    assert_located(load_error(path), path, 4, "insert[0].pass", "unknown pass 'constant-flod'",
                   "did you mean 'constant-fold'?")


def test_a_bad_option_of_an_inserted_pass_names_its_key(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert:
          - after: fuse
            pass: constant-fold
            options:
              max_byte: 3
    """)
    assert_located(load_error(path), path, 6, "insert[0].options.max_byte", "did you mean 'max_bytes'?")


def test_an_insert_that_breaks_the_order_points_at_the_insert_entry(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        verify: each
        insert:
          - {before: functionalize, pass: cse}
    """)
    assert_located(load_error(path), path, 4, "insert[0]", "pass 'cse' requires functional")


def test_insert_without_extends_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        insert:
          - {after: capture, pass: dce}
    """)
    assert_located(load_error(path), path, 3, "insert", "'insert' changes a parent plan, so it needs 'extends'")


def test_insert_that_is_not_a_list(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        insert: {after: fuse, pass: dce}
    """)
    assert_located(load_error(path), path, 2, "insert", "expected a list")


# -- restating the parent's passes -----------------------------------------------------------------

def test_restating_the_passes_warns_for_each_parent_option_it_drops(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        passes:
          - capture
          - functionalize
          - decompose: {keep: [aten.addmm]}
          - fuse
          - codegen
    """)
    found = plan_warnings(path)
    texts = sorted(str(w) for w in found)
    assert len(found) == 4, texts
    (add,) = [w for w in found if w.key == "passes[2].decompose.add"]
    assert (add.file, add.line) == (str(path), 5)
    assert "the parent sets decompose.add: ['aten._softmax']" in str(add)
    assert f"({parent}:5)" in str(add)
    assert "becomes []" in str(add)
    assert "insert" in str(add)
    keys = sorted(w.key for w in found)
    assert keys == ["passes[0].capture.recompile_limit", "passes[2].decompose.add",
                    "passes[3].fuse.max_group_size", "passes[4].codegen.backend"]
    (backend,) = [w for w in found if w.key.endswith("backend")]
    assert "codegen.backend: 'auto'" in str(backend) and "becomes 'cpp'" in str(backend)


def test_no_warning_for_options_the_child_writes_itself_or_sets_with_options(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        passes:
          - capture: {recompile_limit: 8}
          - functionalize
          - decompose: {keep: [], add: [aten._softmax]}
          - fuse: {max_group_size: 16}
          - codegen
        options:
          codegen: {backend: triton}
    """)
    assert plan_warnings(path) == []


def test_no_warning_for_inserts_or_for_plans_that_keep_the_parents_passes(tmp_path, parent):
    assert plan_warnings(write(tmp_path, """
        extends: parent.yaml
        insert:
          - {after: fuse, pass: constant-fold}
    """)) == []
    assert plan_warnings("llm-serving") == []


def test_restated_passes_in_overrides_warn_too(parent):
    found = plan_warnings(parent, {"passes": ["capture", "functionalize", "decompose", "fuse",
                                              {"codegen": {"backend": "auto"}}]})
    assert sorted(w.key for w in found) == ["passes[0].capture.recompile_limit", "passes[2].decompose.add",
                                           "passes[2].decompose.keep", "passes[3].fuse.max_group_size"]
    assert all(w.file == "<overrides>" for w in found)


def test_validate_prints_the_warning_with_file_and_line(tmp_path, parent):
    path = write(tmp_path, """
        extends: parent.yaml
        passes:
          - capture: {recompile_limit: 3}
          - functionalize
          - decompose: {keep: [aten.addmm], add: [aten._softmax]}
          - fuse: {max_group_size: 16}
          - codegen
    """)
    done = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "plan", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"{path}:7: PlanWarning: passes[4].codegen.backend: the parent sets codegen.backend: 'auto'" \
        in done.stderr
