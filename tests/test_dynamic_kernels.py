"""Generated kernels for graphs with symbolic sizes (passes/codegen/specialize.py), C++ backend.

A model called at changing sizes compiles at most twice (Dynamo's dynamic=None: the first size
change recompiles with the size symbolic); the dynamic graph's fused groups run generated
kernels, one per size seen, and every call matches eager."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.testing import graphs
from pipeline.testing.strategies import TensorSpec

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class MLP(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.up, self.down = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return torch.softmax(self.norm(x + self.down(nn.functional.gelu(self.up(x)))), -1)


class Block(nn.Module):
    """Pre-norm attention and MLP; ``mask`` (batch, seq) marks padded keys."""

    def __init__(self, hidden: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = MLP(hidden)

    def forward(self, x, mask=None):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        bias = None
        if mask is not None:
            bias = torch.zeros(b, 1, 1, s, dtype=x.dtype).masked_fill(mask[:, None, None, :], float("-inf"))
        attn = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.norm2(x))


def padding_mask(batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=generator)
    return torch.arange(seq)[None, :] >= lengths[:, None]


def dynamic_graph(compiled):
    """The one graph compiled with symbolic sizes (its record's size_specializations is set)."""
    records = [r for r in compilation_of(compiled).graphs if r.metrics.get("size_specializations")]
    assert len(records) == 1, [r.graph_id for r in compilation_of(compiled).graphs]
    return records[0]


def check_sizes(model, inputs_at, sizes, plan="default"):
    compiled = compile_with_plan(model, plan)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for size in sizes:
            inputs = inputs_at(size, generator)
            problem = compare(model(*inputs), compiled(*inputs), what=f"output at size {size}")
            assert problem is None, problem
    return compiled


def test_mlp_batch_sizes_compile_twice_and_generate_kernels_once():
    """One size-class kernel per group serves every batch size: the kernels are generated once,
    when the dynamic graph compiles, with the batch as a size argument."""
    model = MLP().eval()
    sizes = [1, 2, 3, 5, 8, 13, 64, 5]
    compiled = check_sizes(model, lambda n, g: (torch.randn(n, 32, generator=g),), sizes)
    assert len(compilation_of(compiled).graphs) == 2          # batch 1, then the dynamic graph
    record = dynamic_graph(compiled)
    assert record.metrics["kernels"] >= 2
    seen = record.metrics["size_specializations"]
    assert [list(s.values())[0] for s in seen["sizes"]] == [2, 3, 5, 8, 13, 64]    # 1 has its own graph
    assert seen["builds"] == 1 and seen["kernels"] == seen["classes"] == seen["groups"]
    assert not seen["per_size_groups"]
    kernels = record.metrics["contents"]["kernels"]
    assert all("const int64_t ks" in k["source"] for k in kernels), [k["source"] for k in kernels]


def test_sizes_alternating_call_each_size_s_launch_function_written_once(monkeypatch):
    """A size-class kernel at particular sizes gets its call site's launch function (size arguments
    as constants), written once per size and reused when the size comes back."""
    import passes.codegen as codegen
    written = []
    original = codegen.cpp_launcher

    def counting(kernel, donors=()):
        written.append((kernel.group.name, kernel.size_args, donors))
        return original(kernel, donors)
    monkeypatch.setattr(codegen, "cpp_launcher", counting)
    sizes = [1, 2, 3, 2, 3, 7, 2, 3, 7]
    compiled = check_sizes(MLP().eval(), lambda n, g: (torch.randn(n, 32, generator=g),), sizes)
    kernels = dynamic_graph(compiled).metrics["kernels"]
    sized = [w for w in written if w[1]]
    assert sized and len(sized) == len(set(sized)) == 3 * kernels, written     # sizes 2, 3 and 7


def test_a_call_site_of_a_size_class_kernel_is_its_own_launch_function():
    """The host code calls each symbolic group through a function made for its call site (its
    donors built in): sizes that repeat call the kernel's launch function at those sizes, a new
    size binds the site again, and every result matches eager."""
    sizes = [2, 3, 3, 2, 9, 9, 2]
    compiled = check_sizes(MLP().eval(), lambda n, g: (torch.randn(n, 32, generator=g),), sizes)
    record = dynamic_graph(compiled)
    calls = [line for line in record.final_code.splitlines() if "_sized(" in line]
    assert calls and all("donors=" not in line.split("#")[0] for line in calls), record.final_code
    assert any("# donors=" in line for line in calls), record.final_code


def test_encoder_with_padding_mask_over_sequence_lengths():
    model = Block().eval()
    sizes = [16, 24, 40, 56, 24]
    compiled = check_sizes(model, lambda s, g: (torch.randn(3, s, 32, generator=g), padding_mask(3, s, g)), sizes)
    assert len(compilation_of(compiled).graphs) == 2
    record = dynamic_graph(compiled)
    assert record.metrics["kernels"] >= 3
    assert len(record.metrics["size_specializations"]["sizes"]) == 3    # 24, 40, 56 (16 compiled statically)


def test_sizes_outside_every_class_past_the_limit_run_the_groups_eagerly_and_still_match():
    """A batch of 4096 rows crosses the C++ kernels' parallel threshold (another size class); with
    one build allowed, its groups run eagerly, and the sizes of the first class keep its kernels."""
    plan = {"extends": "default", "options": {"codegen": {"size_specializations": 1}}}
    compiled = check_sizes(MLP().eval(), lambda n, g: (torch.randn(n, 32, generator=g),), [2, 3, 4096, 5], plan)
    seen = dynamic_graph(compiled).metrics["size_specializations"]
    assert seen["builds"] == 1 and seen["limit"] == 1 and seen["seen"] == 3


def test_dynamic_graph_folds_views_and_reuses_buffers_of_symbolic_layouts():
    """Views of symbolic sizes fold into reinterpret_tensor calls whose sizes the graph computes,
    and a kernel writes into a dead buffer of the same symbolic layout (reuse=)."""
    plan = {"extends": "default", "options": {"codegen": {"reuse_buffers": ["cpu"]}}}
    compiled = check_sizes(Block().eval(), lambda s, g: (torch.randn(2, s, 32, generator=g),), [8, 12, 20, 12], plan)
    code = dynamic_graph(compiled).final_code
    assert "reinterpret_tensor(" in code and "aten_view(" not in code
    assert "reuse=(" in code


def test_no_specializations_leaves_symbolic_groups_eager_with_the_reason():
    plan = {"extends": "default", "options": {"codegen": {"size_specializations": 0}}}
    compiled = check_sizes(MLP().eval(), lambda n, g: (torch.randn(n, 32, generator=g),), [2, 3, 4], plan)
    last = compilation_of(compiled).graphs[-1]
    assert last.metrics["kernels"] == 0
    assert any("size_specializations is 0" in n["message"] for n in last.notes)


def _grown(spec: TensorSpec, rank: int, growth: tuple) -> TensorSpec:
    """``spec`` with every axis that is not a broadcast 1 grown by its axis's amount."""
    offset = rank - len(spec.shape)
    shape = tuple(s if s == 1 else s + growth[k + offset] for k, s in enumerate(spec.shape))
    return TensorSpec(shape, spec.dtype, spec.permutation)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=graphs(views=False, constants=False, large_shapes=0, max_ops=6, max_dim=5),
       growth=st.lists(st.integers(1, 5), min_size=3, max_size=3), data=st.data())
def test_random_graphs_with_symbolic_sizes_match_eager_at_every_size(case, growth, data):
    """Random pointwise/reduction graphs captured with every size symbolic (capture.dynamic: true),
    called at their own sizes and at two grown ones (where eager accepts them): fuse + C++ codegen
    match eager each time."""
    torch._dynamo.reset()
    rank = max(len(s.shape) for s in case.inputs)
    plan = {"extends": "default", "options": {"capture": {"dynamic": True}}}
    compiled = compile_with_plan(case.gm, plan)
    for step, scale in enumerate([0, 1, 2]):
        specs = [_grown(s, rank, tuple(scale * g for g in growth[-rank:])) for s in case.inputs]
        generator = torch.Generator().manual_seed(step)
        inputs = [s.make(generator) for s in specs]
        try:
            expected = case.gm(*inputs)
        except RuntimeError:
            assert scale, "the graph fails eagerly at its own sizes"
            continue        # an op with sizes in its arguments (layer_norm's normalized_shape) fixes them
        problem = compare(expected, compiled(*inputs), what=f"output at {[s.shape for s in specs]}")
        assert problem is None, f"{problem}\n{case}"


@pytest.mark.parametrize("name, fn, make", [
    ("nonzero", lambda x: torch.nonzero(x > 0) * 2, lambda g: (torch.randn(6, 5, generator=g),)),
    ("masked_select", lambda x: torch.masked_select(x, x > 0).exp() + 1, lambda g: (torch.randn(7, 3, generator=g),)),
    ("item", lambda x: x * x.sum().item(), lambda g: (torch.randn(4, 4, generator=g),)),
    ("unique", lambda x: torch.unique(x) + 1, lambda g: (torch.randint(0, 9, (20,), generator=g),)),
])
def test_data_dependent_sizes_are_captured_in_one_graph(name, fn, make):
    """capture.data_dependent: .item() and data-dependent output shapes stay in the graph (unbacked
    sizes), one compile serves inputs whose data changes those sizes, and results match eager."""
    plan = {"extends": "default", "options": {"capture": {"data_dependent": True}}}
    compiled = compile_with_plan(fn, plan)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        inputs = make(generator)
        problem = compare(fn(*inputs), compiled(*inputs), what=name)
        assert problem is None, problem
    compilation = compilation_of(compiled)
    assert len(compilation.graphs) == 1 and not compilation.graph_breaks
    assert compilation.graphs[0].fallback is None


def test_a_mask_that_broadcasts_its_input_selects_more_elements_than_the_input_has():
    """masked_select's count is bounded by the broadcast numel, not the input's (torch's fake
    kernel is corrected in pipeline.compat.fixes): no runtime assertion fails on a correct call."""
    fn = lambda x, m: torch.masked_select(x, m) * 2     # noqa: E731
    compiled = compile_with_plan(fn, {"extends": "default", "options": {"capture": {"data_dependent": True}}})
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        x, m = torch.randn(2, 5, generator=generator), torch.rand(3, 2, 5, generator=generator) > 0.2
        problem = compare(fn(x, m), compiled(x, m), what="masked_select")
        assert problem is None, problem


def test_a_failure_of_dynamos_data_dependent_tracing_captures_again_with_a_graph_break():
    """combinations makes Dynamo lose track of an unbacked size (PendingUnbackedSymbolNotFound):
    the call still runs, the function is captured again with the operator breaking the graph,
    and the reason is recorded."""
    fn = lambda x: torch.combinations(x, r=2) + 1     # noqa: E731
    compiled = compile_with_plan(fn, {"extends": "default", "options": {"capture": {"data_dependent": True}}},
                                 on_error="raise")
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert torch.equal(compiled(x), fn(x))
    breaks = compilation_of(compiled).graph_breaks
    assert any("capture.data_dependent" in r and "PendingUnbackedSymbolNotFound" in r for r in breaks), breaks
    assert not compilation_of(compiled).fallbacks


def test_error_checks_of_linalg_operators_stay_in_the_compiled_graph():
    """_linalg_check_errors carries an effect token through functionalization; the compiled graph
    calls it in order, so a matrix that is not positive-definite raises as in eager."""
    fn = lambda a: torch.linalg.cholesky(a) * 2     # noqa: E731
    compiled = compile_with_plan(fn, "default", on_error="raise")
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
    a = a @ a.T + torch.eye(5)
    problem = compare(fn(a), compiled(a), what="cholesky")
    assert problem is None, problem
    assert compilation_of(compiled).graphs[0].fallback is None
    with pytest.raises(torch.linalg.LinAlgError, match="positive-definite"):
        compiled(-torch.eye(5))


@pytest.mark.parametrize("capture, written", [
    ({"dynamic": False, "dynamic_dims": {"x": [3], "mask": [1]}}, None),      # one symbolic size: no view left
    ({"dynamic": True}, "[arg"),                                                # batch too: sizes read
])
def test_a_chain_of_unit_axes_on_a_symbolic_input_is_one_view(capture, written):
    """mask[:, None, None, :] of a mask of symbolic length: the two unsqueezes and the whole-range
    slices become one view, at every size. Written with -1 for a lone symbolic size, the view is
    the kernel's access pattern for the mask (no view in the host code); written with the size
    inputs, it stays one view in the host code."""
    def fill(x, mask):
        return (x + 1).masked_fill(mask[:, None, None, :], -1.0)
    compiled = compile_with_plan(fill, {"extends": "default", "options": {"capture": capture}})
    generator = torch.Generator().manual_seed(0)
    for s in (5, 9, 13):
        x, mask = torch.randn(4, 2, 3, s, generator=generator), torch.rand(4, s, generator=generator) > 0.5
        problem = compare(fill(x, mask), compiled(x, mask), what=f"length {s}")
        assert problem is None, problem
    code = compilation_of(compiled).graphs[-1].final_code
    assert "unsqueeze" not in code and "slice" not in code, code
    if written is None:
        assert "aten_view(" not in code, code
    else:
        assert code.count("aten_view(") == 1 and written in code.split("aten_view(")[1].split(")")[0], code


def test_a_plan_declares_batch_dynamic_and_keeps_other_sizes_static():
    """capture.dynamic_dims with dynamic: false: the named dim is symbolic from the first call,
    every other size stays static (a new hidden size compiles a graph of its own)."""
    def fn(x):
        return torch.softmax(x * 2, -1)

    plan = {"extends": "default", "options": {"capture": {"dynamic": False, "dynamic_dims": {"x": [0]}}}}
    compiled = compile_with_plan(fn, plan)
    generator = torch.Generator().manual_seed(0)
    for shape in [(2, 8), (3, 8), (9, 8), (3, 12), (5, 12)]:
        x = torch.randn(*shape, generator=generator)
        assert compare(fn(x), compiled(x)) is None
    graphs = compilation_of(compiled).graphs
    assert len(graphs) == 2
    assert all(g.metrics["size_specializations"] for g in graphs)      # batch symbolic in both


def test_dynamic_dims_naming_no_parameter_is_an_error_naming_the_valid_ones():
    plan = {"extends": "default", "options": {"capture": {"dynamic_dims": {"y": [0]}}}}
    with pytest.raises(Exception, match="'y' is not a parameter of MLP.*x"):
        compile_with_plan(MLP(), plan)(torch.randn(2, 32))


def test_dynamic_dims_naming_no_parameter_can_be_ignored_for_plans_meant_for_several_models():
    """llm-serving names Hugging Face inputs; a model without them compiles with static sizes."""
    plan = {"extends": "default", "options": {"capture": {"dynamic_dims": {"input_ids": [0, 1]},
                                                          "unknown_dynamic_dims": "ignore"}}}
    model = MLP()
    compiled = compile_with_plan(model, plan)
    for batch in (2, 3):
        x = torch.randn(batch, 32)
        assert compare(model(x), compiled(x)) is None
    assert not compilation_of(compiled).graphs[0].metrics.get("size_specializations")
