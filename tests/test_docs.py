"""The documentation stays true to the code: the plan reference is generated and committed, public
names have docstrings, and the README names the two commands and every built-in plan."""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import pkgutil
import re
from pathlib import Path

import pytest
import yaml

import pipeline
import pipeline.testing
from pipeline.cli import main as cli_main
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


def public_modules() -> list:
    """``pipeline`` and every module under it whose dotted name has no part starting with ``_``."""
    names = ["pipeline"] + [m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.")]
    return [importlib.import_module(n) for n in names
            if not any(part.startswith("_") for part in n.split("."))]


def public_callables() -> list[tuple[str, object]]:
    """Every public function and class: the names ``pipeline`` and ``pipeline.testing`` export, and
    the functions and classes each public module defines (names without a leading ``_``), with
    the public methods and properties of those classes."""
    found: dict[str, object] = {}
    for module in (pipeline, pipeline.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found[f"{module.__name__}.{name}"] = obj
    for module in public_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # imported from elsewhere: checked where it is defined
            found[f"{module.__name__}.{name}"] = obj
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if member.startswith("_"):
                        continue
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if inspect.isfunction(value) or isinstance(value, property):
                        found[f"{module.__name__}.{name}.{member}"] = (obj, member)
    return sorted(found.items())


def docstring(obj: object) -> str:
    """The docstring of a function or class; a method or property also counts as documented when
    it overrides a documented one of a base class (``inspect.getdoc`` rules)."""
    if isinstance(obj, tuple):
        cls, member = obj
        value = inspect.getattr_static(cls, member)
        if isinstance(value, property):
            doc = value.__doc__ or ""
            for base in cls.__mro__[1:]:
                doc = doc or getattr(inspect.getattr_static(base, member, None), "__doc__", None) or ""
            return doc.strip()
        return (inspect.getdoc(getattr(cls, member)) or "").strip()
    return (obj.__doc__ or "").strip()


@pytest.mark.parametrize("name,obj", public_callables(), ids=[n for n, _ in public_callables()])
def test_public_functions_and_classes_have_docstrings(name, obj):
    assert docstring(obj), f"{name} has no docstring"


def test_every_public_module_has_a_docstring():
    assert [m.__name__ for m in public_modules() if not (m.__doc__ or "").strip()] == []


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text


def plans_table_names(text: str, heading: str = "plans") -> set[str]:
    """Names in the first column of the table under the README's heading that mentions ``heading``."""
    heading_then_body = rf"^#+ [^\n]*{heading}[^\n]*$(.*?)(?=^#|\Z)"
    match = re.search(heading_then_body, text, flags=re.MULTILINE | re.IGNORECASE | re.DOTALL)
    assert match, f"README.md has no section whose heading mentions {heading}"
    rows = [line for line in match.group(1).splitlines() if line.startswith("|")]
    return {m for row in rows for m in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_readme_pass_table_lists_every_builtin_pass():
    listed = plans_table_names(README.read_text(), heading="passes")
    assert sorted(set(builtin_passes()) - listed) == []


def test_readme_plan_table_lists_every_builtin_plan():
    listed = plans_table_names(README.read_text())
    for path in sorted((ROOT / "plans").glob("*.yaml")):
        assert path.stem in listed, f"plans/{path.name} is missing from README.md's plan table"


# -- one page per built-in plan ------------------------------------------------------------------
PLAN_FILES = sorted((ROOT / "plans").glob("*.yaml"))


@pytest.mark.parametrize("path", PLAN_FILES, ids=[p.stem for p in PLAN_FILES])
def test_every_builtin_plan_has_a_page_that_shows_its_file_and_names_its_passes(path):
    page = ROOT / "docs" / "plans" / f"{path.stem}.md"
    assert page.is_file(), f"plans/{path.name} has no page docs/plans/{page.name}"
    text = page.read_text()
    shown = re.search(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert shown, f"docs/plans/{page.name} does not show the plan file"
    plan_file = yaml.safe_load(path.read_text())
    plan_file.pop("description", None)
    assert yaml.safe_load(shown.group(1)) == plan_file, f"docs/plans/{page.name} shows a stale plan file"
    for name in pipeline.load_plan(path.stem).pass_names():
        assert re.search(rf"`{re.escape(name)}[`:]", text), f"docs/plans/{page.name} never mentions pass '{name}'"


# -- the reference and `pipeline passes` say the same ----------------------------------------------
def passes_command_output() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["passes"]) == 0
    return out.getvalue()


def reference_rows(section: str) -> dict[str, tuple[str, str]]:
    """{option: (type, doc)} from a pass's options table in the reference."""
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0] != "`option`":
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[3])
    return rows


def command_rows(block: str) -> dict[str, tuple[str, str]]:
    """{option: (type, doc)} from one pass's block of ``pipeline passes``."""
    lines = block.splitlines()
    rows = {}
    for index, line in enumerate(lines):
        match = re.match(r"^    (\w+): (.*) = .*$", line)
        if match and index + 1 < len(lines) and lines[index + 1].startswith("        "):
            rows[match.group(1)] = (match.group(2), lines[index + 1].strip())
    return rows


@pytest.mark.parametrize("name", sorted(builtin_passes()))
def test_passes_command_prints_the_option_docs_of_the_reference(name):
    reference = REFERENCE.read_text()
    (block,) = [b for b in passes_command_output().split("\n\n") if b.startswith(f"{name}  (")]
    rows = reference_rows(pass_section(reference, name))
    assert sorted(rows) == sorted(info.name for info in describe(builtin_passes()[name].cls.Options))
    assert command_rows(block) == rows
    first_paragraph = " ".join((builtin_passes()[name].cls.__doc__ or "").strip().split("\n\n")[0].split())
    assert first_paragraph in " ".join(pass_section(reference, name).split())


# -- links ---------------------------------------------------------------------------------------
DOC_FILES = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]


@pytest.mark.parametrize("doc", DOC_FILES, ids=[str(d.relative_to(ROOT)) for d in DOC_FILES])
def test_relative_links_point_to_existing_files(doc):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
