"""The documentation stays true to the code: the plan reference is generated and committed, public
names have docstrings, and the README names the two commands and every built-in plan."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import pipeline
import pipeline.testing
from pipeline.docgen import plan_reference
from pipeline.options import describe

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "plan-reference.md"
README = ROOT / "README.md"


def builtin_passes() -> dict:
    return {name: entry for name, entry in pipeline.get_registry().passes.items()
            if (entry.plugin.distribution or "").startswith("plan-pipeline")}


def pass_section(reference: str, name: str) -> str:
    """The text of one pass's section of the reference (up to the next heading)."""
    start = reference.index(f"### `{name}`\n")
    end = reference.find("\n#", start + 1)
    return reference[start:] if end == -1 else reference[start:end]


def test_committed_plan_reference_is_up_to_date():
    assert REFERENCE.read_text() == plan_reference(), \
        "docs/plan-reference.md is stale: run python -m pipeline.docgen > docs/plan-reference.md"


def test_plan_reference_is_deterministic():
    assert plan_reference() == plan_reference()


@pytest.mark.parametrize("name", sorted(builtin_passes()))
def test_every_option_of_every_builtin_pass_is_in_the_reference(name):
    section = pass_section(REFERENCE.read_text(), name)
    for info in describe(builtin_passes()[name].cls.Options):
        assert f"| `{info.name}` |" in section, f"option {name}.{info.name} is missing from the reference"


def test_reference_leaves_out_third_party_passes_unless_asked(sample_plugin):
    assert "### `strength-reduce`" not in plan_reference()
    assert "### `strength-reduce`" in plan_reference(include_plugins=True)


def public_callables() -> list[tuple[str, object]]:
    out = []
    for module in (pipeline, pipeline.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.append((f"{module.__name__}.{name}", obj))
    return out


@pytest.mark.parametrize("name,obj", public_callables(), ids=[n for n, _ in public_callables()])
def test_public_functions_and_classes_have_docstrings(name, obj):
    assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text


def plans_table_names(text: str) -> set[str]:
    """Names in the first column of the table under the README's built-in plans heading."""
    heading_then_body = r"^#+ [^\n]*plans[^\n]*$(.*?)(?=^#|\Z)"
    match = re.search(heading_then_body, text, flags=re.MULTILINE | re.IGNORECASE | re.DOTALL)
    assert match, "README.md has no section whose heading mentions plans"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    return {m for row in rows for m in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_readme_plan_table_lists_every_builtin_plan():
    listed = plans_table_names(README.read_text())
    for path in sorted((ROOT / "plans").glob("*.yaml")):
        assert path.stem in listed, f"plans/{path.name} is missing from README.md's plan table"
