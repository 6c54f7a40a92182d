"""Fusion and C++ code generation: what becomes one kernel, what stays extern, and that the
property test catches a wrong legality rule."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.testing import SemanticsError, assert_preserves_semantics
from sample_functions import (layer_norm, log_softmax, mask_inputs, masks, padded_rows, padded_softmax, rms_norm,
                              safe_softmax, safe_softmax_inputs, softmax)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


def compiled_record(fn, *args, plan="cpu-inference"):
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        out = compiled(*args)
        assert compare(fn(*args), out) is None
    return compilation_of(compiled).graphs[0]


@pytest.mark.parametrize("fn,args", [
    (softmax, (torch.randn(32, 100),)),
    (log_softmax, (torch.randn(32, 100),)),
    (layer_norm, (torch.randn(32, 100), torch.randn(100), torch.randn(100))),
    (rms_norm, (torch.randn(32, 100), torch.randn(100))),
], ids=["softmax", "log_softmax", "layer_norm", "rms_norm"])
def test_normalizations_compile_to_one_kernel(fn, args):
    record = compiled_record(fn, *args)
    assert record.kernels == 1


def test_safe_softmax_tests_its_rows_inside_the_softmax_kernel():
    """The math path of attention zeroes rows masked whole (``all(x == -inf)``): ``any``/``all``
    reduce as amax/amin of flags, so the test joins the softmax's kernel (no ATen ``any`` call
    and no boolean tensor between kernels), and a row masked whole gives zeros as in eager."""
    x, mask = safe_softmax_inputs()
    record = compiled_record(safe_softmax, x, mask, plan="default")
    assert record.kernels == 1 and "aten_any" not in record.final_code and "aten_all" not in record.final_code


@pytest.mark.parametrize("fn", [
    lambda x: (x.any(-1), x.all(1, keepdim=True)),
    lambda x: ((x > 0).any(), torch.all(x > -1, dim=(0, 2)), torch.any(x.int(), 0)),
], ids=["dim", "dims_and_all"])
def test_any_and_all_reduce_in_generated_kernels_like_eager(fn):
    x = torch.randn(3, 5, 7)
    x[0, 1] = 0
    x[2, :, 3] = float("nan")
    compiled = compile_with_plan(fn, "default")
    for got, want in zip(compiled(x), fn(x)):
        assert got.dtype == torch.bool and torch.equal(got, want)
    record = compilation_of(compiled).graphs[0]
    assert record.kernels >= 1 and "aten_any" not in record.final_code and "aten_all" not in record.final_code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_norms_reduce_in_generated_kernels_like_eager(dtype):
    """Weight norm and F.normalize reduce in our kernels (no ATen linalg_vector_norm call)."""
    def norms(x, g):
        return (F.normalize(x, dim=-1), torch.linalg.vector_norm(x, 1, dim=0),
                x.norm(float("inf"), dim=1, keepdim=True), torch._weight_norm(x, g, 0))

    for rows in (6, 33):
        x, g = torch.randn(rows, 40, dtype=dtype), torch.rand(rows, 1, dtype=dtype) + 0.5
        compiled = compile_with_plan(norms, "default")
        for got, want in zip(compiled(x, g), norms(x, g)):
            assert compare(want, got) is None
        record = compilation_of(compiled).graphs[0]
        # the column norm's kernel and at least two for the row norms (horizontal fusion may merge those)
        assert "vector_norm" not in record.final_code and record.kernels >= 3
        torch._dynamo.reset()


@pytest.mark.parametrize("conv", [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv1d(3, 8, 5, groups=1),
                                  torch.nn.ConvTranspose2d(3, 8, 2, stride=2)], ids=["conv2d", "conv1d", "transposed"])
def test_a_convolutions_bias_joins_the_kernel_after_it_where_the_plan_says(conv):
    model = torch.nn.Sequential(conv, torch.nn.SiLU()).eval()
    x = torch.randn(2, 3, 12, 12) if conv.weight.dim() == 4 else torch.randn(2, 3, 20)
    apart = compile_with_plan(model, {"extends": "default", "options": {"fuse": {"conv_bias_apart": ["cpu"]}}})
    with torch.no_grad():
        assert compare(model(x), apart(x)) is None
    code = compilation_of(apart).graphs[0].final_code
    assert "aten_convolution_default(" in code and ", None, [" in code and compilation_of(apart).graphs[0].kernels == 1
    torch._dynamo.reset()
    kept = compile_with_plan(model, "default")          # the CPU default: oneDNN adds the bias itself
    with torch.no_grad():
        kept(x)
    assert ", None, [" not in compilation_of(kept).graphs[0].final_code


class ChannelsNorm(torch.nn.Module):
    """ConvNeXt's pattern: a depthwise convolution read through a permute by a layer norm over
    the channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.conv(x).permute(0, 2, 3, 1)).relu()


def test_a_convolutions_bias_added_apart_joins_a_norm_reading_it_through_a_permute():
    model = ChannelsNorm().eval()
    x = torch.randn(2, 16, 9, 9)
    apart = compile_with_plan(model, {"extends": "default", "options": {"fuse": {"conv_bias_apart": ["cpu"]}}},
                              report=True)
    with torch.no_grad():
        assert compare(model(x), apart(x)) is None
    record = compilation_of(apart).graphs[0]
    assert ", None, [" in record.final_code and record.kernels == 1
    assert any("bias moved across a permute" in n["message"] for n in record.notes)


def test_layer_norm_gelu_residual_is_one_kernel():
    def block(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + x

    record = compiled_record(block, torch.randn(16, 64), torch.randn(64), torch.randn(64))
    assert record.kernels == 1


def test_pointwise_chain_with_broadcast_and_permuted_input_is_one_kernel():
    def chain(x, y):
        return torch.where(x > 0, torch.sigmoid(x) * torch.tanh(y), torch.sqrt(x.abs() + 1)).exp()

    x = torch.randn(64, 48).t()
    record = compiled_record(chain, x, torch.randn(64))
    assert record.kernels == 1


def test_matmul_stays_an_extern_call_and_its_epilogue_fuses():
    def mlp(x, w, b):
        return torch.relu(x @ w + b) * 2

    record = compiled_record(mlp, torch.randn(8, 16), torch.randn(16, 32), torch.randn(32))
    assert re.search(r"aten[._](add)?mm", record.final_code)
    assert record.kernels == 1


def test_bf16_kernels_load_as_fp32_and_match_eager():
    compiled = compile_with_plan(softmax, "cpu-inference")
    x = torch.randn(16, 40, dtype=torch.bfloat16)
    assert compare(softmax(x), compiled(x)) is None
    graph = compilation_of(compiled).graphs[0]
    sources = [n["message"] for n in graph.notes if n["pass"] == "codegen"]
    assert sources and graph.kernels == 1


def test_generated_source_is_readable_from_the_graph():
    compiled = compile_with_plan(softmax, "cpu-inference")
    compiled(torch.randn(4, 8))
    from pipeline.api import compilation_of as comp
    code = comp(compiled).graphs[0].final_code
    assert "cpp_fused_0" in code


def test_rejected_fusions_record_their_reason():
    def two_axes(x):
        y = x * 2
        return y.sum(0), y.sum(1)

    record = compiled_record(two_axes, torch.randn(6, 5))
    reasons = " ".join(n["message"] for n in record.notes if n["pass"] == "fuse")
    assert "reduces axes" in reasons
    assert record.kernels == 2


def test_second_compile_of_the_same_graph_hits_the_disk_cache():
    compiled_record(softmax, torch.randn(8, 24))
    torch._dynamo.reset()
    record = compiled_record(softmax, torch.randn(8, 24))
    assert any("cache hit" in n["message"] for n in record.notes if n["pass"] == "codegen")


two_reductions = st.fixed_dictionaries({
    "shape": st.tuples(st.integers(2, 6), st.integers(2, 6)),
    "axes": st.tuples(st.sampled_from([0, 1]), st.sampled_from([0, 1])),
    "ops": st.tuples(st.sampled_from(["sum", "amax", "amin"]), st.sampled_from(["sum", "amax", "amin"])),
})


def check_two_reductions(params):
    first, second = params["ops"]
    a, b = params["axes"]

    def fn(x):
        y = torch.sin(x) * 2
        return getattr(y, first)(a, keepdim=True) * 3, getattr(y, second)(b, keepdim=True) + 1

    assert_preserves_semantics("codegen", torch.fx.symbolic_trace(fn), [torch.randn(params["shape"])])


SEARCH = settings(max_examples=30, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))


def run_two_reductions_property() -> None:
    given(two_reductions)(SEARCH(lambda params: check_two_reductions(params)))()


def test_reductions_over_different_axes_of_one_value_preserve_semantics():
    run_two_reductions_property()


reduction_then_broadcast = st.fixed_dictionaries({
    "rows": st.integers(1, 5), "cols": st.integers(1, 5),
    "op": st.sampled_from(["sum", "amax", "amin"]), "keepdim": st.booleans(),
})


def check_reduction_then_broadcast(params):
    """y - reduce(y, axis 1): eager broadcasting decides which axis the reduced value lines up with."""
    op, keepdim = params["op"], params["keepdim"]

    def fn(x):
        y = torch.cos(x) * 2
        return y - getattr(y, op)(1, keepdim=keepdim)

    x = torch.randn(params["rows"], params["cols"])
    try:
        fn(x)
    except RuntimeError:
        assume(False)          # shapes that do not broadcast in eager are not a case
    assert_preserves_semantics("codegen", torch.fx.symbolic_trace(fn), [x])


def run_reduction_then_broadcast_property() -> None:
    given(reduction_then_broadcast)(SEARCH(lambda params: check_reduction_then_broadcast(params)))()


def test_reduced_values_broadcast_back_preserve_semantics():
    run_reduction_then_broadcast_property()


def test_property_test_catches_a_planted_wrong_legality_rule(monkeypatch):
    """Plant a wrong rule -- 'a reduced value may be read by the full domain whatever axis eager
    broadcasting lines it up with' -- and show the property test finds a graph it miscompiles."""
    import passes.kernel_ir.groups as fused
    monkeypatch.setattr(fused, "_lines_up", lambda shape, domain, reduced: True)
    with pytest.raises(SemanticsError, match="changed the result"):
        run_reduction_then_broadcast_property()


def test_clamps_and_selects_propagate_nan_like_eager():
    def clamps(x, y):
        return (torch.clamp(x, -0.5, 0.7) + F.hardtanh(x) + torch.clamp_min(x, 0.1) + torch.clamp_max(x, 0.2)
                + torch.maximum(x, y) + torch.relu(x) + F.leaky_relu(x, 0.2))

    x, y = torch.randn(8, 33), torch.randn(8, 33)
    x[0, 0], y[1, 2] = float("nan"), float("nan")
    record = compiled_record(clamps, x, y)
    assert record.kernels == 1


def test_inputs_of_another_dtype_than_compiled_for_run_the_group_eagerly(cpp_kernels_made):
    """A kernel compiled for float32 inputs never reads float64 memory as float32."""
    compile_with_plan(softmax, "cpu-inference")(torch.randn(4, 8))
    (kernel,) = cpp_kernels_made
    x = torch.randn(4, 8, dtype=torch.float64)
    (out,) = kernel(x)
    assert out.dtype == torch.float64 and compare(softmax(x), out) is None


def cross_entropy_of_bf16_logits(logits, labels):
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def log_softmax_then_bf16(x, w):
    return torch.log_softmax(x.view(-1, x.shape[-1]) * w, -1).view(x.shape).to(torch.bfloat16)


@pytest.mark.parametrize("fn,args,joined", [
    (cross_entropy_of_bf16_logits, (torch.randn(2, 8, 50, dtype=torch.bfloat16), torch.randint(0, 50, (2, 8))),
     "aten._to_copy"),
    (log_softmax_then_bf16, (torch.randn(2, 8, 50), torch.randn(50)), "aten._to_copy"),
], ids=["prologue_across_reshape", "epilogue_across_reshape"])
def test_elementwise_work_across_a_reshape_joins_the_reduction_kernel(fn, args, joined):
    """The dtype conversion on the other side of a reshape is part of the row kernel, not a
    kernel of its own writing an fp32 copy."""
    record = compiled_record(fn, *args)
    rows = [k for k in record.contents["kernels"] if "aten.amax" in k["ops"]]
    assert len(rows) == 1 and joined in rows[0]["ops"]
    assert not any(k["ops"] == [joined] for k in record.contents["kernels"])


def test_view_motion_can_be_turned_off():
    args = (torch.randn(2, 8, 50, dtype=torch.bfloat16), torch.randint(0, 50, (2, 8)))
    plan = {"extends": "cpu-inference", "options": {"fuse": {"move_views": False}}}
    record = compiled_record(cross_entropy_of_bf16_logits, *args, plan=plan)
    assert any(k["ops"] == ["aten._to_copy"] for k in record.contents["kernels"])


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["contiguous", "transposed", "sliced"]), st.sampled_from(["hoist", "sink"]),
       st.integers(1, 4), st.integers(2, 6), st.integers(2, 9))
def test_view_motion_preserves_semantics_on_any_layout(layout, direction, a, b, c):
    """Views are moved only where they are valid on the operands' layouts; elsewhere the graph
    stays as it was. Either way the result equals eager's."""
    base = torch.randn(a, b, c + 1)
    x = {"contiguous": base[..., :c].contiguous(), "transposed": base[..., :c].transpose(0, 1).contiguous()
         .transpose(0, 1), "sliced": base[..., :c]}[layout]
    w = torch.randn(c)

    def hoist(x, w):
        return torch.softmax((x.double() * 2).reshape(-1, c) + w, -1)

    def sink(x, w):
        return (torch.softmax(x.reshape(-1, c) * w, -1).reshape(a, b, c) + 1).to(torch.float64)

    torch._dynamo.reset()       # every example compiles a fresh function of the same code
    compiled_record(hoist if direction == "hoist" else sink, x, w)


def gelu_backward_into_linear_backward(x, g, w):
    """The shape of an MLP's backward: an elementwise chain over ``[b, s, h]`` reshaped to
    ``[b*s, h]``, read by a matmul (extern) and by a column sum (the bias gradient)."""
    t = torch.tanh(x * 0.79788456 * (1 + 0.044715 * x * x))
    grad = (g * 0.5 * (1 + t) + g * x * 0.5 * (1 - t * t) * 0.79788456).view(-1, x.shape[-1])
    return grad @ w, grad.sum(0)


def test_a_reshaped_chain_that_a_matmul_reads_stays_whole_in_its_kernel():
    """The chain is not hoisted (in part) into the column sum: the matmul needs its result in
    memory anyway, so its own kernel writes that one tensor, and the sum reads it back. Hoisting
    part of it made the chain's kernel write each value the hoisted part still read."""
    args = (torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(16, 4))
    record = compiled_record(gelu_backward_into_linear_backward, *args)
    (chain,) = [k for k in record.contents["kernels"] if "aten.tanh" in k["ops"]]
    (column_sum,) = [k for k in record.contents["kernels"] if "aten.sum" in k["ops"]]
    assert len(re.findall(r"out\d+\[[^\]]+\] =", chain["source"])) == 1
    assert "aten.add" not in column_sum["ops"] and "aten.mul" not in column_sum["ops"]


@pytest.mark.parametrize("fn,args", [
    (padded_softmax, (torch.randn(8, 13),)),
    (padded_rows, (torch.randn(6, 10), torch.randn(10))),
    (lambda x: F.pad((x * 3).to(torch.bfloat16), (0, 5, 0, 2)), (torch.randn(4, 6, 11),)),
], ids=["row_kernel_after_reshape", "rows_appended", "two_dims_bf16"])
def test_a_pad_of_a_kernels_result_is_that_kernels_padded_output(fn, args):
    """No pad copies the result: the kernel stores into the padded buffer's layout and the
    padding is filled around it (pad-mm's padded matmul operands, e.g. GPT-2's logits gradient)."""
    record = compiled_record(fn, *args)
    assert [k for k in record.contents["kernels"] if "aten.constant_pad_nd" in k["ops"]]
    assert not [name for name in record.contents["extern_calls"] if "constant_pad_nd" in name]


def test_a_padded_output_keeps_its_padding_when_its_kernel_comes_from_the_compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)      # the suite turns the graph cache off
    x = torch.randn(8, 13)
    for status in ("miss", "hit"):
        torch._dynamo.reset()
        compiled = compile_with_plan(padded_softmax, "cpu-inference", cache={"dir": str(tmp_path)})
        assert compare(padded_softmax(x), compiled(x)) is None
        assert compilation_of(compiled).graphs[0].cache["status"] == status


def test_cross_entropy_backward_is_one_pointwise_kernel_without_a_pass_summing_its_one_hot_rows():
    """log-softmax's backward sums the one-hot gradient over each row; that sum is the one element
    it picks, so the backward kernel no longer reduces (GPT-2: a pass over 4096 x 50257 elements)."""
    def loss(logits, target):
        return F.cross_entropy(logits.float(), target)

    logits = torch.randn(8, 50, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 50, (8,))
    target[2] = -100                                    # ignore_index: a row with no one-hot element
    expected = torch.autograd.grad(loss(logits, target), logits)[0]
    compiled = compile_with_plan(loss, "training")
    got = torch.autograd.grad(compiled(logits, target), logits)[0]
    assert compare(expected, got) is None
    backward = next(r for r in compilation_of(compiled).graphs if r.role == "backward")
    (row_kernel,) = [k for k in backward.contents["kernels"] if k["domain"] == ["8", "50"]]
    assert row_kernel["kind"] == "pointwise" and "aten.sum" not in row_kernel["ops"]


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(2, 9), st.integers(0, 1), st.booleans(),
       st.sampled_from(["row", "scalar", "none", "inf"]), st.sampled_from(["scalar", "row"]))
def test_sums_of_one_hot_rows_in_closed_form_match_eager(rows, n, dim, keepdim, weight, value):
    """Random one-hot sums along either axis: indices in and out of range, a weight per line, a
    scalar, none, or infinite (the skipped elements' 0 * inf makes eager's sum NaN)."""
    shape = [rows, n] if dim == 1 else [n, rows]
    line = [rows, 1] if dim == 1 else [1, rows]
    index = torch.randint(-2, n + 2, line)
    w = {"row": torch.randn(line), "scalar": torch.tensor(1.5), "none": None,
         "inf": torch.full(line, float("inf"))}[weight]
    v = torch.tensor(-1.0) if value == "scalar" else torch.randn(line)

    def one_hot_sum(index, v, w):
        ramp = torch.arange(n).view([n, 1] if dim == 0 else [n])
        hot = torch.where(ramp == index, v, torch.zeros(shape))
        return (hot if w is None else hot * w).sum(dim, keepdim=keepdim)

    torch._dynamo.reset()
    # constant-fold would turn the ramp into a stored constant, which is then no ramp to match
    plan = {"extends": "cpu-inference", "options": {"constant-fold": {"max_bytes": 1}}}
    compiled = compile_with_plan(one_hot_sum, plan)
    with torch.no_grad():
        assert compare(one_hot_sum(index, v, w), compiled(index, v, w)) is None
    notes = [n["message"] for r in compilation_of(compiled).graphs for n in r.notes]
    assert "1 sum(s) of one-hot rows computed in closed form" in notes


def test_a_clone_to_a_rank_specific_layout_is_not_moved_across_a_reshape():
    def f(x):
        y = x.contiguous(memory_format=torch.channels_last)
        return torch.softmax(y.view(2, 3, 20), -1)

    compiled_record(f, torch.randn(2, 3, 4, 5))


def _full_size_writes(record) -> list[str]:
    """Stores of the log-softmax's row kernel indexed along the row (``i1``): full-size outputs."""
    (row,) = [k for k in record.contents["kernels"] if "aten.amax" in k["ops"]]
    return [w for w in re.findall(r"out\d+\[([^\]]+)\] =", row["source"]) if "i1" in w]


def test_cross_entropy_gathers_logits_instead_of_writing_every_log_probability():
    """gather(log_softmax(x), 1, target) becomes x[i, target] - max - log-sum: the row kernel
    writes per-row statistics only, and the loss matches eager."""
    args = (torch.randn(2, 8, 50, dtype=torch.bfloat16), torch.randint(0, 50, (2, 8)))
    record = compiled_record(cross_entropy_of_bf16_logits, *args)
    assert _full_size_writes(record) == []
    plan = {"extends": "cpu-inference", "options": {"fuse": {"sink_gathers": False}}}
    torch._dynamo.reset()
    assert _full_size_writes(compiled_record(cross_entropy_of_bf16_logits, *args, plan=plan))


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.integers(2, 9), st.integers(0, 1), st.sampled_from(["row", "full", "column", "scalar"]),
       st.integers(1, 3))
def test_gathers_of_elementwise_chains_preserve_semantics(rows, cols, dim, other, picks):
    """Random chains of elementwise ops over the gathered tensor and a second operand that is a
    row statistic (size 1 along the gathered dim: the rewrite applies), full-size (gathered too),
    a column vector along the gathered dim (the rewrite must not pass it) or a scalar."""
    x = torch.randn(rows, cols)
    y = {"row": x.amax(dim, keepdim=True), "full": torch.randn(rows, cols),
         "column": torch.randn(rows, cols).amax(1 - dim, keepdim=True), "scalar": torch.tensor(0.5)}[other]
    shape = [rows, cols]
    shape[dim] = picks
    index = torch.randint(0, x.shape[dim], shape)

    def f(x, y, index):
        z = ((x - y).exp() * 2 + y).to(torch.float64).sigmoid()
        return torch.gather(torch.where(z > 0.6, z, -z), dim, index)

    torch._dynamo.reset()
    compiled_record(f, x, y, index)


def test_bool_and_integer_bitwise_ops_fuse_into_one_kernel():
    """&, |, ^ and ~ on bool masks (GPT-2's causal mask in the backward) and on integers are
    generated code, one kernel with the comparisons and the select."""
    record = compiled_record(masks, *mask_inputs())
    assert record.kernels == 1
    assert not any("bitwise" in op for op in record.contents["extern_calls"])


@pytest.mark.parametrize("negate", [torch.bitwise_not, torch.logical_not])
def test_a_sibling_that_would_broadcast_a_reductions_consumer_stays_out_of_its_group(negate):
    """where(~mask, fill, x.sum(0)) with a mask of shape (1, N, 1): merged into the reduction's
    group, the not would make the where a broadcast full-domain value no kernel can store (the
    group then ran eagerly, as in GPT-2's position-embedding gradient); kept apart, both compile."""
    def f(x, mask, fill):
        return torch.where(negate(mask), fill, x.sum(0, keepdim=True))

    record = compiled_record(f, torch.randn(2, 16, 8), torch.rand(1, 16, 1) > 0.5, torch.tensor(0.0))
    assert record.contents["eager_groups"] == []
    assert record.kernels >= 1


def test_a_fill_read_by_two_kernels_is_computed_inside_each():
    """A constant that two kernels read (split by a matmul) is made in each kernel's registers,
    not by an ATen call on every run (a device allocation and a launch) nor loaded from memory."""
    def f(x, w):
        half = torch.full((), 0.5)
        return torch.sigmoid(torch.relu(x) * half @ w) + half

    record = compiled_record(f, torch.randn(8, 16), torch.randn(16, 4))
    assert record.kernels == 2
    assert not any("full" in op or "scalar_tensor" in op for op in record.contents["extern_calls"])


def test_a_scalar_computed_from_a_0d_input_is_computed_inside_each_kernel_reading_it():
    """A dynamic graph passes a model's float as a 0-d input; what the graph computes from it
    alone (``sqrt(scale)``) is computed by each kernel that reads it, not by a kernel of its own."""
    def f(x, w, scale):
        root = torch.sqrt(scale * 2)
        return torch.relu(x * root) @ w * root

    x, w, scale = torch.randn(8, 16), torch.randn(16, 4), torch.tensor(0.7)
    record = compiled_record(f, x, w, scale)
    assert record.kernels == 2
    assert "fill(s), ramp(s) or index expression(s) copied" in " ".join(n["message"] for n in record.notes)


def bias_gradients(dy1, dy2, x):
    """Two column sums of unrelated tensors (a backward's bias gradients) and a row sum."""
    return dy1.sum(0), (dy2 * 2).sum(0), x.sum(1)


def test_independent_reductions_over_one_domain_become_one_kernel():
    args = (torch.randn(64, 32), torch.randn(64, 32), torch.randn(64, 32))
    record = compiled_record(bias_gradients, *args)
    assert record.kernels == 2          # both column sums in one kernel; the row sum reduces other axes


def test_horizontal_fusion_can_be_turned_off():
    args = (torch.randn(64, 32), torch.randn(64, 32), torch.randn(64, 32))
    compiled = compile_with_plan(bias_gradients, "cpu-inference", options={"fuse": {"horizontal": False}})
    with torch.no_grad():
        assert compare(bias_gradients(*args), compiled(*args)) is None
    assert compilation_of(compiled).graphs[0].kernels == 3


def test_a_reduction_that_depends_on_another_through_a_matmul_stays_apart():
    """Merging would make the kernel wait for a matmul that waits for the kernel. (Positive inputs:
    column sums of signed values can cancel to a few units in the last place of fp32, which the
    comparison with eager would count against an unfused reordering of the same sums.)"""
    def f(x, w, y):
        s = x.sum(0, keepdim=True)
        return s, (y + s @ w).sum(0)

    record = compiled_record(f, torch.rand(16, 8), torch.rand(8, 8), torch.rand(16, 8))
    assert record.kernels == 2


def test_a_group_that_grows_a_dependency_is_not_joined_by_what_waits_for_it():
    """``n`` joins exp's group and makes it wait for the sin group (through ``c``); ``m`` then may
    not join the sin group, since ``m`` reads ``x2``, which waits for exp's group."""
    def f(x, y, w):
        a, b = x.exp(), y.sin()
        x2, c = a @ w, b @ w
        n = a + c
        m = b * x2
        return n, m

    record = compiled_record(f, torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8))
    assert record.kernels >= 2


@pytest.mark.parametrize("index", [torch.tensor([[3, -1, 3], [0, -5, 4]]), torch.tensor([2, 2, 2, 2])],
                         ids=["negative-and-repeated", "all-equal"])
def test_accumulating_index_puts_as_index_adds_match_eager(index):
    """index_put(x, [idx], v, accumulate=True) becomes index_add with negative indices wrapped."""
    def f(x, idx, v):
        return x.index_put([idx], v * 2, accumulate=True)

    x, v = torch.randn(5, 3), torch.randn(*index.shape, 3)
    record = compiled_record(f, x, index, v)
    assert "index_add" in record.final_code and "index_put" not in record.final_code


def test_a_node_reading_another_groups_member_sees_that_groups_later_dependencies():
    """A backward graph found by the training property test: ``where_1`` joins the reduction's
    group and reads ``gt`` from the pointwise group; ``where_2`` then may not join ``gt``'s group,
    since it reads ``sum_1``, whose kernel now needs ``gt``'s (fusing it closed a cycle)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from pipeline.testing import run_passes
    aten = torch.ops.aten

    def backward(primals, tangents):
        gt = aten.gt.Tensor(primals, primals)
        total = aten.sum.dim_IntList(tangents, [0], True)
        zero = aten.scalar_tensor.default(0, dtype=torch.float32)
        first = aten.where.self(gt, zero, total)
        second = aten.where.self(gt, total, zero)
        return tangents, aten.add.Tensor(second, first)

    args = [torch.randn(1), torch.randn(2)]
    fused = run_passes(["functionalize", "fuse"], make_fx(backward)(*args), args)
    for got, expected in zip(fused(*args), backward(*args)):
        torch.testing.assert_close(got, expected)


def test_eval_batch_norm_is_one_kernel_with_the_relu_after_it():
    """In eval mode batch norm decomposes to pointwise ops on per-channel values; their two
    ``unsqueeze``\\ s become one view that moves to the per-channel inputs, so the per-channel work
    joins the kernel of the normalization and the ReLU (no ATen batch norm, no per-channel kernel)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16)).eval()
    for norm in (model[1], model[4]):
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
        norm.weight.data.normal_()
        norm.bias.data.normal_()
    compiled = compile_with_plan(model, {"extends": "default", "options": {"channels-last": {"devices": []}}})
    with torch.no_grad():
        for batch in (2, 5):
            x = torch.randn(batch, 8, 12, 12)
            assert compare(model(x), compiled(x)) is None
    record = compilation_of(compiled).graphs[0]
    assert record.kernels == 2, record.contents["kernels"]
    assert not [op for op in record.contents["extern_calls"] if "batch_norm" in op]


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_per_channel_views_of_parameters_are_the_kernels_access_patterns(layout):
    """The batch norm's ``view(weight, [C, 1, 1])`` and its kind are read by the kernel through
    their layout: the host code makes no view, at either memory layout of the activations."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    model[1].running_mean.normal_()
    model[1].running_var.uniform_(0.5, 2.0)
    model = model.to(memory_format=layout)
    compiled = compile_with_plan(model, "default")
    with torch.no_grad():
        x = torch.randn(3, 4, 10, 10).contiguous(memory_format=layout)
        assert compare(model(x), compiled(x)) is None
    record = compilation_of(compiled).graphs[0]
    assert record.kernels == 1 and "aten_view" not in record.final_code, record.final_code
    assert any("read as the kernels' access patterns" in n["message"] for n in record.notes)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), rank=st.integers(2, 4), data=st.data())
def test_unit_reshapes_of_inputs_read_by_a_kernel_preserve_semantics(shape, rank, data):
    """A unit reshape (added or dropped size-1 axes, an expand) of an input, read only by one
    kernel, joins it and is read through its layout: the result matches eager for any placement
    of the unit axes and either operand order."""
    rank = max(rank, len(shape))
    positions = sorted(data.draw(st.lists(st.integers(0, rank - 1), min_size=len(shape), max_size=len(shape),
                                          unique=True)))
    viewed = [1] * rank
    for position, size in zip(positions, shape):
        viewed[position] = size
    domain = [s if s != 1 else data.draw(st.integers(1, 4)) for s in viewed]
    flip = data.draw(st.booleans())
    torch._dynamo.reset()

    def fn(x, v):
        w = v.view(viewed)
        return torch.relu(x * 2 + w) if flip else torch.tanh(w - x)
    x, v = torch.randn(domain), torch.randn(shape)
    record = compiled_record(fn, x, v, plan="default")
    assert "aten_view" not in record.final_code


def test_a_split_elementwise_result_is_computed_in_each_pieces_kernel():
    """where(mask, 0, y) split into SwiGLU halves (a mixture-of-experts layer's pattern): each half
    computes the where itself, so one kernel reads y's halves and nothing writes the whole where."""
    def swiglu_of_masked(x, w, mask):
        y = torch.where(mask.unsqueeze(-1), 0.0, x @ w)
        gate, up = y.split([w.shape[1] // 2] * 2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    args = (torch.randn(12, 16), torch.randn(16, 24), torch.rand(12) > 0.5)
    record = compiled_record(swiglu_of_masked, *args)
    assert record.kernels == 1
    assert any("computed per slice of their result" in n["message"] for n in record.notes)
    torch._dynamo.reset()
    plan = {"extends": "cpu-inference", "options": {"fuse": {"split_elementwise": False}}}
    assert compiled_record(swiglu_of_masked, *args, plan=plan).kernels == 2


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(2, 9), st.integers(-2, 1), st.sampled_from(["split", "chunk", "slice", "narrow"]),
       st.sampled_from(["full", "row", "column", "scalar"]), st.booleans())
def test_slices_of_elementwise_chains_preserve_semantics(rows, cols, dim, how, other, extern_piece):
    """Random elementwise chains whose result is sliced (split, chunk, step-1 slices, narrow)
    along either axis, with a second operand that is full-size (sliced too), broadcast along one
    axis or a scalar, and sometimes a piece an extern call reads (the rewrite must leave it)."""
    x = torch.randn(rows, cols)
    y = {"full": torch.randn(rows, cols), "row": torch.randn(rows, 1), "column": torch.randn(1, cols),
         "scalar": torch.tensor(0.25)}[other]

    def f(x, y):
        z = ((x * y).sigmoid() + y).exp().clamp(max=4.0)
        size = z.shape[dim]
        if how == "split":
            pieces = z.split([size // 2, size - size // 2], dim)
        elif how == "chunk":
            pieces = z.chunk(2, dim)
        elif how == "slice":
            pieces = (z[:, 1:] if dim % 2 else z[1:], z[:, :-1] if dim % 2 else z[:-1])
        else:
            pieces = (z.narrow(dim, 0, 1), z.narrow(dim, size - 1, 1))
        first = pieces[0] * 2 - 1
        last = pieces[-1] @ torch.ones(pieces[-1].shape[-1], 3) if extern_piece else pieces[-1].tanh()
        return first.sum(), last

    torch._dynamo.reset()
    compiled_record(f, x, y)


def test_pointwise_siblings_reading_one_input_are_one_kernel():
    """Two conversions of one tensor for two extern calls: one launch reads it once for both."""
    def two_histograms(s):
        return torch.histc(s.float(), 4, 0, 3), torch.histc((s * 2).float(), 4, 0, 3)

    torch._dynamo.reset()
    s = torch.randint(0, 5, (16,))
    compiled = compile_with_plan(two_histograms, "default")
    for got, want in zip(compiled(s), two_histograms(s)):
        assert compare(want, got) is None
    assert compilation_of(compiled).graphs[0].kernels == 1


def test_independent_pointwise_groups_over_a_small_domain_are_one_kernel():
    """Scalar updates that read nothing in common (each batch norm's num_batches_tracked + 1)
    merge into one kernel; large independent ones stay apart (a longer lifetime would cost memory)."""
    def updates(a, b, c, x, y):
        return a + 1, b * 2, c - 3, x.sin(), y.cos()

    args = (torch.tensor(3), torch.tensor(4.0), torch.randn(8), torch.randn(64, 64), torch.randn(64, 64))
    record = compiled_record(updates, *args)
    calls = [line for line in record.final_code.splitlines() if "cpp_fused" in line]
    assert len(calls) == 4, record.final_code       # a+1 with b*2 (scalars); c, x, y apart
    assert any(line.count("arg") == 2 for line in calls), record.final_code


def test_elementwise_work_read_through_a_regrouping_view_joins_the_reduction():
    """A value computed elementwise (with a broadcast operand) that reductions read through a
    ``[N, C, H, W] -> [N, C, H*W]`` view and another consumer reads through a third shape: the
    work moves into the reductions' shape and is one kernel with them (a group norm's backward)."""
    def grads(x, g, w):
        y = g * (x * w.view(1, -1, 1, 1)).sigmoid()
        return y.view(2, 64, 64).sum(-1), (y * x).view(2, 64, 64).sum(-1), y.view(2, 8, 8, 64) * 2

    record = compiled_record(grads, torch.randn(2, 64, 8, 8), torch.randn(2, 64, 8, 8), torch.randn(64))
    assert record.final_code.count("cpp_fused") == 1, record.final_code


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 5),
       st.sampled_from(["channel", "full", "scalar", "group"]), st.sampled_from(["old", "other-view", "none"]))
def test_moving_work_across_regrouping_views_preserves_semantics(n, groups, per_group, h, w, operand, other):
    """Random group-norm-like shapes: an elementwise chain with an operand broadcast per channel,
    per group or not at all, reduced through a regrouping view, and maybe read again in its own
    shape or through another view; compiled results match eager."""
    channels = groups * per_group
    x = torch.randn(n, channels, h, w)
    b = {"channel": torch.randn(channels, 1, 1), "full": torch.randn(n, channels, h, w),
         "scalar": torch.randn(()), "group": torch.randn(n, channels, 1, 1)}[operand]

    def fn(x, b):
        y = (x * b + 1).tanh() * x
        outs = [y.view(n, groups, per_group * h * w).sum(-1), (y * 3).view(n, channels, h * w).amax(-1)]
        if other == "old":
            outs.append(y.relu())
        elif other == "other-view":
            outs.append(y.view(n, channels * h, w) - 1)
        return tuple(outs)

    torch._dynamo.reset()
    compiled_record(fn, x, b)


def test_an_input_of_a_symbolic_size_equal_to_a_static_one_where_compiled_is_not_lined_up_by_it():
    """A ``[b, t]`` mask read by a kernel over ``[b, heads, t, t]`` through ``unsqueeze(1)`` and
    ``unsqueeze(2)``, compiled with ``b`` symbolic at 2 and 2 heads: lining the mask up through the
    first unsqueeze's ``[b, 1, t]`` puts ``b`` on the heads axis, equal only at the size seen. The
    kernel reads the chain's last layout, and refuses an input whose sizes equal the domain's only
    at the sizes seen; every later batch size matches eager."""
    def f(scores, mask):
        return torch.softmax(scores.masked_fill(~mask.unsqueeze(1).unsqueeze(2), float("-inf")), -1)

    plan = {"extends": "cpu-inference", "options": {"fuse": {"move_views": False}, "capture": {"dynamic": True}}}
    compiled = compile_with_plan(f, plan)
    generator = torch.Generator().manual_seed(0)
    for b, t in ((2, 5), (3, 6), (4, 7), (5, 5)):
        scores = torch.randn(b, 2, t, t, generator=generator)
        mask = torch.rand(b, t, generator=generator) > 0.4
        mask[:, 0] = True
        with torch.no_grad():
            problem = compare(f(scores, mask), compiled(scores, mask), what=f"batch {b}, length {t}")
        assert problem is None, problem
