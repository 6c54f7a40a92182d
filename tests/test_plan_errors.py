"""Malformed plans. Every mistake is a PlanError whose message starts with ``file:LINE: key.path:``
(1-based line of the offending entry) and, where a valid name is close, suggests it. Loading
validates everything before anything compiles, and a plan can never execute code."""
from __future__ import annotations

import string
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline import PlanError, compile_with_plan, load_plan


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
    """The message starts with ``file:line: key:`` and contains every fragment; the attributes agree."""
    where = str(file) + (f":{line}" if line is not None else "")
    head = f"{where}: {key}: " if key else f"{where}: "
    message = str(exc)
    assert message.startswith(head), f"{message!r} does not start with {head!r}"
    assert (exc.file, exc.line, exc.key) == (str(file), line, key)
    for fragment in fragments:
        assert fragment in message


# -- top-level keys and scalar settings ------------------------------------------------------------

def test_unknown_top_level_key_suggests_the_nearest_key(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
        verfy: each
    """)
    assert_located(load_error(path), path, 4, "verfy", "unknown key 'verfy'", "did you mean 'verify'?")


def test_verify_outside_its_choices_lists_them(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        verify: maybe
    """)
    exc = load_error(path)
    assert_located(exc, path, 3, "verify", "expected one of off, final, each, got string 'maybe'")
    assert "did you mean" not in str(exc)


def test_on_error_outside_its_choices_lists_them(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        on_error: ignore
    """)
    assert_located(load_error(path), path, 3, "on_error", "expected one of raise, eager, got string 'ignore'")


def test_unknown_target_suggests_the_nearest_target(tmp_path):
    path = write(tmp_path, """
        name: p
        target: tpu
        passes: [capture]
    """)
    assert_located(load_error(path), path, 2, "target", "got string 'tpu'", "did you mean 'cpu'?")


def test_empty_name_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: ""
        passes: [capture]
    """)
    assert_located(load_error(path), path, 1, "name", "a plan name cannot be empty")


def test_missing_name_without_extends(tmp_path):
    path = write(tmp_path, """
        description: no name here
        passes: [capture]
    """)
    assert_located(load_error(path), path, 1, "name", "missing required key 'name'", "extends")


def test_missing_passes_without_extends(tmp_path):
    path = write(tmp_path, """
        name: p
        verify: each
    """)
    assert_located(load_error(path), path, 1, "passes", "missing required key 'passes'", "extends")


# -- the pass list ---------------------------------------------------------------------------------

def test_unknown_pass_suggests_the_nearest_pass(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalise
    """)
    assert_located(load_error(path), path, 4, "passes[1]", "unknown pass 'functionalise'",
                   "did you mean 'functionalize'?")


def test_unknown_pass_with_options_names_it_in_the_key(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalise: {}
    """)
    assert_located(load_error(path), path, 4, "passes[1].functionalise", "did you mean 'functionalize'?")


def test_pass_entry_with_two_keys_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize: {}
            decompose: {}
    """)
    assert_located(load_error(path), path, 4, "passes[1]", "got 2 keys (functionalize, decompose)",
                   "write each pass as its own list item")


def test_pass_entry_that_is_a_number_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - 42
    """)
    assert_located(load_error(path), path, 4, "passes[1]", "a pass entry is a name or 'name: {options}', got int")


def test_empty_pass_list_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: []
    """)
    assert_located(load_error(path), path, 2, "passes", "expected a non-empty list of passes")


def test_passes_that_is_not_a_list_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: capture
    """)
    assert_located(load_error(path), path, 2, "passes", "expected a non-empty list of passes")


def test_first_pass_must_be_a_capture_pass(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - functionalize
          - capture
    """)
    assert_located(load_error(path), path, 3, "passes[0]", "the first pass must be a capture pass (capture)",
                   "got 'functionalize'")


def test_capture_pass_can_only_come_first(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - capture
    """)
    assert_located(load_error(path), path, 5, "passes[2]", "'capture' is a capture pass and can only come first")


def test_pass_whose_requirement_no_earlier_pass_provides_names_tag_and_provider(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - cse
          - functionalize
    """)
    assert_located(load_error(path), path, 4, "passes[1]", "pass 'cse' requires functional",
                   "no earlier pass provides", "put one of functionalize before it")


# -- pass options ----------------------------------------------------------------------------------

def test_unknown_option_suggests_the_nearest_option(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose:
              table: core-aten
              kep: [aten.addmm]
    """)
    assert_located(load_error(path), path, 7, "passes[2].decompose.kep", "unknown option 'kep'",
                   "did you mean 'keep'?")


def test_option_of_a_pass_without_options_says_it_takes_none(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - dce: {aggressive: true}
    """)
    assert_located(load_error(path), path, 5, "passes[2].dce.aggressive", "unknown option 'aggressive'",
                   "this takes no options")


def test_integer_option_given_a_string(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: {recompile_limit: "8"}
    """)
    assert_located(load_error(path), path, 3, "passes[0].capture.recompile_limit",
                   "expected an integer, got string '8'")


def test_boolean_option_given_an_integer(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture:
              fullgraph: 1
    """)
    assert_located(load_error(path), path, 4, "passes[0].capture.fullgraph",
                   "expected true or false, got integer 1")


def test_list_option_given_a_scalar(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose:
              keep: aten.addmm
    """)
    assert_located(load_error(path), path, 6, "passes[2].decompose.keep",
                   "expected a list of str, got string 'aten.addmm'")


def test_list_item_of_the_wrong_type_names_its_index_and_line(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose:
              keep:
                - aten.addmm
                - 3
    """)
    assert_located(load_error(path), path, 8, "passes[2].decompose.keep[1]", "expected a string, got integer 3")


def test_choice_option_outside_its_choices_suggests_the_nearest(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: {frontend: dynamoo}
    """)
    assert_located(load_error(path), path, 3, "passes[0].capture.frontend",
                   "expected one of dynamo, export, got string 'dynamoo'", "did you mean 'dynamo'?")


def test_null_for_a_non_optional_option(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: {fullgraph: null}
    """)
    assert_located(load_error(path), path, 3, "passes[0].capture.fullgraph", "expected true or false, got null")


def test_negative_recompile_limit_fails_its_check(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture:
              frontend: dynamo
              recompile_limit: -1
    """)
    assert_located(load_error(path), path, 5, "passes[0].capture.recompile_limit",
                   "must be greater than 0, got -1")


def test_unknown_operator_in_decompose_keep_suggests_a_known_one(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose:
              keep: [aten.addmm, aten.adm]
    """)
    assert_located(load_error(path), path, 6, "passes[2].decompose.keep", "unknown operator 'aten.adm'",
                   "did you mean 'aten.")


def test_unknown_operator_in_decompose_add(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose:
              table: custom
              add: [aten.adm]
    """)
    assert_located(load_error(path), path, 7, "passes[2].decompose.add", "unknown operator 'aten.adm'")


def test_pass_options_that_are_not_a_mapping(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: fullgraph
    """)
    assert_located(load_error(path), path, 3, "passes[0].capture",
                   "expected a mapping of options, got string 'fullgraph'")


# -- cache and expect ------------------------------------------------------------------------------

def test_cache_enabled_yes_is_a_string_not_a_boolean(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        cache:
          enabled: yes
    """)
    assert_located(load_error(path), path, 4, "cache.enabled", "expected true or false, got string 'yes'")


def test_negative_max_graph_breaks_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        expect:
          max_graph_breaks: -1
    """)
    assert_located(load_error(path), path, 4, "expect.max_graph_breaks", "must be 0 or more, got -1")


def test_expect_on_miss_outside_its_choices(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        expect: {max_graph_breaks: 0, on_miss: maybe}
    """)
    assert_located(load_error(path), path, 3, "expect.on_miss", "expected one of error, warn, got string 'maybe'")


def test_unknown_expectation_suggests_the_nearest(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        expect:
          max_graph_break: 0
    """)
    assert_located(load_error(path), path, 4, "expect.max_graph_break", "did you mean 'max_graph_breaks'?")


# -- YAML itself -----------------------------------------------------------------------------------

def test_duplicate_key_names_both_lines(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        verify: off
        verify: each
    """)
    assert_located(load_error(path), path, 4, "verify", "key 'verify' is given twice",
                   "(first on line 3)")


def test_duplicate_option_key_inside_a_pass_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture:
              fullgraph: true
              fullgraph: false
    """)
    assert_located(load_error(path), path, 5, "fullgraph", "given twice", "(first on line 4)")


def test_invalid_yaml_names_the_line_of_the_problem(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture
        verify: off
    """)
    assert_located(load_error(path), path, 3, None, "invalid YAML")


def test_tab_indentation_names_its_line(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("name: p\npasses:\n\t- capture\n")
    assert_located(load_error(path), path, 3, None, "invalid YAML", "'\\t'")


def test_empty_file_is_rejected(tmp_path):
    path = write(tmp_path, "")
    assert_located(load_error(path), path, None, None, "the plan is empty")


def test_file_that_is_a_list_is_rejected(tmp_path):
    path = write(tmp_path, """
        - capture
        - functionalize
    """)
    assert_located(load_error(path), path, 1, None, "a plan is a mapping of keys", "got a list")


def test_non_utf8_bytes_name_their_line(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_bytes(b"name: p\npasses: [capture]\ndescription: caf\xe9\n")
    assert_located(load_error(path), path, 3, None, "not valid UTF-8", "save it as UTF-8")


def test_anchors_and_aliases_load_like_the_expanded_plan(tmp_path):
    path = write(tmp_path, """
        name: p
        description: &text shared text
        passes:
          - capture: &strict {fullgraph: true}
          - functionalize
          - decompose:
              keep: &kept [aten.addmm]
              add: *kept
        expect: {max_graph_breaks: 0}
    """)
    expanded = write(tmp_path, """
        name: p
        description: shared text
        passes:
          - capture: {fullgraph: true}
          - functionalize
          - decompose: {keep: [aten.addmm], add: [aten.addmm]}
        expect: {max_graph_breaks: 0}
    """, name="expanded.yaml")
    assert load_plan(path) == load_plan(expanded)


# -- a plan never executes code --------------------------------------------------------------------

def test_python_object_tag_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        description: !!python/object:collections.OrderedDict {}
    """)
    assert_located(load_error(path), path, 3, None, "invalid YAML", "python/object")


def test_python_name_tag_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        description: !!python/name:os.system
    """)
    assert_located(load_error(path), path, 3, None, "invalid YAML", "python/name:os.system")


def test_python_apply_tag_is_never_executed(tmp_path):
    marker = tmp_path / "executed"
    path = write(tmp_path, f"""
        name: p
        passes: [capture]
        description: !!python/object/apply:os.system ["touch {marker}"]
    """)
    assert_located(load_error(path), path, 3, None, "invalid YAML")
    assert not marker.exists()


# -- extends, options, remove ----------------------------------------------------------------------

def test_extends_unknown_plan_name_suggests_the_nearest(tmp_path):
    path = write(tmp_path, """
        name: p
        extends: defualt
    """)
    assert_located(load_error(path), path, 2, "extends", "no plan named 'defualt'", "did you mean 'default'?")


def test_extends_missing_file_names_the_child_line(tmp_path):
    path = write(tmp_path, """
        name: p
        verify: each
        extends: nowhere.yaml
    """)
    assert_located(load_error(path), path, 3, "extends", "plan file not found: nowhere.yaml")


def test_extends_that_is_not_a_string(tmp_path):
    path = write(tmp_path, """
        name: p
        extends: [default]
    """)
    assert_located(load_error(path), path, 2, "extends", "expected a plan name or path")


def test_recursive_extends_is_reported_as_a_cycle_where_it_closes(tmp_path):
    first = write(tmp_path, """
        name: a
        extends: b.yaml
    """, name="a.yaml")
    second = write(tmp_path, """
        name: b
        verify: each
        extends: a.yaml
    """, name="b.yaml")
    exc = load_error(first)
    assert_located(exc, second, 3, "extends")
    a, b = first.resolve(), second.resolve()
    assert exc.reason == f"'extends' forms a cycle: {a} -> {b} -> {a}"


def test_plan_extending_itself_is_a_cycle(tmp_path):
    path = write(tmp_path, """
        name: a
        extends: plan.yaml
    """)
    assert_located(load_error(path), path, 2, "extends", "forms a cycle")


def test_error_inside_the_parent_names_the_parent_file(tmp_path):
    parent = write(tmp_path, """
        name: parent
        passes:
          - capture: {stance: eager}
    """, name="parent.yaml")
    child = write(tmp_path, """
        name: child
        extends: parent.yaml
    """, name="child.yaml")
    assert_located(load_error(child), parent, 3, "passes[0].capture.stance", "got string 'eager'")


def test_options_without_extends_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        options:
          capture: {fullgraph: true}
    """)
    assert_located(load_error(path), path, 3, "options", "'options' changes a parent plan, so it needs 'extends'")


def test_remove_without_extends_is_rejected(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        remove: [capture]
    """)
    assert_located(load_error(path), path, 3, "remove", "needs 'extends'")


PARENT = """
    name: parent
    passes:
      - capture
      - functionalize
      - decompose
      - constant-fold
      - dce
      - cse
"""


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """A small parent plan next to the child, so these tests do not depend on the built-in plans."""
    return write(tmp_path, PARENT, name="parent.yaml")


def test_options_for_a_pass_the_parent_lacks(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        options:
          capture: {fullgraph: true}
          fuse: {max_group_size: 3}
    """)
    assert_located(load_error(path), path, 5, "options.fuse", "the plan has no pass 'fuse' to set options on")


def test_options_for_a_misspelled_pass_suggest_the_parents_pass(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        options:
          decompse: {keep: []}
    """)
    assert_located(load_error(path), path, 4, "options.decompse", "did you mean 'decompose'?")


def test_bad_option_in_a_child_override_names_the_child_line(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        options:
          capture:
            fullgraph: true
            recompile_limt: 3
    """)
    assert_located(load_error(path), path, 6, "options.capture.recompile_limt", "unknown option 'recompile_limt'",
                   "did you mean 'recompile_limit'?")


def test_remove_a_pass_the_parent_lacks_suggests_the_nearest(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        remove:
          - constant-fold
          - dcee
    """)
    assert_located(load_error(path), path, 5, "remove[1]", "the parent plan has no pass 'dcee' to remove",
                   "did you mean 'dce'?")


def test_remove_that_is_not_a_list(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        remove: cse
    """)
    assert_located(load_error(path), path, 3, "remove", "expected a list of pass names")


def test_child_that_breaks_the_pass_order_points_at_its_own_remove_line(tmp_path, parent):
    path = write(tmp_path, """
        name: p
        extends: parent.yaml
        verify: each
        remove: [functionalize]
    """)
    assert_located(load_error(path), path, 4, "passes[1]", "pass 'decompose' requires aten",
                   "put one of functionalize before it")


def test_override_that_breaks_the_pass_order_shows_no_line_of_the_parent(parent):
    exc = load_error(parent, {"remove": ["functionalize"]})
    assert_located(exc, "<overrides>", None, "passes[1]", "pass 'decompose' requires aten")


# -- plans given as dicts, overrides, compile_with_plan --------------------------------------------

def test_dict_plan_errors_name_the_dict_source():
    exc = load_error({"name": "p", "passes": ["capture", "functionalise"]})
    assert_located(exc, "<dict>", None, "passes[1]", "unknown pass 'functionalise'", "did you mean 'functionalize'?")


def test_dict_plan_option_errors_carry_the_key_path():
    exc = load_error({"name": "p", "passes": [{"capture": {"fullgraph": "yes"}}]})
    assert_located(exc, "<dict>", None, "passes[0].capture.fullgraph", "expected true or false, got string 'yes'")


def test_override_errors_name_the_overrides_source():
    exc = load_error("default", {"verify": "maybe"})
    assert_located(exc, "<overrides>", None, "verify", "got string 'maybe'")


def test_overrides_cannot_extend():
    assert_located(load_error("default", {"extends": "debug"}), "<overrides>", None, "extends",
                   "not allowed in overrides")


def test_compile_with_plan_override_errors_name_the_overrides_source():
    with pytest.raises(PlanError) as info:
        compile_with_plan(lambda x: x, "default", options={"capture": {"fullgraf": True}})
    assert_located(info.value, "<overrides>", None, "options.capture.fullgraf", "did you mean 'fullgraph'?")


def test_compile_with_plan_rejects_a_bad_plan_before_compiling_anything(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - functionalize
          - decompose: {kep: []}
    """)
    calls = []

    def must_not_run(x):
        calls.append(x)
        raise AssertionError("the model ran although the plan is invalid")

    with pytest.raises(PlanError) as info:
        compile_with_plan(must_not_run, path)
    assert_located(info.value, path, 5, "passes[2].decompose.kep", "did you mean 'keep'?")
    assert calls == []


def test_load_plan_rejects_values_that_are_not_plans():
    exc = load_error(42)
    assert "a plan is a Plan, a plan name, a path or a dict, not int" in str(exc)


# -- any damaged plan is a located PlanError, never a crash ----------------------------------------

_GOOD = textwrap.dedent("""\
    name: p
    extends: default
    options:
      capture: {fullgraph: true, recompile_limit: 4}
      decompose: {keep: [aten.addmm]}
    remove: [cse]
    verify: each
    cache: {enabled: false, dir: null}
    expect: {max_graph_breaks: 0, cudagraphs: full}
""")
_EDIT = st.tuples(st.integers(0, len(_GOOD) - 1), st.sampled_from(["delete", "insert", "replace"]),
                  st.sampled_from(list(" \n\t:-[]{},&*!|>'\"#" + string.ascii_lowercase[:6] + "0123456789")))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(_EDIT, min_size=1, max_size=4))
def test_damaged_plan_loads_or_raises_a_located_plan_error(tmp_path_factory, edits):
    chars = list(_GOOD)
    for position, kind, char in edits:
        position = min(position, len(chars) - 1)
        if kind == "delete":
            del chars[position]
        elif kind == "insert":
            chars.insert(position, char)
        else:
            chars[position] = char
    path = tmp_path_factory.mktemp("fuzz") / "plan.yaml"
    path.write_text("".join(chars))
    try:
        load_plan(path)
    except PlanError as exc:
        assert exc.file == str(path) and str(exc).startswith(str(path))
        assert exc.line is None or 1 <= exc.line <= len(chars)


def test_plan_error_is_a_pipeline_error():
    assert issubclass(PlanError, pipeline.PipelineError)


# -- values YAML 1.1 or Python would accept but no plan means -------------------------------------

def _float_options() -> list[tuple[str, str]]:
    """(section or pass, option) for every float-valued option a plan can set."""
    import typing

    import attrs

    from pipeline.plan import Expectations
    found = []
    classes = [("expect", Expectations)] + [(name, entry.cls.Options)
                                           for name, entry in sorted(pipeline.get_registry().passes.items())]
    for owner, cls in classes:
        hints = typing.get_type_hints(cls)
        for field in attrs.fields(cls):
            if float in (hints[field.name], *typing.get_args(hints[field.name])):
                found.append((owner, field.name))
    return found


def test_there_are_float_options_to_check():
    assert ("partition", "memory_budget") in _float_options()
    assert ("expect", "max_compile_seconds") in _float_options()


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("owner,name", _float_options())
def test_every_float_option_rejects_nan_and_infinity(tmp_path, owner, name, value):
    if owner == "expect":
        text = f"name: p\npasses: [capture]\nexpect:\n  {name}: {value}\n"
        key = f"expect.{name}"
    else:
        text = f"name: p\nextends: training\noptions:\n  {owner}:\n    {name}: {value}\n"
        key = f"options.{owner}.{name}"
        if owner not in load_plan("training").pass_names():
            pytest.skip(f"{owner} is not in the training plan")
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    assert_located(load_error(path), path, 4 if owner == "expect" else 5, key, "a finite number")


def test_memory_budget_nan_is_rejected_where_it_is_written(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture
          - partition: {memory_budget: .nan}
    """)
    assert_located(load_error(path), path, 4, "passes[1].partition.memory_budget", "a finite number", ".nan")


def test_a_nan_in_a_dict_plan_is_rejected_too():
    exc = load_error("default", {"expect": {"max_compile_seconds": float("nan")}})
    assert_located(exc, "<overrides>", None, "expect.max_compile_seconds", "a finite number")


def test_a_nan_pad_value_is_rejected():
    exc = load_error("default", {"shapes": {"buckets": {"x": {0: {"sizes": [1, 2], "pad_value": float("nan")}}}}})
    assert exc.file == "<overrides>" and "pad_value" in str(exc) and "NaN" in str(exc)


def test_an_infinite_pad_value_is_allowed_for_masks():
    plan = load_plan("default", {"shapes": {"buckets": {"x": {0: {"sizes": [1, 2], "pad_value": float("-inf")}}}}})
    assert plan.shapes.buckets["x"][0].pad_value == float("-inf")


def test_a_nul_character_in_cache_dir_is_rejected_at_load(tmp_path):
    path = write(tmp_path, """
        name: p
        passes: [capture]
        cache:
          dir: "/tmp/a\\0b"
    """)
    assert_located(load_error(path), path, 4, "cache.dir", "NUL")


def test_a_nul_character_in_a_dict_plan_string_is_rejected():
    exc = load_error("default", {"cache": {"dir": "/tmp/a\x00b"}})
    assert_located(exc, "<overrides>", None, "cache.dir", "NUL")


def test_a_sexagesimal_looking_value_is_a_string_not_a_number(tmp_path):
    path = write(tmp_path, """
        name: p
        passes:
          - capture: {recompile_limit: 1:30}
    """)
    assert_located(load_error(path), path, 3, "passes[0].capture.recompile_limit",
                   "expected an integer, got string '1:30'")
    described = write(tmp_path, """
        name: p
        description: 1:30
        passes: [capture]
    """, name="described.yaml")
    assert load_plan(described).description == "1:30"


def test_numbers_are_read_as_yaml_1_2_reads_them(tmp_path):
    path = write(tmp_path, """
        name: 2024-01-01
        passes:
          - capture: {recompile_limit: 010}
        expect: {max_compile_seconds: 1e3, max_kernels: 1_000}
    """)
    exc = load_error(path)
    assert_located(exc, path, 4, "expect.max_kernels", "expected an integer, got string '1_000'")
    path.write_text(path.read_text().replace(", max_kernels: 1_000", ""))
    plan = load_plan(path)
    assert (plan.name, plan.passes[0].options.recompile_limit, plan.expect.max_compile_seconds) == \
        ("2024-01-01", 10, 1000.0)


def test_strings_that_look_like_yaml_1_2_numbers_round_trip(tmp_path):
    from pipeline.plan.text import resolve_text
    plan = load_plan({"name": "1e3", "description": "0o17", "passes": ["capture"]})
    path = tmp_path / "resolved.yaml"
    path.write_text(resolve_text(plan))
    assert load_plan(path) == plan


# -- plugins installed but not loaded ---------------------------------------------------------------

@pytest.fixture
def disabled_plugin(monkeypatch):
    """An installed distribution in the ``pipeline.plugins`` group, with autoload switched off."""
    import importlib.metadata
    import types

    real = importlib.metadata.entry_points
    dist = types.SimpleNamespace(metadata={"Name": "pipeline-reduction-rewrites"}, version="0.1.0")
    fake = types.SimpleNamespace(name="reduction-rewrites", value="reduction_rewrites",
                                 group="pipeline.plugins", dist=dist,
                                 load=lambda: pytest.fail("a disabled plugin was imported"))

    def entry_points(**kwargs):
        found = list(real(**kwargs))
        return found + [fake] if kwargs.get("group") == "pipeline.plugins" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setenv("PIPELINE_DISABLE_PLUGIN_AUTOLOAD", "1")
    pipeline.reload_registry()
    yield
    monkeypatch.undo()
    pipeline.reload_registry()


def test_an_unknown_plan_says_installed_plugins_are_not_autoloaded(tmp_path, disabled_plugin):
    path = write(tmp_path, """
        name: p
        extends: fusable-reductions
    """)
    assert_located(load_error(path), path, 2, "extends", "no plan named 'fusable-reductions'",
                   "PIPELINE_DISABLE_PLUGIN_AUTOLOAD", "pipeline-reduction-rewrites 0.1.0 (reduction_rewrites)")


def test_an_unknown_pass_says_installed_plugins_are_not_autoloaded(disabled_plugin):
    exc = load_error({"name": "p", "passes": ["capture", "fusable-reductions"]})
    assert_located(exc, "<dict>", None, "passes[1]", "unknown pass 'fusable-reductions'",
                   "PIPELINE_DISABLE_PLUGIN_AUTOLOAD", "pipeline-reduction-rewrites")


def test_with_autoload_on_an_unknown_plan_mentions_no_plugins(tmp_path):
    exc = load_error({"name": "p", "extends": "fusable-reductionz"})
    assert "AUTOLOAD" not in str(exc)
