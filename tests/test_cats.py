"""Concatenations and pads inside kernels (passes/fuse/cats.py, padded loads in
passes/kernel_ir/loops.py): a cat whose pieces or readers are elementwise becomes a select over
its pieces placed at their offsets, and the consuming kernel reads each piece with a masked,
shifted load, in the C++ backend and in Triton kernels (run under the interpreter, as in
test_triton_backend.py; ``TRITON_INTERPRET`` is set here, at collection).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import rerun_with_interpreter  # noqa: E402
from kernel_backends import BACKENDS, CPP, HAS_TRITON, TRITON, compiled_record, kernels_fixture  # noqa: E402
from pipeline import compilation_of, compile_with_plan  # noqa: E402

KERNELS: list = []      # the Triton kernels of the last Triton compile
_record_kernels = kernels_fixture(KERNELS)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(q, cos, sin):
    """A rotary position embedding as decoders apply it to queries and keys."""
    return q * cos + rotate_half(q) * sin


def partial_rotary(q, cos, sin):
    """Rotary embedding of the first ``cos.shape[-1]`` features, the rest passed through."""
    rotated, kept = q[..., :cos.shape[-1]], q[..., cos.shape[-1]:]
    return torch.cat((rotary(rotated, cos, sin), kept), dim=-1)


def rotary_in_float(q, cos, sin):
    """The embedding of bfloat16 queries computed in float32 and rounded back."""
    return rotary(q.float(), cos, sin).to(q.dtype)


def rotary_inputs(rotated: int, total: int, dtype=torch.float32):
    return torch.randn(2, 3, 5, total).to(dtype), torch.randn(5, rotated), torch.randn(5, rotated)


@pytest.mark.parametrize("plan", BACKENDS)
@pytest.mark.parametrize("fn,args", [(rotary, rotary_inputs(16, 16)), (partial_rotary, rotary_inputs(8, 24)),
                                     (rotary_in_float, rotary_inputs(16, 16, torch.bfloat16))],
                         ids=["rotary", "partial_rotary", "rotary_in_float"])
def test_rotary_embeddings_are_one_kernel(plan, fn, args):
    record = compiled_record(fn, *args, plan=plan)
    assert record.kernels == 1
    assert "aten_cat" not in record.final_code and "aten_constant_pad_nd" not in record.final_code
    assert any("computed as selects" in n["message"] for n in record.notes)


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
def test_kernels_with_padded_loads_compile_for_sm90():
    """The masked, shifted loads compile to PTX and a cubin for the H200, no GPU needed."""
    from passes.codegen.triton.runtime import compile_all_for_sm90
    made = []
    for fn, args in [(rotary, rotary_inputs(16, 16)), (partial_rotary, rotary_inputs(8, 24)),
                     (rotary_in_float, rotary_inputs(16, 16, torch.bfloat16))]:
        compiled_record(fn, *args, plan=TRITON)
        made += KERNELS
    pieces = [torch.randn(2, c, 3, 5).to(memory_format=torch.channels_last) for c in (4, 2, 2, 2, 2, 2, 2, 2)]
    compiled_record(_dense_layer, torch.randn(18, 1, 1), torch.randn(18, 1, 1), *pieces,
                    plan=_with_cat_limits(TRITON, max_cat_inputs=8))
    made += KERNELS         # a DenseNet layer's select over eight channels-last pieces
    results = compile_all_for_sm90(made)
    assert len(results) == 4 and all(r["ptx_bytes"] > 0 and r["cubin_bytes"] > 0 for r in results)


def test_max_cat_inputs_zero_keeps_the_cat():
    plan = {**CPP, "options": {**CPP["options"], "fuse": {"max_cat_inputs": 0}}}
    record = compiled_record(rotary, *rotary_inputs(16, 16), plan=plan)
    assert "aten_cat" in record.final_code and record.kernels == 2


def test_a_cat_with_more_pieces_than_the_limit_stays_a_cat():
    record = compiled_record(lambda x: torch.cat([x.sin()] * 5, dim=1).exp(), torch.randn(3, 4))
    assert "aten_cat" in record.final_code


def _dense_layer(scale, shift, *pieces):
    return torch.relu(torch.cat(pieces, dim=1) * scale + shift)


def _with_cat_limits(plan, **fuse):
    return {**plan, "options": {**plan["options"], "fuse": fuse}}


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_cat_along_an_outer_dim_computes_its_masks_in_the_kernel_that_reads_it(plan):
    """The ``iota < offset`` masks of a select over pieces along dim 1 are index expressions: each
    kernel reading them computes them (they were a kernel of their own, writing boolean masks)."""
    def scaled(a, b, c, w):
        return torch.relu(torch.cat([a, b, c], 1) * w)

    record = compiled_record(scaled, *[torch.randn(2, 3 + i, 4, 4) for i in range(3)], torch.randn(12, 1, 1),
                             plan=plan)
    assert record.kernels == 1, record.final_code


def test_the_limit_is_per_device_type():
    """A 5-piece cat stays ATen's on the CPU by default; ``max_cat_inputs_by_device`` raises the
    CPU's limit (and replaces ``max_cat_inputs`` there)."""
    fn = lambda x: torch.cat([x.sin()] * 5, dim=1).exp()     # noqa: E731
    record = compiled_record(fn, torch.randn(3, 4), plan=_with_cat_limits(CPP, max_cat_inputs=0,
                                                                           max_cat_inputs_by_device={"cpu": 8}))
    assert "aten_cat" not in record.final_code and record.kernels == 1


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_wide_channels_last_cat_read_by_a_norm_and_relu_is_one_kernel_of_that_layout(plan):
    """A DenseNet layer: the concatenation of every earlier output, channels-last, read by an eval
    batch norm and a ReLU. The kernel reads the six pieces and writes the activation in the cat's
    layout (the convolution after it gets what eager would give it)."""
    dense = _dense_layer
    pieces = [torch.randn(2, c, 3, 5).to(memory_format=torch.channels_last) for c in (4, 2, 2, 2, 2, 2)]
    scale, shift = torch.randn(14, 1, 1), torch.randn(14, 1, 1)
    record = compiled_record(dense, scale, shift, *pieces, plan=_with_cat_limits(plan, max_cat_inputs=8))
    assert record.kernels == 1 and "aten_cat" not in record.final_code, record.final_code
    compiled = compile_with_plan(dense, _with_cat_limits(plan, max_cat_inputs=8))
    assert compiled(scale, shift, *pieces).stride() == dense(scale, shift, *pieces).stride()


def test_the_backward_of_a_rotary_embedding_pads_its_gradient_pieces():
    """slice(x) backward is slice_scatter(zeros, grad): computed as a pad, which the kernel adding
    the pieces reads as masked loads (no zero tensor written per piece)."""
    q = torch.randn(2, 3, 5, 16, requires_grad=True)
    cos, sin = torch.randn(5, 16), torch.randn(5, 16)
    plan = {"extends": "training", "options": {"capture": {"fullgraph": True}}}
    torch._dynamo.reset()
    compiled = compile_with_plan(rotary, plan)
    grad = torch.randn(2, 3, 5, 16)
    expected = torch.autograd.grad(rotary(q, cos, sin), q, grad)[0]
    got = torch.autograd.grad(compiled(q, cos, sin), q, grad)[0]
    torch.testing.assert_close(got, expected)
    backward = next(r for r in compilation_of(compiled).graphs if r.graph_id.endswith("backward"))
    assert "slice_scatter" not in backward.final_code and "aten_full" not in backward.final_code, backward.final_code


@settings(deadline=None, max_examples=40, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(st.data())
def test_random_slice_scatters_into_fills_preserve_semantics(data):
    """slice_scatter(full(v), src, dim, start, end) of any rank, dim, start (negative too) and fill,
    read by elementwise work, on both backends."""
    plan = data.draw(st.sampled_from([CPP, TRITON] if HAS_TRITON else [CPP]))
    rank = data.draw(st.integers(1, 3))
    shape = [data.draw(st.integers(1, 6)) for _ in range(rank)]
    dim = data.draw(st.integers(-rank, rank - 1))
    size = shape[dim]
    length = data.draw(st.integers(0, size))
    start = data.draw(st.integers(0, size - length))
    end = start + length
    if length and data.draw(st.booleans()):    # the same slice, counted from the end
        start, end = start - size, (end - size if end < size else None)
    fill = data.draw(st.sampled_from([0.0, 1.5, -2.0]))
    piece = list(shape)
    piece[dim] = length

    def f(src, other):
        return torch.slice_scatter(torch.full(shape, fill), src * 2, dim, start, end) * other

    compiled_record(f, torch.randn(piece), torch.randn(shape), plan=plan)


def test_cat_limits_name_known_devices_and_count_from_zero():
    from pipeline.errors import PlanError
    for limits in ({"tpu": 8}, {"cuda": -1}):
        with pytest.raises(PlanError, match="max_cat_inputs_by_device"):
            compile_with_plan(lambda x: x + 1, _with_cat_limits(CPP, max_cat_inputs_by_device=limits))


def test_a_cat_of_extern_results_read_by_an_extern_call_stays_a_cat():
    """A key-value cache's append: nothing elementwise to join, so the cat is ATen's copy."""
    def append(past, x, w, q):
        return q @ torch.cat((past, x @ w), dim=0).T

    record = compiled_record(append, torch.randn(6, 8), torch.randn(2, 8), torch.randn(8, 8), torch.randn(3, 8))
    assert "aten_cat" in record.final_code


def test_a_cat_of_extern_results_read_by_a_reduction_stays_a_cat():
    """A U-Net's skip connection into a group norm: a reduction kernel would not read the pieces."""
    def skip_then_norm(x, skip, w):
        return torch.nn.functional.group_norm(torch.cat((x @ w, skip @ w), dim=1), 2)

    record = compiled_record(skip_then_norm, torch.randn(3, 4, 8), torch.randn(3, 4, 8), torch.randn(8, 8))
    assert "aten_cat" in record.final_code


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_pad_of_an_input_joins_the_kernel_that_reads_it(plan):
    """A user's F.pad (any fill value, both ends, two dims) is read as masked loads."""
    def padded_sum(x, y):
        return F.pad(x, (1, 2, 0, 3), value=1.5) * y + 1

    record = compiled_record(padded_sum, torch.randn(4, 5, 6), torch.randn(4, 8, 9), plan=plan)
    assert record.kernels == 1 and "aten_constant_pad_nd" not in record.final_code


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
def test_a_pad_of_zero_widths_is_a_copy_that_fuses(layout):
    """Swin pads its windows by what the image lacks: nothing, here. The zero pad is a copy in the
    pad's own layout (channels-last stays so), read by the softmax's kernel, not an ATen call."""
    def window_softmax(x):
        padded = F.pad(x, (0, 0, 0, 0, 0, 0))
        return torch.softmax(padded.view(-1, 4 * 6) if padded.is_contiguous() else padded.reshape(-1, 24), -1)

    x = torch.randn(2, 3, 4, 6)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "permuted":
        x = torch.randn(2, 4, 6, 3).permute(0, 3, 1, 2)
    record = compiled_record(window_softmax, x)
    assert "aten_constant_pad_nd" not in record.final_code, record.final_code
    compiled = compile_with_plan(lambda x: F.pad(x, (0, 0, 0, 0)) * 2, "default")
    out = compiled(x)
    torch.testing.assert_close(out, F.pad(x, (0, 0, 0, 0)) * 2)
    assert out.stride() == (F.pad(x, (0, 0, 0, 0)) * 2).stride()


def test_a_pad_read_by_a_reduction_stays_an_aten_pad():
    """Reduction kernels do not read padded inputs: the pad is ATen's, and the result is exact."""
    record = compiled_record(lambda x: torch.softmax(F.pad(x, (2, 1), value=-1.0), -1), torch.randn(4, 7))
    assert "aten_constant_pad_nd" in record.final_code


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_kernel_reading_a_shifted_input_never_writes_its_output_into_that_input(plan):
    """``cat(z[:, 1:], z[:, :1]) + 1`` of a dying intermediate ``z`` of the output's layout: the
    host code may not hand ``z``'s buffer to the kernel as its output (it reads ``z`` shifted)."""
    def roll_then_add(a):
        z = a * 2
        return torch.cat((z[:, 1:], z[:, :1]), dim=1) + 1

    compiled_record(roll_then_add, torch.randn(64, 700), plan=plan)


def test_integer_pieces_are_padded_not_divided_by_the_padding():
    """Integer work on a piece stays above the pad (a division by the padding's zeros would raise
    in eager execution)."""
    def int_pieces(a, b):
        return torch.cat((a // b, a % b), dim=1) * 3

    a, b = torch.randint(1, 50, (4, 6)), torch.randint(1, 7, (4, 6))
    compiled_record(int_pieces, a, b)


@settings(deadline=None, max_examples=60, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(st.data())
def test_random_cats_preserve_semantics(data):
    """Cats of 2 to 5 pieces along any dim, pieces of any size (one element, empty) computed by
    elementwise chains with broadcast operands or read as they are, read by elementwise work, a
    reduction or an extern call, in float32, bfloat16 (C++), int64 and bool, on both backends."""
    plan = data.draw(st.sampled_from([CPP, TRITON] if HAS_TRITON else [CPP]))
    rank = data.draw(st.integers(1, 3))
    dim = data.draw(st.integers(-rank, rank - 1))
    # The Triton interpreter's float32 -> bfloat16 conversion can differ from eager's rounding by
    # one bfloat16 step, with or without cats (the kernel rounds as eager does; on a GPU it agrees).
    dtypes = [torch.float32, torch.int64, torch.bool] + ([torch.bfloat16] if plan is CPP else [])
    dtype = data.draw(st.sampled_from(dtypes))
    sizes = data.draw(st.lists(st.integers(0, 9), min_size=2, max_size=5))
    base = [data.draw(st.integers(1, 5)) for _ in range(rank)]
    pieces = []
    for size in sizes:
        shape = list(base)
        shape[dim] = size
        pieces.append(_random_tensor(shape, dtype))
    scale = _random_tensor([1] * rank, dtype)
    reader = data.draw(st.sampled_from(["elementwise", "sum", "extern", "none"]))
    work = [data.draw(st.sampled_from(["none", "neg", "scale", "compare"])) for _ in sizes]

    def f(scale, *pieces):
        made = [_piece_work(p, w, scale) for p, w in zip(pieces, work)]
        out = torch.cat(made, dim)
        if reader == "elementwise":
            return (out * scale) if out.dtype != torch.bool else out ^ (scale > 0)
        if reader == "sum":
            return out.float().sum(dim)
        if reader == "extern":
            return out.float().flatten() @ torch.ones(out.numel())
        return out

    compiled_record(f, scale, *pieces, plan=plan)


def _random_tensor(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.int64:
        return torch.randint(1, 9, shape)
    return torch.randn(shape).to(dtype)


def _piece_work(piece, work, scale):
    if work == "none":
        return piece
    if piece.dtype == torch.bool:
        return ~piece if work == "neg" else piece & (scale > 0)
    if work == "neg":
        return -piece
    if work == "scale":
        return piece * scale + 1
    return torch.where(piece > scale, piece, scale * 2)


def geglu_gradient(grad, gate, value):
    """The gradient of ``value * gelu(gate)`` with respect to the projection that made both halves:
    a cat along the last dim of two elementwise pieces (as a GEGLU's backward has it)."""
    return torch.cat([grad * F.gelu(gate), grad * value * torch.exp(-gate * gate)], dim=-1) * 2


def test_a_cat_select_computes_each_piece_in_a_loop_of_its_own(cpp_kernels_made):
    """In C++, the select over a cat's pieces runs one loop per piece, computing only that piece's
    branch: one GELU and one exp per element, not both, and no masked loads."""
    args = [torch.randn(6, 40) for _ in range(3)]
    compiled_record(geglu_gradient, *args, plan=CPP)
    (kernel,) = cpp_kernels_made
    loops = [line for line in kernel.source.splitlines() if "for (int64_t i1 =" in line]
    assert len(loops) == 2 and "i1 = 40;" in loops[1], kernel.source
    assert kernel.source.count("pp_gelu_erf(") == 1 and kernel.source.count("pp_exp(") == 1
    assert "? " not in kernel.source      # no masked load left


def test_a_cat_along_an_outer_dim_branches_per_piece_outside_the_inner_loop(cpp_kernels_made):
    """Pieces along an outer axis are decided once per outer index: one branch per piece around
    the inner loop."""
    a, b = torch.randn(2, 3, 7), torch.randn(2, 5, 7)
    compiled_record(lambda a, b: torch.cat([a.sin(), b.cos()], dim=1) + 1, a, b, plan=CPP)
    (kernel,) = cpp_kernels_made
    assert "if (i1 >= 0 && i1 < 3) {" in kernel.source and "} else {" in kernel.source, kernel.source
    assert kernel.source.count("pp_sin(") == 1 and kernel.source.count("pp_cos(") == 1


_COMPARISONS = [torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne]


@settings(deadline=None, max_examples=60, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(st.data())
def test_random_selects_on_index_ramps_preserve_semantics(data):
    """Selects on comparisons of index ramps (any start and step, either axis, integer or float
    constants inside or outside the range, combined with and/or/not) against eager, on both
    backends: what the C++ backend's per-piece loops (passes/codegen/cpp/pieces.py) decide."""
    plan = data.draw(st.sampled_from([CPP, TRITON] if HAS_TRITON else [CPP]))
    plan = {**plan, "remove": ["constant-fold"]}    # the ramps stay in the kernel, not a folded mask
    rows, cols = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 40))
    axis = data.draw(st.sampled_from([0, 1]))
    length = (rows, cols)[axis]
    start, step = data.draw(st.integers(-5, 5)), data.draw(st.sampled_from([1, 2, 3, -1, -2]))
    tests = [(data.draw(st.sampled_from(_COMPARISONS)),
              data.draw(st.one_of(st.integers(-8, 2 * length + 8), st.floats(-8, 2 * length + 8))))
             for _ in range(data.draw(st.integers(1, 2)))]
    combine = data.draw(st.sampled_from(["and", "or", "not"]))

    def f(x):
        ramp = torch.arange(start, start + step * length, step)[:length]
        ramp = ramp[:, None] if axis == 0 else ramp
        conds = [op(ramp, c) for op, c in tests]
        cond = conds[0] if len(conds) == 1 else (conds[0] & conds[1] if combine == "and" else conds[0] | conds[1])
        cond = ~cond if combine == "not" else cond
        return torch.where(cond, x.sin(), x * 2) + 1

    compiled_record(f, torch.randn(rows, cols), plan=plan)


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET."""
    if not HAS_TRITON:
        pytest.skip("no triton")
    rerun_with_interpreter(__file__)
