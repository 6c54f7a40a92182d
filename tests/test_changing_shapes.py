"""Calls whose sizes change: a graph Dynamo captures with symbolic sizes keeps them through every
pass (no example size baked into a ``view``), the compile cache never hands one graph's entry to
another captured under different assumptions about its sizes, and every call of a random
sequence of shapes matches eager with the cache on."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


@pytest.fixture(autouse=True)
def _graph_cache_on(monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)     # the suite turns the graph cache off


class Encoder(torch.nn.Module):
    """A BERT-like block: self-attention over a padding mask, then a GELU MLP, both with layer norm."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.norm1 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.norm2 = torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        att = scores.softmax(-1) @ v
        x = self.norm1(x + self.out(att.transpose(1, 2).reshape(b, t, d)))
        return self.norm2(x + self.down(F.gelu(self.up(x))))


class Flatten(torch.nn.Module):
    """Reshapes that mix the changing dimension with fixed ones, and a reduction over it."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        flat = self.proj(x).reshape(-1, x.shape[-1])
        return flat.softmax(-1).reshape(x.shape).sum(1) + mask.float().sum(-1, keepdim=True)


def _inputs(batch: int, length: int, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, length, d)
    mask = torch.rand(batch, length) > 0.3
    mask[:, 0] = True            # every row attends to something
    return x, mask


def _call_and_compare(compiled, model, shapes) -> None:
    for batch, length in shapes:
        x, mask = _inputs(batch, length)
        with torch.no_grad():
            problem = compare(model(x, mask), compiled(x, mask))
        assert problem is None, f"shape ({batch}, {length}) after {shapes}: {problem}"


def test_linear_on_3d_input_survives_three_batch_sizes(tmp_path):
    model = torch.nn.Linear(16, 32)
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)})
    with torch.no_grad():
        for batch in (2, 3, 4, 7):
            x = torch.randn(batch, 8, 16)
            assert compare(model(x), compiled(x)) is None
    graphs = compilation_of(compiled).graphs
    assert len(graphs) == 2, [g.graph_id for g in graphs]     # static first, then one symbolic graph


def test_views_keep_symbolic_sizes_after_functionalize(tmp_path):
    model = torch.nn.Linear(16, 32)
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)}, report=True)
    with torch.no_grad():
        for batch in (2, 3):
            compiled(torch.randn(batch, 8, 16))
    symbolic = compilation_of(compiled).graphs[1]
    after = next(s["code"] for s in symbolic.sources if s["stage"] == "functionalize")
    assert "[24, 16]" not in after and "[3, 8, 32]" not in after, after


def tanh_gelu(x):
    """GPT-2's GELU: ``math.pi`` is a Python float, which Dynamo (not specializing floats) lifts
    into a graph input when sizes are symbolic."""
    import math
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_a_lifted_python_float_becomes_a_constant_again(tmp_path):
    """torch's tensorify pass asks Dynamo to trace once more with the float as a constant: the
    graph computes no scalar on the host (no ``.item()``), its multiply stays in the kernel, and
    the abandoned first trace leaves no record behind."""
    compiled = compile_with_plan(tanh_gelu, {"extends": "default", "options": {"capture": {"dynamic": True}}},
                                 cache={"dir": str(tmp_path)})
    for rows in (8, 16, 24):
        x = torch.randn(rows, 32)
        assert compare(tanh_gelu(x), compiled(x)) is None
    compilation = compilation_of(compiled)
    assert [g.graph_id for g in compilation.graphs] == ["g0"] and len(compilation.captures) == 1
    code = compilation.graphs[0].final_code
    assert "_local_scalar_dense" not in code and "aten_mul" not in code, code


def test_encoder_survives_changing_sequence_lengths(tmp_path):
    model = Encoder().eval()
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)})
    _call_and_compare(compiled, model, [(2, 8), (2, 12), (2, 16), (2, 24), (3, 9)])


def test_cache_keys_differ_when_the_shape_environment_differs(tmp_path):
    """Two graphs of the same operators over the same symbol name, captured under opposite guards
    on that size: their keys differ, so neither is ever rebuilt for the other."""
    def f(x):
        scale = 2.0 if x.shape[0] > 4 else 2.0     # a guard on the size, the same graph either way
        return x * scale

    compiled = compile_with_plan(f, "default", cache={"dir": str(tmp_path)})
    for rows in (2, 3, 6):
        x = torch.randn(rows, 8)
        assert compare(f(x), compiled(x)) is None
    graphs = compilation_of(compiled).graphs
    assert len(graphs) == 3
    assert graphs[1].cache["key"] != graphs[2].cache["key"]


MODELS = {"encoder": Encoder, "flatten": Flatten}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(MODELS)),
       shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 20)), min_size=3, max_size=6),
       again=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 20)), min_size=2, max_size=4))
def test_random_shape_sequences_match_eager_with_the_cache_on(tmp_path_factory, name, shapes, again):
    """A random model called with a random sequence of shapes matches eager at every call; so does
    a second compile of it in the same process sharing the cache folder (its graphs are hits)."""
    folder = str(tmp_path_factory.mktemp("cache"))
    torch.manual_seed(len(shapes))
    model = MODELS[name]().eval()
    _call_and_compare(compile_with_plan(model, "default", cache={"dir": folder}), model, shapes)
    _call_and_compare(compile_with_plan(model, "default", cache={"dir": folder}), model, shapes + again)
