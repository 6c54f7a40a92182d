"""Attention masks broadcast along the key axis are made dense before tracing (capture's
``dense_attention_masks``), so tracing keeps the fused attention kernel instead of the float32 math
path. On the CPU host the rewrite is exercised with ``dense_attention_masks: [cpu]``; which kernel
CUDA then picks is checked on the GPU (benchmarks/probes/sdpa_mask.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline import compile_with_plan
from pipeline.numerics import compare
from passes.attention_masks import dense_attention_masks, constant_attention_masks

PLAN = {"extends": "default", "options": {"capture": {"dense_attention_masks": ["cpu"]}}}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def encoder_attention(q, k, v, rows):
    """Two attention calls reading one mask indexed by query row and broadcast along the key axis
    (stride 0 there, as transformers' encoder masks under tracing: ViT's is all True)."""
    mask = rows[:, None, :, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    hidden = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(hidden, k, v, mask)


def inputs(batch: int, length: int, grad: bool = False):
    q, k, v = (torch.randn(batch, 3, length, 8, requires_grad=grad) for _ in range(3))
    return q, k, v, torch.rand(batch, length) > 0.0       # every row kept (no row masked whole)


def test_a_broadcast_mask_is_made_dense_once_for_every_attention_call_that_reads_it():
    seen = []

    def backend(gm, example_inputs):
        seen.append(dense_attention_masks(gm, ["cpu"]))
        seen.append(gm.code)
        return gm.forward

    compiled = torch.compile(encoder_attention, backend=backend)
    args = inputs(2, 7)
    assert compare(encoder_attention(*args), compiled(*args)) is None
    made, code = seen
    assert made == 1 and code.count(".contiguous()") == 1


def test_a_mask_with_a_unit_stride_key_axis_and_masks_on_other_devices_are_left_alone():
    counts = []

    def backend(gm, example_inputs):
        counts.append(dense_attention_masks(gm, ["cuda"]))       # a CPU mask, CUDA only
        counts.append(dense_attention_masks(gm, ["cpu"]))
        return gm.forward

    def padding_mask(q, k, v, keep):      # broadcast along the query axis only
        mask = keep[:, None, None, :].expand(q.shape[0], 1, q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v, _ = inputs(2, 5)
    keep = torch.rand(2, 5) > 0.3
    keep[:, 0] = True
    compiled = torch.compile(padding_mask, backend=backend)
    assert compare(padding_mask(q, k, v, keep), compiled(q, k, v, keep)) is None
    assert counts == [0, 0]


@pytest.mark.parametrize("batch,length", [(2, 7), (3, 16), (1, 33)])
def test_compiled_attention_with_dense_masks_matches_eager(batch, length):
    compiled = compile_with_plan(encoder_attention, PLAN)
    args = inputs(batch, length)
    with torch.no_grad():
        assert compare(encoder_attention(*args), compiled(*args)) is None


def test_gradients_through_a_dense_mask_match_eager():
    compiled = compile_with_plan(encoder_attention, {"extends": "training",
                                                     "options": {"capture": {"dense_attention_masks": ["cpu"]}}})
    eager_args = inputs(2, 9, grad=True)
    ours_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in eager_args)
    encoder_attention(*eager_args).square().sum().backward()
    compiled(*ours_args).square().sum().backward()
    for want, got in zip(eager_args[:3], ours_args[:3]):
        assert compare(want.grad, got.grad) is None


def _bias_graph(bias: torch.Tensor) -> tuple[torch.fx.GraphModule, torch.fx.Node]:
    """A graph calling the memory-efficient attention kernel (never run: CPU example values) on a
    bias computed in the graph, as fusion leaves it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    graph = torch.fx.Graph()
    q, k, v, b = (graph.placeholder(n) for n in "qkvb")
    made = graph.call_function(torch.ops.aten.mul.Tensor, (b, 1.0))
    attention = graph.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                                    (q, k, v, made, False))
    graph.output(attention)
    qkv = mode.from_tensor(torch.empty(bias.shape[0], 12, 1, 64))
    for node, value in ((q, qkv), (k, qkv), (v, qkv), (b, mode.from_tensor(bias)), (made, mode.from_tensor(bias))):
        node.meta["val"] = value
    return torch.fx.GraphModule(torch.nn.Module(), graph), made


def test_a_bias_the_fused_kernels_would_refuse_gets_an_aligned_copy():
    """A one-token bias written densely over heads (head stride 1, as fusion wrote llm-serving's
    seq-1 bucket) is copied into a padded, sliced layout; broadcast axes stay stride 0."""
    from passes.kernel_ir.extern_layouts import aligned, align_extern_inputs
    dense = torch.randn(2, 12, 1, 1)
    assert not aligned(dense)
    assert aligned(torch.randn(2, 12, 64, 64)) and aligned(torch.randn(2, 1, 1, 64).expand(2, 12, 64, 64))
    gm, made = _bias_graph(dense)
    assert align_extern_inputs(gm) == 1
    gm.graph.lint()                                 # the copy's nodes come before their reader, in order
    attention = next(n for n in gm.graph.nodes if "efficient" in str(n.target))
    copy = attention.args[3]
    assert copy is not made and aligned(copy.meta["val"])
    chain = []
    node = copy
    while node is not made:
        chain.append(node)
        node = node.args[0]
    value = dense
    for node in reversed(chain):
        value = node.target(value, *node.args[1:])
    assert torch.equal(value, dense) and aligned(value)
    broadcast = torch.randn(2, 1, 1, 1).expand(2, 12, 1, 1)
    gm, made = _bias_graph(broadcast)
    assert align_extern_inputs(gm) == 1
    copy = next(n for n in gm.graph.nodes if "efficient" in str(n.target)).args[3].meta["val"]
    assert aligned(copy) and copy.stride(1) == 0
    gm, _ = _bias_graph(torch.randn(2, 1, 64, 64).expand(2, 12, 64, 64))
    assert align_extern_inputs(gm) == 0             # already aligned: no copy


def test_a_bias_of_symbolic_length_gets_a_copy_padded_by_the_length_it_is_called_with():
    """A key-padding bias over a symbolic sequence length (a dynamic encoder: ``[b, 1, 1, s]``
    broadcast to ``[b, h, s, s]``; its batch stride ``s`` is aligned for some lengths only): the
    padding is computed from the size at the call, and the copy's nodes run on real tensors of
    lengths that need padding and lengths that do not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from passes.kernel_ir.extern_layouts import align_extern_inputs, aligned
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * 3 + [DimDynamic.DYNAMIC])
    row = mode.from_tensor(torch.randn(2, 1, 1, 40), symbolic_context=dynamic)
    length = row.shape[-1]
    assert isinstance(length, torch.SymInt)
    graph = torch.fx.Graph()
    q, k, v, b = (graph.placeholder(n) for n in "qkvb")
    attention = graph.call_function(torch.ops.aten._scaled_dot_product_efficient_attention.default,
                                    (q, k, v, b, False))
    graph.output(attention)
    with mode:
        qkv = torch.empty(2, 12, length, 64)
        b.meta["val"] = row.expand(2, 12, length, length)
    for node in (q, k, v):
        node.meta["val"] = qkv
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert align_extern_inputs(gm) == 1
    gm.graph.lint()
    copy = attention.args[3]
    assert copy.meta["val"].shape == b.meta["val"].shape
    for size in (1, 37, 48):                        # padded to 16, 48; none needed
        bias = torch.randn(2, 1, 1, size).expand(2, 12, size, size)
        values = {b: bias}
        for node in gm.graph.nodes:
            if node.op == "call_function" and node is not attention:
                args = torch.fx.node.map_arg(node.args, values.__getitem__)
                values[node] = node.target(*args)
        assert torch.equal(values[copy], bias) and aligned(values[copy]) and values[copy].stride(1) == 0


def ramp_mask_attention(q, k, v, offset: int = 0, additive: bool = False):
    """Attention with a mask built from index ramps alone, as transformers builds an encoder's mask
    under tracing: ``key >= offset`` (hides nothing at offset 0)."""
    keys = torch.arange(k.shape[2])
    mask = (keys >= offset)[None, None, None, :].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _masks_dropped(fn, *args, devices=("cpu",)) -> tuple[int, str]:
    seen = []

    def backend(gm, example_inputs):
        seen.append(constant_attention_masks(gm, list(devices)))
        seen.append(gm.code)
        return gm.forward

    compiled = torch.compile(fn, backend=backend)
    assert compare(fn(*args), compiled(*args)) is None
    return seen[0], seen[1]


@pytest.mark.parametrize("additive", [False, True])
def test_a_mask_from_ramps_alone_that_hides_nothing_is_dropped(additive):
    q, k, v, _ = inputs(2, 9)
    dropped, code = _masks_dropped(lambda q, k, v: ramp_mask_attention(q, k, v, 0, additive), q, k, v)
    assert dropped == 1 and "attn_mask" not in code and "arange" not in code     # its nodes are gone too


def test_masks_that_hide_keys_read_inputs_or_sit_on_other_devices_are_kept():
    q, k, v, keep = inputs(2, 9)
    assert _masks_dropped(lambda q, k, v: ramp_mask_attention(q, k, v, 3), q, k, v)[0] == 0
    assert _masks_dropped(encoder_attention, q, k, v, keep)[0] == 0       # from an input, though all True
    assert _masks_dropped(lambda q, k, v: ramp_mask_attention(q, k, v, 0), q, k, v, devices=("cuda",))[0] == 0

    def random_mask(q, k, v):         # all True at this seed, but drawn anew every call
        mask = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2]) >= 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    seen = []

    def backend(gm, example_inputs):
        seen.append(constant_attention_masks(gm, ["cpu"]))
        return gm.forward
    torch.compile(random_mask, backend=backend)(q, k, v)
    assert seen == [0]


def causal_ramp_attention(q, k, v, shift: int = 0, additive: bool = False):
    """Attention with a causal mask built from index ramps (``key <= query + shift``), as
    transformers builds a decoder's mask under tracing when no padding mask is given."""
    rows, cols = torch.arange(q.shape[2]), torch.arange(k.shape[2])
    mask = (cols[None, :] <= rows[:, None] + shift)[None, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("additive", [False, True])
def test_a_causal_mask_from_ramps_alone_becomes_is_causal(additive):
    q, k, v, _ = inputs(2, 9)
    rewritten, code = _masks_dropped(lambda q, k, v: causal_ramp_attention(q, k, v, 0, additive), q, k, v)
    assert rewritten == 1 and "attn_mask" not in code and "is_causal = True" in code
    shifted = lambda q, k, v: causal_ramp_attention(q, k, v, 1, additive)     # one key more: not is_causal
    assert _masks_dropped(shifted, q, k, v)[0] == 0

    def penalty(q, k, v):       # -1e4 is a penalty, not an exclusion: the softmax differs, so it stays
        rows, cols = torch.arange(q.shape[2]), torch.arange(k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(cols[None] <= rows[:, None], 0.0, -1e4))
    assert _masks_dropped(penalty, q, k, v)[0] == 0
    short = q[:, :, :4]                                 # fewer queries than keys: is_causal's top-left pattern
    rewritten, code = _masks_dropped(lambda q, k, v: causal_ramp_attention(q, k, v, 0, additive), short, k, v)
    assert rewritten == 1 and "is_causal = True" in code


@pytest.mark.parametrize("length", [5, 16])
@pytest.mark.parametrize("fn", [ramp_mask_attention, causal_ramp_attention])
def test_compiled_attention_without_its_constant_mask_matches_eager(length, fn):
    compiled = compile_with_plan(fn, "default")
    q, k, v, _ = inputs(2, length)
    with torch.no_grad():
        assert compare(fn(q, k, v), compiled(q, k, v)) is None


def test_a_dynamic_encoder_runs_with_aligned_bias_copies_at_every_length(monkeypatch):
    """The aligned copies end to end on the CPU host: CPU flash attention's mask registered as one
    needing the aligned layout (the copy is exact, so results must not change), an encoder with a
    key-padding mask compiled with a dynamic length. The generated host code computes each copy's
    padding from the length of the call (lengths that need padding and lengths that do not)."""
    from passes.kernel_ir import extern_layouts
    from pipeline import compilation_of
    monkeypatch.setitem(extern_layouts.ALIGNED_INPUTS,
                        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, ("attn_mask",))

    def encoder(x, lengths):
        mask = torch.arange(x.shape[2])[None, :] >= lengths[:, None]
        bias = torch.zeros(x.shape[0], 1, 1, x.shape[2]).masked_fill(mask[:, None, None, :], float("-inf"))
        hidden = F.scaled_dot_product_attention(x, x, x, attn_mask=bias)
        return F.scaled_dot_product_attention(hidden, x, x, attn_mask=bias) + 1

    compiled = compile_with_plan(encoder, "default")
    with torch.no_grad():
        for length in (16, 21, 32, 37):
            x = torch.randn(2, 3, length, 8)
            lengths = torch.tensor([length, length // 2 + 1])
            assert compare(encoder(x, lengths), compiled(x, lengths)) is None
    graphs = compilation_of(compiled).graphs
    assert len(graphs) == 2 and "sym_size" in graphs[-1].final_code
    assert any("aligned layout" in note["message"] for note in graphs[-1].notes)


def test_a_constant_mask_that_cannot_be_computed_at_capture_stays():
    """A mask whose nodes fail on real tensors (here an operator given a bad argument) is left as
    captured instead of failing the compile."""
    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(n) for n in "qkv")
    mask = graph.call_function(torch.ones, ("not a size",))
    attention = graph.call_function(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask})
    graph.output(attention)
    qkv = torch.randn(2, 3, 4, 8)
    for node in (q, k, v):
        node.meta["example_value"] = qkv
    mask.meta["example_value"] = torch.ones(4, 4, dtype=torch.bool)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert constant_attention_masks(gm, ["cpu"]) == 0
    assert attention.kwargs["attn_mask"] is mask


def test_a_bias_a_kernel_computes_is_written_in_the_aligned_layout_by_that_kernel(monkeypatch):
    """Swin's relative position bias plus its window mask, 49 keys: the aligned layout is made before
    fusion, so the kernel computing the bias writes it padded to 64 keys and no copy follows (CPU
    flash attention's mask registered as needing the aligned layout, as on CUDA)."""
    from passes.kernel_ir import extern_layouts
    from pipeline import compilation_of
    monkeypatch.setitem(extern_layouts.ALIGNED_INPUTS,
                        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, ("attn_mask",))

    def windows(q, table, idx, mask):
        n = q.shape[-2]
        bias = table[idx.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0) + mask
        return F.scaled_dot_product_attention(q, q, q, attn_mask=bias)

    generator = torch.Generator().manual_seed(0)
    args = (torch.randn(4, 3, 49, 16, generator=generator), torch.randn(169, 3, generator=generator),
            torch.randint(0, 169, (49, 49), generator=generator), torch.randn(4, 1, 49, 49, generator=generator))
    compiled = compile_with_plan(windows, "default")
    with torch.no_grad():
        assert compare(windows(*args), compiled(*args)) is None
    (record,) = compilation_of(compiled).graphs
    assert record.kernels == 1 and "constant_pad_nd" not in record.final_code, record.final_code
    assert "[9408, 3136, 64, 1]" in record.final_code      # the kernel's padded output, read as the bias
