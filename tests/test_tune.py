"""``pipeline tune`` and ``pipeline profile`` on the CPU: the tuner measures the built-in plans and
the tunable options of the passes, discards what does not match eager, and writes the winner as a
plan extending its base; the profile attributes a compiled model's time to its kernels and extern
calls, with the user's source lines. (Timings are never asserted: only what was tried and written.)"""
from __future__ import annotations

import io
import textwrap

import attrs
import pytest
import torch
import yaml
from torch import nn

import pipeline
from pipeline import Pass, load_plan, option
from pipeline.tools.cli import main
from pipeline.tools.tune import Trial, tune

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        hidden = torch.nn.functional.gelu(self.up(x))           # the line the gelu kernel comes from
        return torch.softmax(self.down(hidden) + x, -1)


@attrs.frozen
class _SkewOptions:
    factor: float = option(1.0, "Multiply the graph's first output by this (1.0: no change).", tune=(1.0, 1.5))


class _Skew(Pass):
    """A test pass with a tunable option whose other value breaks the results."""

    name = "tune-test-skew"
    Options = _SkewOptions
    version = "1"

    def run(self, graph, context):
        if self.options.factor != 1.0:
            output = next(n for n in graph.graph.nodes if n.op == "output")
            first = output.args[0][0]
            with graph.graph.inserting_before(output):
                scaled = graph.graph.call_function(torch.ops.aten.mul.Tensor, (first, self.options.factor))
            output.args = ((scaled, *output.args[0][1:]),)
            graph.recompile()
        return graph


class _SkewPlugin:
    @pipeline.hookimpl
    def pipeline_register_passes(self):
        return [_Skew]


@pytest.fixture
def skew_plan(tmp_path):
    plugin = _SkewPlugin()
    pipeline.register_plugin(plugin)
    path = tmp_path / "skewed.yaml"
    path.write_text(textwrap.dedent("""
        name: skewed
        extends: default
        insert:
          - after: cse
            pass: tune-test-skew
    """))
    try:
        yield str(path)
    finally:
        pipeline.unregister_plugin(plugin)


def test_tune_writes_a_plan_extending_the_fastest_base_with_only_what_it_changed(tmp_path):
    model, x = Net().eval(), torch.randn(16, 32)
    out = tmp_path / "tuned.yaml"
    result = tune(model, x, budget=30.0, out=out, rounds=3, stream=io.StringIO())
    written = yaml.safe_load(out.read_text())
    assert written["extends"] == result.winner.base and written["name"] == "tuned-net"
    assert set(written) <= {"name", "extends", "description", "options"}
    assert written.get("options", {}) == result.winner.changes
    assert "ms per call" in written["description"] and "eager" in written["description"]
    load_plan(str(out))
    bases = [t for t in result.trials if not t.changes]
    assert [t.name for t in bases][:1] == ["default"] and all(t.ms is not None for t in bases if t.call)
    assert result.winner in bases or result.winner.verdict.endswith("kept")
    assert any(t.changes for t in result.trials), "no tunable option was tried"
    assert "<- chosen" in result.table()


def test_a_variant_that_differs_from_eager_is_discarded_with_the_reason(skew_plan):
    model, x = Net().eval(), torch.randn(8, 32)
    result = tune(model, x, base=skew_plan, budget=60.0, rounds=2, stream=io.StringIO())
    skewed = [t for t in result.trials if t.changes.get("tune-test-skew", {}).get("factor") == 1.5]
    assert skewed and skewed[0].verdict.startswith("mismatch"), [t.verdict for t in result.trials]
    assert result.winner.changes.get("tune-test-skew") is None


def test_tunable_options_are_declared_with_their_values_and_shown_in_the_reference():
    from pipeline.options import describe, tunable
    from passes.fuse import FuseOptions
    assert ("max_group_size", (16, 64, 256)) in tunable(FuseOptions)
    infos = {i.name: i for i in describe(FuseOptions)}
    assert infos["max_group_size"].tune == (16, 64, 256) and infos["reductions"].tune is None
    from pipeline.tools.docgen import plan_reference
    assert "`64` (tunable: `16`, `64`, `256`)" in plan_reference()


def test_a_trial_whose_code_equals_an_earlier_ones_is_not_timed_again():
    """On a CPU reduce-overhead compiles what default compiles (no CUDA graphs): one timing serves both."""
    model, x = Net().eval(), torch.randn(4, 32)
    result = tune(model, x, budget=5.0, rounds=2, stream=io.StringIO())
    twins = [t for t in result.trials if t.verdict.startswith("same code as")]
    assert twins and all(t.ms is not None for t in twins)


def test_profile_attributes_time_to_kernels_and_extern_calls_with_source_lines():
    model, x = Net().eval(), torch.randn(64, 32)
    report = pipeline.profile(model, x, calls=5)
    kinds = {u.kind for u in report.units}
    assert kinds == {"kernel", "extern"}, report.table()
    assert abs(sum(u.ms for u in report.units) - report.total_ms) < 1e-9
    gelu = [u for u in report.units if u.kind == "kernel" and any("gelu" in line for line in u.source)]
    assert gelu and gelu[0].source[0].startswith("test_tune.py:"), report.table()
    assert report.covering(0.95) and "test_tune.py" in report.table()


def test_cli_tune_and_profile_run_a_model_script(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(textwrap.dedent("""
        import torch
        def model_and_inputs():
            return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), (torch.randn(4, 16),)
    """))
    out = tmp_path / "plan.yaml"
    assert main(["tune", str(script), "--budget", "0", "--out", str(out), "--name", "mine"]) == 0
    assert yaml.safe_load(out.read_text())["name"] == "mine"
    assert "<- chosen" in capsys.readouterr().out
    assert main(["profile", str(script), "--calls", "2"]) == 0
    assert "ms per call" in capsys.readouterr().out


def test_trials_plans_raise_the_recompile_limit_only_while_tuning():
    trial = Trial("default + fuse.horizontal=false", "default", {"fuse": {"horizontal": False}})
    assert trial.plan() == {"extends": "default", "options": {"fuse": {"horizontal": False}}}
    assert trial.plan("capture")["options"]["capture"]["recompile_limit"] > 8


def test_a_profile_is_a_section_of_the_compile_report(tmp_path):
    import json
    model, x = Net().eval(), torch.randn(16, 32)
    pipeline.profile(model, x, calls=2, report=tmp_path)
    report = json.loads(next(tmp_path.rglob("report.json")).read_text())
    units = report["profile"]["units"]
    assert units and {u["kind"] for u in units} == {"kernel", "extern"}
    assert abs(sum(u["share"] for u in units) - 1.0) < 1e-6
    page = next(tmp_path.rglob("report.html")).read_text()
    assert "Profile per call" in page and "test_tune.py:" in page
