"""``PIPELINE_LOGS`` / :func:`pipeline.set_logs`: topic logs through the standard ``logging``
module, one logger per topic (``pipeline.fusion`` ...), printed to standard error when enabled."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.logs import TOPICS, parse_spec

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean():
    torch._dynamo.reset()
    yield
    pipeline.set_logs(None)
    torch._dynamo.reset()


def branchy(x):
    y = torch.softmax(x, -1) * 2
    if y.sum().item() > 0:
        return y.cos()
    return y.tanh()


def run(fn=branchy, *sizes, **options):
    compiled = pipeline.compile_with_plan(fn, "default", options={"capture": {"dynamic": False, **options}})
    for size in sizes or (16,):
        compiled(torch.randn(size))


def lines(text: str, topic: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"[pipeline.{topic}] ")]


def test_spec_turns_topics_on_at_info_and_plus_at_debug():
    assert parse_spec("passes, +fusion") == {"passes": logging.INFO, "fusion": logging.DEBUG}
    assert parse_spec("+all") == {topic: logging.DEBUG for topic in TOPICS}


def test_only_the_enabled_topics_print(capsys):
    pipeline.set_logs("fusion")
    run()
    err = capsys.readouterr().err
    assert any("fused group(s)" in line for line in lines(err, "fusion"))
    assert any(" group fused_0 (" in line for line in lines(err, "fusion"))
    assert lines(err, "passes") == [] and lines(err, "codegen") == []


def test_passes_topic_gives_each_pass_time_and_node_counts(capsys):
    pipeline.set_logs("passes")
    run()
    err = capsys.readouterr().err
    assert any(line.startswith("[pipeline.passes] g0 functionalize: ") and " nodes" in line
               for line in err.splitlines())


def test_graph_breaks_topic_names_the_source_line(capsys):
    pipeline.set_logs("graph_breaks")
    run()
    (line,) = lines(capsys.readouterr().err, "graph_breaks")
    assert "test_logs.py" in line and "if y.sum().item() > 0:" in line


def test_recompiles_and_guards_topics(capsys):
    pipeline.set_logs("recompiles,+guards")
    run(branchy, 16, 12)
    err = capsys.readouterr().err
    assert any("size mismatch" in line for line in lines(err, "recompiles"))
    assert any("TENSOR_MATCH L['x']" in line for line in lines(err, "guards"))


def test_codegen_at_debug_prints_kernel_source_and_cache_outcome_is_logged(capsys):
    pipeline.set_logs("+codegen,cache,passes,cudagraphs")
    run()
    err = capsys.readouterr().err
    assert any("kernel cpp_fused_0 (cpp," in line for line in lines(err, "codegen"))
    assert "source:\n" in err and "extern \"C\"" in err
    assert any("does not run under CUDA graphs" in line for line in lines(err, "cudagraphs"))
    assert any("C++ kernel(s)" in line for line in err.splitlines())


def test_turning_logs_off_silences_them(capsys):
    pipeline.set_logs("all")
    pipeline.set_logs(None)
    run()
    assert "[pipeline." not in capsys.readouterr().err


def test_a_misspelt_topic_warns_with_the_nearest_name():
    with pytest.warns(UserWarning, match="unknown log topic 'fusoin'; did you mean 'fusion'"):
        pipeline.set_logs("fusoin")


def test_plugins_log_under_their_own_topic(capsys):
    pipeline.set_logs("my_plugin")
    pipeline.get_logger("my_plugin").info("hello from a plugin")
    assert "[pipeline.my_plugin] hello from a plugin" in capsys.readouterr().err


def test_environment_variable_is_read_at_import():
    env = dict(os.environ, PIPELINE_LOGS="passes")
    code = ("import torch, pipeline\n"
            "pipeline.compile_with_plan(lambda x: torch.relu(x) * 2, 'default')(torch.randn(4))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[pipeline.passes] g0 functionalize: " in done.stderr
