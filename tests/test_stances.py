"""Compiler stances (``pipeline.stance``, ``capture.stance``, ``shapes.after_warmup``), the
recompile-limit policy, and torch.compile's mode names as aliases of the built-in plans."""
from __future__ import annotations

import pytest
import torch

import pipeline
from pipeline import PlanError, RecompileError, compilation_of, compile_with_plan, plan_of
from pipeline.numerics import compare


def make_double():
    """A fresh function per test: Dynamo keeps compiled variants per code object."""
    def double(x):
        return x * 2 + 1
    double.__code__ = double.__code__.replace(co_name=f"double_{make_double.count}")
    make_double.count += 1
    return double


make_double.count = 0

STATIC = {"options": {"capture": {"dynamic": False}}}


# -- pipeline.stance -------------------------------------------------------------------------------

def test_force_eager_as_a_context_manager_runs_eagerly_and_is_restored():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", **STATIC)
    x = torch.randn(4)
    with pipeline.stance("force_eager"):
        assert compare(fn(x), compiled(x)) is None
    assert compilation_of(compiled).graphs == []
    compiled(x)
    assert len(compilation_of(compiled).graphs) == 1


def test_stance_as_a_function_holds_until_set_back():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", **STATIC)
    pipeline.stance("force_eager")
    try:
        compiled(torch.randn(3))
        assert compilation_of(compiled).graphs == []
    finally:
        pipeline.stance("default")
    compiled(torch.randn(3))
    assert len(compilation_of(compiled).graphs) == 1


def test_eager_on_recompile_runs_a_new_shape_eagerly_without_compiling():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", **STATIC)
    compiled(torch.randn(3))
    with pipeline.stance("eager_on_recompile"):
        x = torch.randn(5)
        assert compare(fn(x), compiled(x)) is None
        compiled(torch.randn(3))
    assert len(compilation_of(compiled).graphs) == 1
    assert compilation_of(compiled).recompiles == []


def test_fail_on_recompile_names_the_guard_that_failed():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", **STATIC)
    compiled(torch.randn(3))
    with pipeline.stance("fail_on_recompile"), pytest.raises(RecompileError) as info:
        compiled(torch.randn(5))
    assert "size mismatch at index 0. expected 3, actual 5" in str(info.value)


def test_an_unknown_stance_lists_the_valid_ones():
    with pytest.raises(pipeline.PipelineError, match="unknown stance 'eager'.*force_eager"):
        pipeline.stance("eager")


def test_a_callers_stance_wins_over_the_plans_capture_stance():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", options={"capture": {"stance": "fail_on_recompile"}})
    with pytest.raises(RecompileError):
        compiled(torch.randn(3))
    with pipeline.stance("force_eager"):
        x = torch.randn(3)
        assert compare(fn(x), compiled(x)) is None


# -- after warm-up ---------------------------------------------------------------------------------

def bucketed(after: str) -> dict:
    return {"name": "p", "extends": "default", "options": {"capture": {"dynamic": False}},
            "shapes": {"buckets": {"x": {0: [4, 8]}}, "outputs": {0: {0: "x.0"}}, "warmup": True,
                       "after_warmup": after}}


def scale(x, y):
    return x * y.sum()


def test_after_warmup_fail_on_recompile_names_the_guard_of_an_unbucketed_input():
    compiled = compile_with_plan(scale, bucketed("fail_on_recompile"))
    compiled(torch.randn(3), torch.randn(2))
    assert compilation_of(compiled).warmup["combinations"] == 2
    compiled(torch.randn(7), torch.randn(2))          # within the buckets: no recompile
    with pytest.raises(RecompileError) as info:
        compiled(torch.randn(3), torch.randn(6))      # y is not bucketed: a new variant
    message = str(info.value)
    assert "after warm-up" in message and "shapes.after_warmup: fail_on_recompile" in message
    assert "tensor 'y' size mismatch at index 0. expected 2, actual 6" in message


def test_after_warmup_eager_on_recompile_runs_new_shapes_eagerly():
    def shift(x, y):
        return x + y.mean()

    compiled = compile_with_plan(shift, bucketed("eager_on_recompile"))
    compiled(torch.randn(3), torch.randn(2))
    graphs = len(compilation_of(compiled).graphs)
    x, y = torch.randn(5), torch.randn(9)
    assert compare(shift(x, y), compiled(x, y)) is None
    assert len(compilation_of(compiled).graphs) == graphs


def test_a_callers_stance_wins_over_after_warmup():
    def offset(x, y):
        return x - y.max()

    compiled = compile_with_plan(offset, bucketed("fail_on_recompile"))
    compiled(torch.randn(3), torch.randn(2))
    with pipeline.stance("eager_on_recompile"):
        x, y = torch.randn(3), torch.randn(6)
        assert compare(offset(x, y), compiled(x, y)) is None


# -- the recompile limit ---------------------------------------------------------------------------

def test_recompile_limit_error_policy_raises_naming_the_limit():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", options={"capture": {
        "dynamic": False, "recompile_limit": 1, "on_recompile_limit": "error"}})
    compiled(torch.randn(3))
    with pytest.raises(RecompileError, match="recompile_limit 1"):
        compiled(torch.randn(4))


def test_recompile_limit_warn_policy_warns_naming_the_guard_and_runs_eagerly():
    fn = make_double()
    compiled = compile_with_plan(fn, "default", options={"capture": {
        "dynamic": False, "recompile_limit": 1, "on_recompile_limit": "warn"}})
    compiled(torch.randn(3))
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="hit its recompile limit") as caught:
        assert compare(fn(x), compiled(x)) is None
    assert "size mismatch at index 0. expected 3, actual 4" in str(caught[0].message)
    assert len(compilation_of(compiled).graphs) == 1


def test_declared_buckets_do_not_count_against_the_recompile_limit():
    compiled = compile_with_plan(make_double(), {
        "name": "p", "extends": "default", "options": {"capture": {"dynamic": False, "recompile_limit": 1}},
        "shapes": {"buckets": {0: {0: [1, 2, 3, 4, 5]}}, "outputs": {0: {0: "0.0"}}, "warmup": True}})
    compiled(torch.randn(2))
    assert compilation_of(compiled).warmup["graphs_compiled"] == 5


# -- mode aliases ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_mode_names_load_the_plan_of_that_name(mode):
    compiled = compile_with_plan(make_double(), mode=mode)
    assert plan_of(compiled) == pipeline.load_plan(mode)
    assert plan_of(compiled).name == mode


def test_reduce_overhead_mode_adds_cudagraphs_to_the_default_plan():
    names = plan_of(compile_with_plan(make_double(), mode="reduce-overhead")).pass_names()
    assert names == pipeline.load_plan("default").pass_names() + ["cudagraphs"]


def test_an_unknown_mode_suggests_the_nearest():
    with pytest.raises(PlanError, match="unknown mode 'reduce_overhead'; did you mean 'reduce-overhead'"):
        compile_with_plan(make_double(), mode="reduce_overhead")


def test_a_plan_and_a_mode_together_are_refused():
    with pytest.raises(PlanError, match="not both"):
        compile_with_plan(make_double(), "debug", mode="max-autotune")


def test_after_warmup_stance_applies_to_the_export_frontend_too():
    def halve(x, y):
        return x / 2 + y

    plan = bucketed("fail_on_recompile")
    plan["options"] = {"capture": {"frontend": "export"}}
    compiled = compile_with_plan(halve, plan)
    with torch.no_grad():
        compiled(torch.randn(3), torch.randn(1))
        assert compilation_of(compiled).warmup["graphs_compiled"] == 2
        x = torch.randn(6)
        assert compare(halve(x, torch.ones(1)), compiled(x, torch.ones(1))) is None
        with pytest.raises(RecompileError, match="input 1 was"):
            compiled(torch.randn(3), torch.randn(2))
