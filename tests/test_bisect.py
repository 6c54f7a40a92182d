"""``pipeline bisect`` names the first pass after which a model's compiled output differs from
eager, and, for a pass that supports fuel, its first bad rewrite."""
from __future__ import annotations

import contextlib
import io
import re
import textwrap

import pytest
import torch

import pipeline
from pipeline.tools.bisect import load_target
from pipeline.tools.cli import main

DIST = "pipeline-miscompile-plugin 1.0.0 (pipeline_miscompile_plugin)"

MODEL_FILE = textwrap.dedent('''
    import torch

    class Scaled(torch.nn.Module):
        """x / 1.0 survives the broken rewrite (x * 1.0 is the same); y / 4.0 does not."""

        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x):
            y = torch.relu(self.proj(x)) / 1.0
            return torch.softmax(y / 4.0, dim=-1)

    def model_and_inputs():
        torch.manual_seed(0)
        return Scaled().eval(), (torch.randn(8, 16),)

    def fine():
        return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU()).eval(), torch.randn(4, 16)
''')


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "scaled_model.py"
    path.write_text(MODEL_FILE)
    return path


@pytest.fixture(scope="module")
def bisect_command(miscompile_plugin, tmp_path_factory) -> tuple[int, str]:
    """Exit status and output of ``pipeline bisect`` on the model file with the broken plan."""
    path = tmp_path_factory.mktemp("bisect") / "scaled_model.py"
    path.write_text(MODEL_FILE)
    out = io.StringIO()
    with torch.no_grad(), contextlib.redirect_stdout(out):
        status = main(["bisect", str(path), "--plan", "miscompile-div"])
    return status, out.getvalue()


def test_bisect_command_names_the_miscompiling_pass_and_its_plugin(bisect_command):
    status, out = bisect_command
    assert status == 1
    assert (f"first bad pass: 'div-to-mul' (pass 3 of plan 'miscompile-div', counting capture as 0; "
            f"from plugin {DIST})") in out


def test_bisect_table_numbers_each_pass_as_the_verdict_does(bisect_command):
    _, out = bisect_command
    names = pipeline.load_plan("miscompile-div").pass_names()
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+\s", line)]
    assert [(int(row[0]), row[1]) for row in rows] == list(enumerate(names))[:len(rows)]
    (culprit,) = [row for row in rows if row[2].startswith("mismatch")]
    (verdict,) = [line for line in out.splitlines() if line.startswith("first bad pass: ")]
    assert verdict.startswith(f"first bad pass: '{culprit[1]}' (pass {culprit[0]} of plan")


def test_bisect_runs_prefixes_until_the_first_mismatch(miscompile_plugin, model_file):
    model, inputs = load_target(str(model_file))
    with torch.no_grad():
        result = pipeline.bisect(model, *inputs, plan="miscompile-div")
    assert [s.last_pass for s in result.steps] == ["capture", "functionalize", "decompose", "div-to-mul"]
    assert [s.outcome for s in result.steps] == ["match", "match", "match", "mismatch"]
    assert (result.culprit, result.position) == ("div-to-mul", 3)


def test_bisect_fuel_finds_the_first_rewrite_that_changes_the_result(miscompile_plugin, model_file):
    model, inputs = load_target(str(model_file))
    with torch.no_grad():
        result = pipeline.bisect(model, *inputs, plan="miscompile-div")
    assert (result.fuel.rewrite, result.fuel.total) == (2, 2)
    assert "4.0" in result.fuel.description


def test_bisect_of_a_correct_plan_finds_nothing(model_file, capsys):
    with torch.no_grad():
        status = main(["bisect", f"{model_file}:fine", "--plan", "default"])
    assert status == 0
    assert "matches eager; nothing to bisect" in capsys.readouterr().out


def test_bisect_target_without_the_factory_is_a_clear_error(model_file, capsys):
    assert main(["bisect", f"{model_file}:missing"]) == 2
    assert "has no function 'missing' returning (model, inputs)" in capsys.readouterr().err


def test_fuel_limits_how_many_rewrites_a_pass_makes():
    def twice(x):
        return torch.sin(x) + torch.sin(x) + torch.cos(x) + torch.cos(x)

    plan = pipeline.load_plan("debug")
    for limit, merged in ((None, 2), (1, 1), (0, 0)):
        torch._dynamo.reset()
        fuel = pipeline.Fuel({"cse": limit})
        compiled = pipeline.api.compile_under(twice, pipeline.compilation.Compilation(
            plan, pipeline.get_registry(), fuel=fuel))
        x = torch.randn(8)
        assert torch.allclose(compiled(x), twice(x))
        assert fuel.used.get("cse", 0) == merged
        assert [n["message"] for n in pipeline.compilation_of(compiled).graphs[0].notes
                if n["pass"] == "cse"] == ([f"merged {merged} duplicate node(s)"] if merged else [])
    assert fuel.spent == {}
    assert pipeline.get_registry().passes["cse"].cls.uses_fuel
