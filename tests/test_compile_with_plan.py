"""End-to-end behaviour of compile_with_plan on CPU, against eager PyTorch."""
from __future__ import annotations

import warnings

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan
from pipeline.tools.demo import ExampleMLP
from pipeline.numerics import compare


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def branchy(x):
    y = torch.sin(x) * 2
    if y.sum().item() > 0:
        return y.cos()
    return y.tanh()


class Counter(torch.nn.Module):
    """Updates a buffer in place on every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(8))
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return self.proj(x) * self.total


def test_mlp_matches_eager_under_debug_plan():
    model = ExampleMLP().eval()
    compiled = compile_with_plan(model, "plans/debug.yaml")
    for seed in range(2):
        x = torch.randn(128, 256, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            assert compare(model(x), compiled(x)) is None
    record = compilation_of(compiled).graphs[0]
    assert record.verified.startswith("passed")
    assert [p["pass"] for p in record.passes] == compilation_of(compiled).plan.pass_names()[1:]


def test_compiled_module_keeps_state_dict_keys_and_shares_parameters():
    model = ExampleMLP()
    compiled = compile_with_plan(model, "debug")
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert not any(k.startswith("_orig_mod") for k in compiled.state_dict())
    assert all(a is b for a, b in zip(compiled.parameters(), model.parameters()))
    assert isinstance(compiled, ExampleMLP)


def test_compiled_module_sees_later_parameter_updates():
    model = ExampleMLP().eval()
    compiled = compile_with_plan(model, "debug")
    x = torch.randn(4, 256)
    with torch.no_grad():
        before = compiled(x)
        model.layers[0].weight.mul_(0.5)
        model.layers[7].bias.add_(1.0)
        after = compiled(x)
        assert compare(model(x), after) is None
    assert compare(before, after) is not None


def test_item_branch_gives_two_graphs_and_one_break_with_reason():
    compiled = compile_with_plan(branchy, "debug")
    x = torch.randn(64)
    assert compare(branchy(x), compiled(x)) is None
    comp = compilation_of(compiled)
    assert comp.summary()["graph_count"] == 2
    assert len(comp.graph_breaks) == 1
    assert "data-dependent branching" in comp.graph_breaks[0].lower()   # capture.data_dependent: item() is captured


def test_a_branch_on_a_tensor_is_one_graph_break():
    """``if tensor:`` splits the graph like ``.item()`` does; torch 2.13's own graph-break counter
    leaves this one out (it counts it as an unsupported operation)."""
    def branch_on_tensor(x):
        y = x.sin()
        if y.sum() > 0:
            return y * 2
        return y - 1
    compiled = compile_with_plan(branch_on_tensor, "debug")
    x = torch.randn(64)
    assert compare(branch_on_tensor(x), compiled(x)) is None
    comp = compilation_of(compiled)
    assert comp.summary()["graph_count"] == 2
    assert len(comp.graph_breaks) == 1 and comp.graph_breaks[0].startswith("Data-dependent branching")


def test_buffer_updated_in_place_matches_eager():
    torch.manual_seed(0)
    eager, model = Counter(), Counter()
    model.load_state_dict(eager.state_dict())
    compiled = compile_with_plan(model, "debug")
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(4, 8)
            assert compare(eager(x), compiled(x)) is None, step
    assert compare(eager.total, model.total) is None
    assert model.total.abs().sum() > 0


def test_fullgraph_break_is_a_clear_error_naming_the_line():
    compiled = compile_with_plan(branchy, "debug", options={"capture": {"fullgraph": True}})
    with pytest.raises(pipeline.GraphBreakError) as info:
        compiled(torch.randn(16))
    message = str(info.value)
    assert "fullgraph: true" in message
    assert "test_compile_with_plan.py" in message
    assert "y.sum().item()" in message


def test_gradients_match_eager_through_the_joint_graph():
    torch.manual_seed(0)
    model = ExampleMLP(width=32, depth=3)
    compiled = compile_with_plan(model, "debug")
    x = torch.randn(8, 32)
    compiled(x).square().mean().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    for a, p in zip(got, model.parameters()):
        assert compare(p.grad, a) is None
    roles = sorted(r.role for r in compilation_of(compiled).graphs)
    assert roles == ["backward", "forward"]


def test_export_frontend_matches_eager():
    model = ExampleMLP(width=32, depth=2).eval()
    compiled = compile_with_plan(model, "default", options={"capture": {"frontend": "export"}})
    with torch.no_grad():
        x = torch.randn(4, 32)
        assert compare(model(x), compiled(x)) is None
        y = torch.randn(6, 32)
        assert compare(model(y), compiled(y)) is None
    assert len(compilation_of(compiled).recompiles) == 1


def test_export_frontend_refuses_calls_that_need_gradients():
    model = ExampleMLP(width=32, depth=2)
    compiled = compile_with_plan(model, "default", options={"capture": {"frontend": "export"}})
    with pytest.raises(pipeline.PipelineError, match="inference graphs only"):
        compiled(torch.randn(4, 32))


def test_recompile_limit_hit_is_an_error_with_advice_under_the_error_policy():
    def double(x):
        return x * 2

    compiled = compile_with_plan(double, "default", options={"capture": {
        "dynamic": False, "recompile_limit": 1, "on_recompile_limit": "error"}})
    compiled(torch.randn(3))
    with pytest.raises(pipeline.RecompileError, match="recompile_limit 1"):
        compiled(torch.randn(5))


def test_recompiles_are_recorded_with_the_failed_guard():
    def double(x):
        return x * 2

    compiled = compile_with_plan(double, "default", options={"capture": {"dynamic": False}})
    compiled(torch.randn(3))
    compiled(torch.randn(5))
    recompiles = compilation_of(compiled).recompiles
    assert len(recompiles) == 1
    assert "size mismatch" in recompiles[0]


def test_fail_on_recompile_stance_raises():
    def double(x):
        return x * 2

    compiled = compile_with_plan(double, "default", options={"capture": {"stance": "fail_on_recompile"}})
    with pytest.raises(pipeline.RecompileError):
        compiled(torch.randn(3))


def test_force_eager_stance_compiles_nothing():
    compiled = compile_with_plan(branchy, "default", options={"capture": {"stance": "force_eager"}})
    x = torch.randn(8)
    assert compare(branchy(x), compiled(x)) is None
    assert compilation_of(compiled).graphs == []


def test_missed_expectation_names_it_and_the_measured_value():
    compiled = compile_with_plan(branchy, "default", expect={"max_graph_breaks": 0})
    with pytest.raises(pipeline.ExpectationError, match=r"expect.max_graph_breaks is 0 but the compile measured 1"):
        compiled(torch.randn(8))


def test_missed_expectation_can_warn_instead():
    compiled = compile_with_plan(branchy, "default", expect={"max_graph_breaks": 0, "on_miss": "warn"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(8))
    assert any("max_graph_breaks" in str(w.message) for w in caught)


def test_two_plans_in_one_process_keep_their_own_options():
    a = compile_with_plan(lambda x: x + 1, "default", options={"constant-fold": {"max_bytes": 7}})
    b = compile_with_plan(lambda x: x + 1, "default", options={"constant-fold": {"max_bytes": 9}})
    pa = [p.instance for p in compilation_of(a).graph_passes if p.name == "constant-fold"][0]
    pb = [p.instance for p in compilation_of(b).graph_passes if p.name == "constant-fold"][0]
    assert (pa.options.max_bytes, pb.options.max_bytes) == (7, 9)
    assert pa is not pb


def test_dynamic_shapes_compile_once_for_many_sizes():
    def scale_rows(x):
        return (x * 2).softmax(-1)

    compiled = compile_with_plan(scale_rows, "debug", options={"capture": {"dynamic": True}})
    for rows in (3, 5, 9):
        x = torch.randn(rows, 7)
        assert compare(scale_rows(x), compiled(x)) is None
    assert compilation_of(compiled).summary()["graph_count"] == 1


def test_bare_torch_nn_modules_are_captured_not_run_eagerly():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    compiled = compile_with_plan(model, "default")
    x = torch.randn(8, 16)
    with torch.no_grad():
        assert compare(model(x), compiled(x)) is None
    comp = compilation_of(compiled)
    assert comp.summary()["graph_count"] == 1
    assert sum(r.kernels for r in comp.graphs) >= 1


def test_many_separately_compiled_modules_do_not_share_a_recompile_budget():
    x = torch.randn(2, 8)
    for _ in range(12):
        model = torch.nn.Linear(8, 8).eval()
        compiled = compile_with_plan(model, "default", options={"capture": {"recompile_limit": 2}})
        with torch.no_grad():
            assert compare(model(x), compiled(x)) is None


def test_folded_constants_survive_the_passes_that_retrace_after_folding():
    def with_positions(x):
        positions = torch.arange(x.shape[-1], dtype=x.dtype).view(1, -1) * 0.5
        return torch.softmax(x + positions, -1)

    compiled = compile_with_plan(with_positions, "default")
    x = torch.randn(4, 16)
    assert compare(with_positions(x), compiled(x)) is None
    assert "_tensor_constant" in compilation_of(compiled).graphs[0].final_code


def test_a_second_module_with_other_sizes_is_compiled_with_static_shapes():
    class Norm(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)

        def forward(self, x):
            return torch.nn.functional.gelu(self.norm(x)) + x

    with torch.no_grad():
        for rows, width in ((4, 8), (32, 64)):
            model = Norm(width).eval()
            compiled = compile_with_plan(model, "default")
            x = torch.randn(rows, width)
            assert compare(model(x), compiled(x)) is None
            record = compilation_of(compiled).graphs[0]
            assert record.kernels == 1, record.notes


def test_ignore_logging_captures_a_logging_model_as_one_graph_and_only_for_its_plan():
    """capture.ignore_logging: a logger call in the model no longer splits it (transformers logs
    with warning_once in forward); a plan without the option still breaks there."""
    import logging

    from pipeline import compilation_of

    log = logging.getLogger("pipeline.tests.ignore_logging")

    def f(x):
        y = x.sin() * 2
        log.warning("seen at trace time only when the call is not skipped")
        return y.exp()

    x = torch.randn(8)
    skipping = compile_with_plan(f, "default", options={"capture": {"ignore_logging": True}})
    torch.testing.assert_close(skipping(x), f(x))
    summary = compilation_of(skipping).summary()
    assert summary["graph_breaks"] == [] and summary["graph_count"] == 1
    torch._dynamo.reset()
    breaking = compile_with_plan(f, "default")
    torch.testing.assert_close(breaking(x), f(x))
    assert compilation_of(breaking).summary()["graph_breaks"], "without the option the logger call breaks"


def test_ignore_logging_logs_no_errors_and_drops_only_torchs_unsortable_config_record(caplog):
    """torch 2.11's Dynamo sorts its config's sets to log compilation metrics and fails on the
    skipped logging functions: that one harmless error record is dropped, any other one passes."""
    import logging

    from pipeline.compat.dynamo import _unsortable_config_error

    def f(x):
        logging.getLogger("pipeline.tests.quiet").info("skipped")
        return x.cos() + 1

    with caplog.at_level(logging.ERROR):
        compile_with_plan(f, "default", options={"capture": {"ignore_logging": True}})(torch.randn(4))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    def record(exc: BaseException, message: str) -> logging.LogRecord:
        return logging.LogRecord("torch._dynamo.metrics_context", logging.ERROR, __file__, 1, message, None,
                                 (type(exc), exc, None))

    unsortable = TypeError("'<' not supported between instances of 'function' and 'function'")
    assert not _unsortable_config_error(record(unsortable, "Unexpected exception logging compilation metrics"))
    assert _unsortable_config_error(record(TypeError("other"), "Unexpected exception logging compilation metrics"))
    assert _unsortable_config_error(record(unsortable, "some other failure"))
