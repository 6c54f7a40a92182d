"""``verify: each`` catches a plugin pass that miscompiles or crashes, names it with its plugin,
and leaves a reproducer that ``pipeline repro`` replays and minimizes without changing the kind
of failure. The broken passes come from ``tests/plugins/pipeline_miscompile_plugin``, installed
like any third-party distribution."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.tools.cli import main
from pipeline.tools.minimize import shrink
from pipeline.tools.repro import Failure, load_reproducer, replay

DIST = "pipeline-miscompile-plugin 1.0.0 (pipeline_miscompile_plugin)"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def repro_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "repro"
    monkeypatch.setenv("PIPELINE_REPRO_DIR", str(folder))
    return folder


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    """A small real computation with one division among other ops."""
    y = torch.tanh(x) * 2.0 + x.square()
    return torch.softmax(y / 3.0, dim=-1) + y.mean(-1, keepdim=True)


def caught(plan: str | dict, fn=scaled_softmax) -> pipeline.PipelineError:
    compiled = pipeline.compile_with_plan(fn, plan, verify="each")
    with pytest.raises(pipeline.PipelineError) as info:
        compiled(torch.randn(4, 16, generator=torch.Generator().manual_seed(0)))
    return info.value


def test_miscompiling_plugin_pass_is_named_with_its_plugin_under_verify_each(miscompile_plugin, repro_dir):
    error = caught("miscompile-div")
    assert isinstance(error, pipeline.VerificationError)
    assert "pass 'div-to-mul' from plugin " + DIST + " changed the result" in str(error)
    assert (error.pass_name, error.plugin) == ("div-to-mul", DIST)
    assert Path(error.reproducer).parent == repro_dir


def test_mismatch_reproducer_holds_the_graph_the_pass_received_and_a_plan_ending_with_it(miscompile_plugin, repro_dir):
    folder = Path(caught("miscompile-div").reproducer)
    info = json.loads((folder / "repro.json").read_text())
    assert (info["pass"], info["plugin"], info["failure"]["kind"]) == ("div-to-mul", DIST, "mismatch")
    assert "aten.div.Tensor" in (folder / "graph.py").read_text()
    assert info["inputs_saved"] and (folder / "inputs.pt").is_file()
    plan = pipeline.load_plan(folder / "plan.yaml")
    assert plan.pass_names() == ["capture", "functionalize", "decompose", "div-to-mul"]
    assert "functional" in info["tags"]


def test_mismatch_reproducer_replays_from_the_command_line(miscompile_plugin, repro_dir, capsys):
    folder = caught("miscompile-div").reproducer
    assert main(["repro", folder]) == 1
    out = capsys.readouterr().out
    assert "recorded: mismatch" in out
    assert "reproduced: mismatch" in out


def test_mismatch_reproducer_minimizes_to_the_division_alone(miscompile_plugin, repro_dir, capsys):
    folder = caught("miscompile-div").reproducer
    before = len(load_reproducer(folder).graph.graph.nodes)
    assert main(["repro", folder, "--minimize"]) == 1
    minimized = load_reproducer(Path(folder) / "minimized")
    nodes = list(minimized.graph.graph.nodes)
    assert len(nodes) <= 4 < before
    assert [n.target for n in nodes if n.op == "call_function"] == [torch.ops.aten.div.Tensor]
    assert replay(minimized).kind == "mismatch"
    assert "minimized: " in capsys.readouterr().out


def test_crashing_plugin_pass_leaves_a_reproducer_that_keeps_its_exception_type(miscompile_plugin, repro_dir):
    plan = {"name": "crash", "passes": ["capture", "functionalize", "decompose", "reject-div", "dce"]}
    error = caught(plan)
    assert isinstance(error, pipeline.PassFailure)
    assert error.plugin == DIST and error.reproducer
    repro = load_reproducer(error.reproducer)
    assert repro.failure == Failure(kind="exception", message=repro.failure.message, exception_type="ValueError")
    seen = replay(repro)
    assert (seen.kind, seen.exception_type) == ("exception", "ValueError")
    assert main(["repro", error.reproducer, "--minimize"]) == 1
    minimized = load_reproducer(Path(error.reproducer) / "minimized")
    assert len(minimized.graph.graph.nodes) <= 4
    assert replay(minimized).exception_type == "ValueError"


def test_reproducer_records_the_distribution_and_version_of_the_pass_plugin(miscompile_plugin, repro_dir):
    info = json.loads((Path(caught("miscompile-div").reproducer) / "repro.json").read_text())
    assert (info["plugin_distribution"], info["plugin_version"]) == ("pipeline-miscompile-plugin", "1.0.0")


def test_replay_without_the_plugin_installed_names_the_distribution_to_install(miscompile_plugin, repro_dir,
                                                                              tmp_path):
    folder = caught("miscompile-div").reproducer
    # A new process does not see the plugin (it is on this process's sys.path only): as on a
    # machine where the reproducer was copied without installing the plugin.
    done = subprocess.run([sys.executable, "-m", "pipeline.tools.cli", "repro", folder], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"error: {folder}: unknown pass 'div-to-mul': repro.json records it as coming from plugin {DIST} "
        f"(distribution pipeline-miscompile-plugin version 1.0.0); install it "
        f"(pip install 'pipeline-miscompile-plugin==1.0.0') and replay again\n")


def test_replay_of_a_fixed_pass_says_not_reproduced(miscompile_plugin, repro_dir, capsys):
    folder = Path(caught("miscompile-div").reproducer)
    info = json.loads((folder / "repro.json").read_text())
    plan = (folder / "plan.yaml").read_text().replace("- div-to-mul", "- dce")
    (folder / "plan.yaml").write_text(plan)
    info["pass"] = "dce"
    (folder / "repro.json").write_text(json.dumps(info))
    assert main(["repro", str(folder)]) == 0
    assert "not reproduced" in capsys.readouterr().out


def test_minimizer_never_trades_the_failure_for_another_exception_type():
    aten = torch.ops.aten

    def fn(x):
        return aten.div.Tensor(aten.sin.default(x), 3.0)

    graph = torch.fx.symbolic_trace(fn)
    graph = torch.fx.GraphModule(graph, graph.graph)

    def check(gm, inputs):
        ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        if aten.div.Tensor in ops and aten.sin.default in ops:
            return Failure(kind="exception", message="both", exception_type="ValueError")
        if ops:
            return Failure(kind="exception", message="one", exception_type="KeyError")
        return None

    want = check(graph, [])
    result = shrink(graph, [torch.randn(8)], check, want)
    ops = {n.target for n in result.graph.graph.nodes if n.op == "call_function"}
    assert ops == {aten.div.Tensor, aten.sin.default}
    assert result.failure.exception_type == "ValueError"


def test_minimizer_keeps_values_so_value_dependent_mismatches_survive():
    aten = torch.ops.aten

    def fn(x):
        return aten.add.Tensor(aten.mul.Tensor(aten.exp.default(x), 0.0), 1.0)

    graph = torch.fx.symbolic_trace(fn)

    def check(gm, inputs):
        # "mismatch" only while some input of the graph is exactly zero everywhere
        return Failure(kind="mismatch", message="zeros") if any(
            isinstance(t, torch.Tensor) and t.numel() and bool((t == 0).all()) for t in inputs) else None

    x = torch.randn(5)
    result = shrink(graph, [x], check, Failure(kind="mismatch"))
    # Only a cut at the multiplication by zero gives an all-zero input; the result keeps it.
    assert result.failure.kind == "mismatch"
    assert any(bool((t == 0).all()) for t in result.inputs)


def test_verify_final_reproducer_replays_the_whole_plan_on_the_captured_graph(miscompile_plugin, repro_dir):
    compiled = pipeline.compile_with_plan(scaled_softmax, "miscompile-div", verify="final")
    with pytest.raises(pipeline.VerificationError, match="verify: final cannot tell which pass") as info:
        compiled(torch.randn(4, 16))
    repro = load_reproducer(info.value.reproducer)
    assert repro.info["replay_passes"] == [1, len(repro.plan.passes) - 1]
    assert (Path(info.value.reproducer) / "graph.py").read_text().startswith("# graph g0 as captured")
    assert replay(repro).kind == "mismatch"
