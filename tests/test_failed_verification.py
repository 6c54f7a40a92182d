"""What happens after a check fails: a graph that failed verification never runs again (every
later call raises again, or runs eagerly under ``on_error: eager``), is never stored in the
compile cache, and the errors blame only what they can know (a crashing plugin pass keeps its
own exception as the cause; ``verify: final`` names no pass). The broken passes come from
``tests/plugins/pipeline_miscompile_plugin``."""
from __future__ import annotations

import traceback
import warnings

import pytest
import torch

import pipeline
from pipeline.numerics import compare


@pytest.fixture(autouse=True)
def _fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_REPRO_DIR", str(tmp_path / "repro"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) / 3.0 + x


@pytest.mark.parametrize("verify", ["each", "final"])
def test_every_later_call_of_a_graph_that_failed_verification_raises_again(miscompile_plugin, verify):
    compiled = pipeline.compile_with_plan(scaled, "miscompile-div", verify=verify)
    x = torch.randn(4, 16)
    for _ in range(3):
        with pytest.raises(pipeline.VerificationError):
            compiled(x)
    with pytest.raises(pipeline.VerificationError):
        compiled(torch.randn(4, 16))      # fresh values, same graph


@pytest.mark.parametrize("verify", ["each", "final"])
def test_a_graph_that_failed_verification_runs_eagerly_under_on_error_eager(miscompile_plugin, verify):
    compiled = pipeline.compile_with_plan(scaled, "miscompile-div", verify=verify, on_error="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            x = torch.randn(4, 16)
            assert compare(scaled(x), compiled(x)) is None
    fallbacks = pipeline.compilation_of(compiled).summary()["fallbacks"]
    assert [f["graph"] for f in fallbacks] == ["g0"]
    assert "verification failed" in fallbacks[0]["reason"]


def test_a_graph_that_failed_verification_is_not_stored_in_the_cache(miscompile_plugin, tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)     # the suite turns the graph cache off
    plan = {"extends": "miscompile-div", "verify": "final", "cache": {"dir": str(tmp_path / "cache")}}
    first = pipeline.compile_with_plan(scaled, plan)
    with pytest.raises(pipeline.VerificationError):
        first(torch.randn(4, 16))
    assert pipeline.compilation_of(first).graphs[0].cache["stored"] is False
    second = pipeline.compile_with_plan(scaled, plan)     # the same graph again: compiled, checked, refused
    with pytest.raises(pipeline.VerificationError):
        second(torch.randn(4, 16))
    assert pipeline.compilation_of(second).graphs[0].cache["status"] == "miss"


def test_a_verified_graph_is_stored_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    compiled = pipeline.compile_with_plan(scaled, "default", verify="final", cache={"dir": str(tmp_path)})
    compiled(torch.randn(4, 16))
    record = pipeline.compilation_of(compiled).graphs[0]
    assert record.verified.startswith("passed") and record.cache["stored"] is True


def test_verify_final_blames_no_pass_and_no_plugin(miscompile_plugin):
    compiled = pipeline.compile_with_plan(scaled, "miscompile-div", verify="final")
    with pytest.raises(pipeline.VerificationError) as info:
        compiled(torch.randn(4, 16))
    assert (info.value.pass_name, info.value.plugin) == (None, None)
    assert "cannot tell which pass" in str(info.value)


def test_a_crashing_plugin_pass_keeps_its_own_exception_as_the_cause(miscompile_plugin):
    plan = {"name": "crash", "passes": ["capture", "functionalize", "decompose", "reject-div"]}
    compiled = pipeline.compile_with_plan(scaled, plan)
    with pytest.raises(pipeline.PassFailure) as info:
        compiled(torch.randn(4, 16))
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and "reject-div cannot handle" in str(cause)
    frames = traceback.extract_tb(cause.__traceback__)
    assert any("pipeline_miscompile_plugin" in frame.filename for frame in frames), frames


class WithDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.dropout(self.linear(x)), p=0.2, training=self.training)


def test_dropout_in_eval_mode_is_verified_like_any_other_graph():
    compiled = pipeline.compile_with_plan(WithDropout().eval(), "debug")
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    assert pipeline.compilation_of(compiled).graphs[0].verified.startswith("passed")


def test_dropout_in_training_mode_is_skipped_naming_the_random_operator():
    compiled = pipeline.compile_with_plan(WithDropout().train(), "debug")
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    verified = pipeline.compilation_of(compiled).graphs[0].verified
    assert verified.startswith("skipped: the graph uses random operators") and "dropout" in verified
