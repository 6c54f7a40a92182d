"""Every built-in pass preserves semantics on random graphs (hypothesis, against eager PyTorch)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.testing import FLOAT_DTYPES, assert_preserves_semantics, graphs

FAST = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
MIXED = FLOAT_DTYPES + (torch.int32,)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield


@FAST
@given(graphs(dtypes=MIXED, mutation=True, input_mutation=True, max_ops=10))
def test_functionalize_preserves_semantics_with_in_place_updates(case):
    assert_preserves_semantics("functionalize", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=10))
def test_decompose_preserves_semantics(case):
    assert_preserves_semantics("decompose", case)


@FAST
@given(graphs(dtypes=MIXED, mutation=True, max_ops=10))
def test_dce_preserves_semantics(case):
    assert_preserves_semantics("dce", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=10))
def test_cse_preserves_semantics(case):
    assert_preserves_semantics("cse", case)


@FAST
@given(graphs(dtypes=MIXED, constants=True, max_ops=10))
def test_constant_fold_preserves_semantics(case):
    assert_preserves_semantics("constant-fold", case)


@FAST
@given(graphs(dtypes=MIXED, max_ops=12))
def test_fuse_preserves_semantics(case):
    assert_preserves_semantics("fuse", case)


@settings(FAST, max_examples=40)
@given(graphs(dtypes=MIXED, max_ops=12, max_dim=9))
def test_cpp_codegen_preserves_semantics(case):
    assert_preserves_semantics("codegen", case)


@settings(FAST, max_examples=25)
@given(graphs(dtypes=MIXED, max_ops=12, max_dim=9))
def test_cpp_codegen_with_buffer_reuse_preserves_semantics(case):
    """Kernels writing into dead tensors' buffers (the host code's ``reuse=``, on by default for
    CUDA tensors only) compute what eager does."""
    from passes.codegen import Codegen, CodegenOptions
    assert_preserves_semantics(Codegen(CodegenOptions(reuse_buffers=["cpu"])), case)


@settings(FAST, max_examples=15)
@given(graphs(dtypes=(torch.float32,), mutation=True, input_mutation=True, max_ops=8))
def test_capture_with_the_debug_plan_preserves_semantics(case):
    assert_preserves_semantics("debug", case)


@settings(FAST, max_examples=15)
@given(graphs(dtypes=(torch.float32, torch.bfloat16), max_ops=10))
def test_default_plan_preserves_semantics(case):
    assert_preserves_semantics("default", case)


matmul_shapes = st.fixed_dictionaries({
    "m": st.integers(1, 9), "k": st.integers(1, 20), "n": st.integers(1, 20),
    "bias": st.sampled_from(["none", "row", "full"]), "transposed": st.booleans(),
    "left_transposed": st.booleans(),
})


@settings(FAST, max_examples=30)
@given(matmul_shapes)
def test_pad_mm_preserves_semantics(shape):
    """Padded K, N and (for a transposed left operand, as in a weight gradient) M, with and without
    bias; the left operand's source also feeds a second matmul, so a shared pad is exercised."""
    from passes.pad_mm import PadMatmul, PadMmOptions

    m, k, n = shape["m"], shape["k"], shape["n"]
    weight = torch.randn(n, k) if shape["transposed"] else torch.randn(k, n)
    left_t = shape["left_transposed"]

    def matmul(x, w, b):
        left = x.t() if left_t else x
        product = left @ (w.t() if shape["transposed"] else w)
        out = product if shape["bias"] == "none" else product + b
        return out, (x @ x.t() if left_t else x.t() @ x)

    bias = torch.randn(n) if shape["bias"] == "row" else torch.randn(m, n)
    x = torch.randn(k, m) if left_t else torch.randn(m, k)
    pass_ = PadMatmul(PadMmOptions(multiple=8, min_size=1, devices=["cpu"]))
    graph = compat_trace(matmul, [x, weight, bias])
    assert_preserves_semantics(pass_, graph, [x, weight, bias])


def test_pad_mm_pads_a_twice_transposed_weight_in_its_own_layout():
    """``x @ w.t().t()`` (a tied embedding's backward reads the weight so) pads ``w`` itself: a
    dense copy. Padding the transposed view in between was a transposing copy (0.37 ms for
    GPT-2's 50257 x 768 weight on the H200, against a dense copy's few microseconds)."""
    from passes.pad_mm import PadMatmul, PadMmOptions
    from passes.kernel_ir.groups import meta_of

    def matmul(x, w):
        return x @ w.t().t()

    inputs = [torch.randn(4, 13), torch.randn(13, 6)]
    graph = compat_trace(matmul, inputs)
    pass_ = PadMatmul(PadMmOptions(multiple=8, min_size=1, devices=["cpu"]))
    assert_preserves_semantics(pass_, graph, inputs)
    from pipeline import PassContext
    context = PassContext(graph_id="t", target="cpu", example_inputs=inputs, tags={"aten"})
    padded = pass_.run(compat_trace(matmul, inputs), context)
    pads = [n for n in padded.graph.nodes if n.target is torch.ops.aten.constant_pad_nd.default]
    assert pads and all(meta_of(n.args[0]).is_contiguous() for n in pads)


def test_pad_mm_gives_every_node_it_makes_the_matmuls_source_line():
    """The pads, clones, slices and the padded matmul keep the matmul's stack trace, so a profile
    names the user's line for the weight-padding kernel too."""
    from pipeline import PassContext
    from passes.pad_mm import PadMatmul, PadMmOptions

    inputs = [torch.randn(4, 13), torch.randn(1029, 13), torch.randn(1029)]
    graph = compat_trace(lambda x, w, b: torch.nn.functional.linear(x, w, b), inputs)
    before = set(graph.graph.nodes)
    for node in graph.graph.nodes:
        if node.op == "call_function":
            node.meta["stack_trace"] = 'File "model.py", line 7, in forward'
    context = PassContext(graph_id="t", target="cpu", example_inputs=inputs, tags={"aten"})
    padded = PadMatmul(PadMmOptions(multiple=8, min_size=1, devices=["cpu"])).run(graph, context)
    made = [n for n in padded.graph.nodes if n.op == "call_function" and n not in before]
    assert any("constant_pad_nd" in str(n.target) for n in made)
    assert all(n.meta.get("stack_trace") == 'File "model.py", line 7, in forward' for n in made), made


def test_a_padded_weight_is_copied_by_one_generated_kernel():
    """pad-mm pads a graph input through a clone, which fuse turns into a copy kernel writing the
    padded buffer (no ATen ``constant_pad_nd``: a fill of the whole buffer, then a copy into it)."""
    from pipeline import compilation_of, compile_with_plan
    from pipeline.numerics import compare

    weight = torch.randn(1029, 64)

    def head(x, w):
        return x @ w.t()

    plan = {"extends": "cpu-inference", "options": {"pad-mm": {"devices": ["cpu"]}}}
    compiled = compile_with_plan(head, plan)
    x = torch.randn(32, 64)
    assert compare(head(x, weight), compiled(x, weight)) is None
    (record,) = compilation_of(compiled).graphs
    assert "constant_pad_nd" not in record.final_code and record.kernels == 2      # the pad and the output copy


@FAST
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 40), st.booleans(), st.booleans())
def test_transpose_weights_preserves_semantics(rows, inner, outer, bias, parameter):
    from passes.transpose_weights import TransposeWeights, TransposeWeightsOptions

    def linear(x, w, b):
        return torch.nn.functional.linear(x, w, b if bias else None).relu()

    weight = torch.randn(outer, inner)
    inputs = [torch.randn(rows, inner), torch.nn.Parameter(weight, requires_grad=False) if parameter else weight,
              torch.randn(outer)]
    pass_ = TransposeWeights(TransposeWeightsOptions(enabled=True))
    with torch.no_grad():
        assert_preserves_semantics(pass_, compat_trace(linear, inputs), inputs)


@FAST
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 40), st.booleans(), st.booleans())
def test_pack_weights_preserves_semantics(rows, inner, outer, bias, parameter):
    from passes.pack_weights import PackWeights, PackWeightsOptions, mkl_packing_available
    if not mkl_packing_available():
        pytest.skip("this torch build has no MKL")

    def linear(x, w, b):
        return torch.nn.functional.linear(x, w, b if bias else None).relu()

    weight = torch.randn(outer, inner)
    inputs = [torch.randn(rows, inner), torch.nn.Parameter(weight, requires_grad=False) if parameter else weight,
              torch.randn(outer)]
    pass_ = PackWeights(PackWeightsOptions(enabled=True, min_flops=0))
    with torch.no_grad():
        assert_preserves_semantics(pass_, compat_trace(linear, inputs), inputs)


def compat_trace(fn, inputs):
    """An ATen-level graph of ``fn`` (mm/addmm/t nodes, which pad-mm rewrites)."""
    from pipeline import compat
    return compat.retrace(torch.fx.symbolic_trace(fn), inputs)
