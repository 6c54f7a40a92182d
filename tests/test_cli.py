"""The ``pipeline`` command: ``passes`` documents every registered pass and option;
``plan validate`` reports bad plans as ``file:line: key: reason`` and never as a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import get_registry, load_plan
from pipeline.tools.cli import main
from pipeline.options import describe

REPO = Path(__file__).resolve().parents[1]
REGISTRY = get_registry()


@pytest.fixture(scope="module")
def passes_output() -> str:
    """What ``pipeline passes`` prints (run in-process: the console script calls the same main)."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["passes"]) == 0
    return out.getvalue()


def section(output: str, pass_name: str) -> str:
    """The block of ``pipeline passes`` output about one pass."""
    blocks = output.split("\n\n")
    (found,) = [b for b in blocks if b.startswith(f"{pass_name}  (")]
    return found


@pytest.mark.parametrize("name", sorted(REGISTRY.passes))
def test_passes_lists_every_registered_pass_with_version_stage_and_plugin(passes_output, name):
    entry = REGISTRY.passes[name]
    head = section(passes_output, name).splitlines()[0]
    assert head == f"{name}  (v{entry.cls.version}, {entry.cls.stage} pass, from {entry.plugin})"


@pytest.mark.parametrize("name", sorted(REGISTRY.passes))
def test_passes_shows_each_option_with_type_default_and_doc(passes_output, name):
    lines = section(passes_output, name).splitlines()
    for info in describe(REGISTRY.passes[name].cls.Options):
        prefix = f"    {info.name}: {info.type} = "
        (index,) = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert yaml.safe_load(lines[index][len(prefix):]) == info.default
        assert lines[index + 1] == f"        {info.doc}"


@pytest.mark.parametrize("name", sorted(REGISTRY.passes))
def test_passes_shows_the_first_paragraph_of_the_pass_doc(passes_output, name):
    doc = REGISTRY.passes[name].cls.__doc__ or ""
    first_paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    if not first_paragraph:
        pytest.skip(f"pass '{name}' has no docstring")
    assert section(passes_output, name).splitlines()[1] == f"    {first_paragraph}"


def test_passes_writes_defaults_as_yaml(passes_output):
    capture = section(passes_output, "capture")
    for line in ("    fullgraph: bool = false", "    dynamic: bool | null = null",
                 "    frontend: dynamo | export = dynamo", "    recompile_limit: int = 8"):
        assert line in capture.splitlines()
    assert "    keep: list[str] = []" in section(passes_output, "decompose").splitlines()


def test_passes_shows_requires_provides_and_invalidates(passes_output):
    assert "    requires: functional   provides: -   invalidates: -" in section(passes_output, "cse").splitlines()


def test_passes_shows_the_tags_a_pass_invalidates(passes_output):
    assert "    requires: aten   provides: -   invalidates: functional" in \
        section(passes_output, "reinplace").splitlines()


@pytest.mark.parametrize("name", sorted(REGISTRY.passes))
def test_passes_tag_line_names_every_invalidated_tag(passes_output, name):
    cls = REGISTRY.passes[name].cls
    lines = [line for line in section(passes_output, name).splitlines() if line.startswith("    requires: ")]
    if not (cls.requires or cls.provides or cls.invalidates):
        assert lines == []
        return
    (line,) = lines
    assert line.endswith(f"   invalidates: {', '.join(sorted(cls.invalidates)) or '-'}")


def test_validate_accepts_good_plans_and_lists_their_passes(capsys):
    assert main(["plan", "validate", "default", str(REPO / "plans" / "llm-serving.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    names = load_plan("default").pass_names()
    assert out[0] == f"ok: default (plan 'default', {len(names)} passes: {' -> '.join(names)})"
    assert out[1].startswith(f"ok: {REPO / 'plans' / 'llm-serving.yaml'} (plan 'llm-serving'")


def test_validate_reports_every_bad_plan_and_still_checks_the_rest(tmp_path, capsys):
    first = tmp_path / "first.yaml"
    first.write_text("name: p\npasses: [capture]\nverify: maybe\n")
    second = tmp_path / "second.yaml"
    second.write_text("name: q\npasses:\n  - capture\n  - functionalise\n")
    assert main(["plan", "validate", str(first), "default", str(second)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: {first}:3: verify: expected one of off, final, each, got string 'maybe'",
        f"error: {second}:4: passes[1]: unknown pass 'functionalise'; did you mean 'functionalize'?",
    ]
    assert captured.out.startswith("ok: default ")


def test_resolve_of_a_bad_plan_is_an_error_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\nextends: defualt\n")
    assert main(["plan", "resolve", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"error: {bad}:2: extends: no plan named 'defualt'; did you mean 'default'? "
                            f"(or give a path to a .yaml file)\n")


def test_validate_command_exits_1_with_a_located_message_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\npasses:\n  - capture\n  - functionalize\n  - decompose: {kep: []}\n")
    done = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "plan", "validate", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr == (f"error: {bad}:5: passes[2].decompose.kep: unknown option 'kep'; "
                           f"did you mean 'keep'?\n")
    assert done.stdout == ""
