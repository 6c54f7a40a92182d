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

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

import pipeline
import pipeline.testing
from build_checks import build_warnings
from conftest import installed_plugin
from pipeline.tools.cli import main as cli_main
from pipeline.tools.docgen import plan_reference
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
        "docs/plan-reference.md is stale: run python -m pipeline.tools.docgen > docs/plan-reference.md"


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


# -- the plugin guide's example plugin -----------------------------------------------------------
GUIDE = ROOT / "docs" / "plugin-guide.md"
GUIDE_FILES = ("pyproject.toml", "mul_to_add/__init__.py", "mul_to_add/plans/mul-to-add.yaml")


def guide_blocks() -> list[str]:
    """The bodies of the guide's fenced code blocks, in order."""
    return re.findall(r"^```\w*\n(.*?)^```", GUIDE.read_text(), flags=re.MULTILINE | re.DOTALL)


def guide_file(name: str) -> str:
    """The code block of the guide that starts with the comment ``# <name>``."""
    (body,) = [b for b in guide_blocks() if b.startswith(f"# {name}\n")]
    return body


def guide_block_defining(function: str) -> str:
    """The code block of the guide that defines ``function``."""
    (body,) = [b for b in guide_blocks() if f"\ndef {function}(" in b]
    return body


@pytest.fixture(scope="module")
def guide_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide's plugin written out as the files its code blocks name."""
    root = tmp_path_factory.mktemp("guide") / "pipeline-mul-to-add"
    for name in GUIDE_FILES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(guide_file(name))
    return root


@pytest.fixture(scope="module")
def guide_plugin(guide_source: Path, tmp_path_factory: pytest.TempPathFactory):
    """The guide's plugin installed with pip (into a temporary folder) and registered."""
    with installed_plugin(guide_source, tmp_path_factory.mktemp("guide-site"), distribution="pipeline-mul-to-add",
                          version="0.1.0", module="mul_to_add") as plugin:
        yield plugin


def test_plugin_guide_pyproject_builds_without_warnings(guide_source, tmp_path):
    assert build_warnings(guide_source, tmp_path) == []


def packaging_tables(pyproject: str) -> tuple[dict, str]:
    """The ``[build-system]`` table and the ``[tool.setuptools]`` tables with the plugin's module
    name replaced by MODULE, and that module."""
    data = tomllib.loads(pyproject)
    (module,) = data["project"]["entry-points"]["pipeline.plugins"].values()
    setuptools_tables = re.sub(rf"\b{re.escape(module)}\b", "MODULE", repr(data["tool"]["setuptools"]))
    return {"build-system": data["build-system"], "tool.setuptools": setuptools_tables}, module


@pytest.mark.parametrize("pyproject", sorted((ROOT / "examples").glob("*/pyproject.toml")),
                         ids=lambda p: p.parent.name)
def test_plugin_guide_pyproject_packages_the_plugin_as_the_examples_do(pyproject):
    guide, _ = packaging_tables(guide_file("pyproject.toml"))
    example, _ = packaging_tables(pyproject.read_text())
    assert guide == example


def test_plugin_guide_plugin_installs_and_registers_its_pass_and_plan(guide_plugin):
    registry = pipeline.get_registry()
    entry = registry.passes["mul-to-add"]
    assert str(entry.plugin) == "pipeline-mul-to-add 0.1.0 (mul_to_add)"
    assert Path(registry.plans["mul-to-add"].path).is_relative_to(guide_plugin.path)
    names = pipeline.load_plan("mul-to-add").pass_names()
    assert names[names.index("functionalize") + 1] == "mul-to-add"
    assert "mul-to-add  (v1, graph pass, from pipeline-mul-to-add 0.1.0 (mul_to_add))" in passes_command_output()


def test_plugin_guide_testing_examples_pass_against_its_plugin(guide_plugin):
    namespace: dict = {}
    for function in ("test_mul_to_add_preserves_semantics", "test_no_multiplication_by_two_is_left"):
        exec(compile(guide_block_defining(function), f"{GUIDE}:{function}", "exec"), namespace)
        namespace[function]()
