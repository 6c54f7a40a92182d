"""Indexing inside kernels (passes/fuse/gathers.py ``index_as_gather``, indirect loads in
passes/kernel_ir/loops.py) and reductions over few elements unrolled (passes/fuse/unroll.py), in
the C++ backend and in Triton kernels (run under the interpreter; ``TRITON_INTERPRET`` is set
here, at collection).
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
from kernel_backends import (BACKENDS, CPP, HAS_TRITON, TRITON, compiled_record, kernels_fixture,  # noqa: E402
                             with_fuse)

KERNELS: list = []      # the Triton kernels of the last Triton compile
_record_kernels = kernels_fixture(KERNELS)


def externs(record) -> int:
    """ATen calls other than aliases (views, expands, permutes and slices of inputs: no work)."""
    return sum(n for name, n in record.contents["extern_calls"].items()
               if not any(alias in name for alias in ("view", "expand", "permute", "slice")))


def rows_times(x, idx, w):
    """Rows of ``x`` picked by ``idx``, scaled: a mixture-of-experts layer's token gather."""
    return x[idx] * w


def embedding_norm(ids, table, w):
    """A language model's first lines: token embeddings into a layer norm."""
    return F.layer_norm(F.embedding(ids, table), (table.shape[1],), w)


def weighted_rows(y, order, weights):
    """Each row scaled by its routing weight, both picked in the same order."""
    return y[order] * weights[order].unsqueeze(-1)


def relative_bias(scores, table, idx):
    """Swin's relative position bias: a table's rows picked per (query, key) pair, heads first."""
    n = scores.shape[-1]
    return (scores + table[idx.view(-1)].view(n, n, -1).permute(2, 0, 1)).softmax(-1)


def shifted_window_bias(mask, table, idx):
    """Swin's shifted windows: the bias made contiguous, given a leading axis and added to each
    window's mask (a reshape between the gather and the add must not split the kernel)."""
    n = mask.shape[-1]
    return table[idx.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous().unsqueeze(0) + mask


def bucket_bias(scores, buckets, table):
    """T5's relative attention bias: an embedding of position buckets, heads first."""
    return scores + F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)


def columns(x, idx):
    return (x[:, idx] + 1.0).relu()


def selected(x, idx):
    return torch.index_select(x, 1, idx).sigmoid()


def top2_combine(y, residual):
    """A mixture-of-experts layer's combine: each token's two expert rows summed, plus the residual,
    then an RMS norm."""
    mixed = y.view(residual.shape[0], 2, residual.shape[1]).sum(1) + residual
    return mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("plan", BACKENDS)
@pytest.mark.parametrize("fn,args", [
    (rows_times, (torch.randn(9, 16), torch.randint(0, 9, (12,)), torch.randn(16))),
    (rows_times, (torch.randn(9, 16), torch.randint(-9, 9, (12,), dtype=torch.int32), torch.randn(16))),
    (embedding_norm, (torch.randint(0, 20, (2, 5)), torch.randn(20, 24), torch.randn(24))),
    (embedding_norm, (torch.randint(0, 20, (2, 5)), torch.randn(20, 24, dtype=torch.bfloat16),
                      torch.randn(24, dtype=torch.bfloat16))),
    (weighted_rows, (torch.randn(10, 8), torch.randperm(10), torch.rand(10))),
    (columns, (torch.randn(3, 7, 4), torch.tensor([6, 0, -1, 2]))),
    (selected, (torch.randn(3, 7, 4), torch.tensor([6, 0, 3, 2]))),
    (relative_bias, (torch.randn(2, 3, 9, 9), torch.randn(25, 3), torch.randint(0, 25, (9, 9)))),
    (bucket_bias, (torch.randn(2, 4, 6, 6), torch.randint(0, 10, (6, 6)), torch.randn(10, 4))),
    (shifted_window_bias, (torch.randn(4, 1, 9, 9), torch.randn(25, 3), torch.randint(0, 25, (9, 9)))),
], ids=["rows", "rows_int32_negative", "embedding_norm", "embedding_norm_bf16", "weighted_rows", "columns",
        "index_select", "relative_bias_through_permute", "bucket_bias_through_permute", "shifted_window_bias"])
def test_indexing_is_read_by_the_consuming_kernel(plan, fn, args):
    record = compiled_record(fn, *args, plan=plan)
    assert record.kernels == 1 and externs(record) == 0, record.final_code
    assert "aten_index" not in record.final_code and "aten_embedding" not in record.final_code
    assert any("computed as gathers" in n["message"] for n in record.notes)


def test_gather_loads_off_keeps_the_aten_call():
    record = compiled_record(rows_times, torch.randn(9, 16), torch.randint(0, 9, (12,)), torch.randn(16),
                             plan=with_fuse(CPP, gather_loads=False))
    assert "aten_index" in record.final_code and record.kernels == 1


def test_indexing_read_only_by_an_extern_call_stays_aten():
    record = compiled_record(lambda x, idx, w: x[idx] @ w, torch.randn(9, 16), torch.randint(0, 9, (4,)),
                             torch.randn(16, 3))
    assert "aten_index" in record.final_code and record.kernels == 0


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_gathered_input_is_never_the_output_buffer(plan):
    """A permutation of a kernel's dying intermediate reads it at other rows than it writes: the
    kernel must not write its result into the intermediate (donation)."""
    def permute_rows(x, order):
        y = x.exp() @ torch.eye(x.shape[1])       # an extern result no one else reads
        return y[order] + 1.0

    x, order = torch.randn(8, 4), torch.randperm(8)
    record = compiled_record(permute_rows, x, order, plan=plan)
    assert record.kernels == 2


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_sum_over_two_rows_joins_the_norm_kernel(plan):
    record = compiled_record(top2_combine, torch.randn(12, 16), torch.randn(6, 16), plan=plan)
    assert record.kernels == 1, record.final_code
    assert any("computed elementwise" in n["message"] for n in record.notes)


def test_unroll_reductions_zero_keeps_the_reduction_kernel():
    record = compiled_record(top2_combine, torch.randn(12, 16), torch.randn(6, 16),
                             plan=with_fuse(CPP, unroll_reductions=0))
    assert record.kernels == 2


@pytest.mark.parametrize("plan", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "sum_keepdim", "sum_all", "bool_sum"])
def test_small_reductions_unrolled_match_eager(plan, reduce):
    def fn(x, r):
        y = x.view(r.shape[0], 3, r.shape[1])
        if reduce == "sum_keepdim":
            out = y.sum(1, keepdim=True).squeeze(1)
        elif reduce == "sum_all":
            out = x.view(-1)[:5].sum() + r
        elif reduce == "bool_sum":
            out = (y > 0).sum(1) + r
        else:
            out = getattr(y, reduce)(1)
        return out + r

    for dtype in (torch.float32, torch.bfloat16):
        record = compiled_record(fn, torch.randn(15, 4, dtype=dtype), torch.randn(5, 4, dtype=dtype), plan=plan)
        assert record.kernels == 1, record.final_code


def test_a_sum_of_an_input_that_no_kernel_reads_stays_a_reduction():
    """A bias gradient over a batch of 4 (a sum of a value read from memory, returned): unrolled it
    would be four views the host makes per call feeding the same one kernel."""
    record = compiled_record(lambda g: g.sum(0), torch.randn(4, 16))
    assert record.kernels == 1 and "slice" not in record.final_code and "reinterpret" not in record.final_code
    assert not any("computed elementwise" in n["message"] for n in record.notes)


def test_a_softmax_over_few_elements_stays_a_reduction():
    """Its kernel already holds the work that reads the max: unrolled it would only read more inputs."""
    record = compiled_record(lambda x: torch.softmax(x, -1), torch.randn(6, 4))
    assert record.kernels == 1 and not any("computed elementwise" in n["message"] for n in record.notes)


@pytest.mark.skipif(not HAS_TRITON, reason="no triton")
def test_kernels_with_indirect_loads_compile_for_sm90():
    """The gathers' indirect loads compile to PTX and a cubin for the H200, no GPU needed."""
    from passes.codegen.triton.runtime import compile_all_for_sm90
    made = []
    for fn, args in [(rows_times, (torch.randn(9, 16), torch.randint(0, 9, (12,)), torch.randn(16))),
                     (embedding_norm, (torch.randint(0, 20, (2, 5)), torch.randn(20, 24, dtype=torch.bfloat16),
                                       torch.randn(24, dtype=torch.bfloat16)))]:
        compiled_record(fn, *args, plan=TRITON)
        made += KERNELS
    results = compile_all_for_sm90(made)
    assert len(results) == 2 and all(r["ptx_bytes"] > 0 and r["cubin_bytes"] > 0 for r in results)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 7), width=st.sampled_from([1, 3, 8]), picks=st.integers(1, 9), dim=st.integers(0, 1),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64]), negative=st.booleans(),
       reduced=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_random_gathers_and_small_sums_match_eager(rows, width, picks, dim, dtype, negative, reduced, seed):
    """Random row or column picks (wrapped negative indices, any dtype) feeding elementwise work and
    a sum over a few picked entries, compiled with the C++ backend, against eager."""
    generator = torch.Generator().manual_seed(seed)
    shape = (rows, width)
    x = (torch.randn(shape, generator=generator) * 4).to(dtype)
    size = shape[dim]
    low = -size if negative else 0
    idx = torch.randint(low, size, (picks * reduced,), generator=generator)

    def fn(x, idx):
        picked = x[idx] if dim == 0 else x[:, idx]
        scaled = picked * 2 + 1
        if dim == 0:
            return scaled.view(picks, reduced, width).sum(1)
        return scaled.view(rows, picks, reduced).amax(2)

    compiled_record(fn, x, idx)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(table=st.integers(2, 30), width=st.integers(1, 5), index_shape=st.lists(st.integers(1, 6), min_size=1, max_size=2),
       order=st.randoms(use_true_random=False), lead=st.booleans(), contiguous=st.booleans(),
       embedding=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_random_picks_read_through_a_permute_match_eager(table, width, index_shape, order, lead, contiguous,
                                                          embedding, seed):
    """A table's rows picked by an index of one or two dims, then permuted (random orders, some
    keeping the index's dims in order, some not), optionally made contiguous and given a leading
    axis, then added to a broadcast operand: the C++ backend against eager, whatever was fused."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(table, width, generator=generator)
    idx = torch.randint(0, table, tuple(index_shape), generator=generator)
    dims = list(range(len(index_shape) + 1))
    order.shuffle(dims)
    shape = [(tuple(index_shape) + (width,))[d] for d in dims]
    other = torch.randn([2, *shape] if lead else shape, generator=generator)

    def fn(weights, idx, other):
        picked = F.embedding(idx, weights) if embedding else weights[idx]
        moved = picked.permute(dims)
        if contiguous:
            moved = moved.contiguous()
        if lead:
            moved = moved.unsqueeze(0)
        return moved + other

    compiled_record(fn, weights, idx, other)


@pytest.mark.parametrize("plan", BACKENDS)
def test_index_arithmetic_joins_the_gathering_kernel(plan):
    """A mixture-of-experts layer's token of each slot, ``x[order // top_k]``: the floor division
    (by a literal) is computed by the kernel that gathers the rows."""
    def tokens_of_slots(x, order, w):
        return x[torch.div(order, 2, rounding_mode="floor")] * w

    record = compiled_record(tokens_of_slots, torch.randn(6, 8), torch.randperm(12), torch.randn(8), plan=plan)
    assert record.kernels == 1 and externs(record) == 0, record.final_code


def test_an_index_ramp_only_extern_calls_read_is_a_stored_constant():
    """An inverse permutation ``index_put(empty, [order], arange(n))``: the ramp is stored once,
    not made by an ATen call on every run."""
    def inverse(order, y):
        slots = torch.empty_like(order)
        slots[order] = torch.arange(order.shape[0])
        return y[slots] + 1.0

    record = compiled_record(inverse, torch.randperm(10), torch.randn(10, 4))
    assert "aten_arange" not in record.final_code
    assert any("index ramp(s) outside kernels stored" in n["message"] for n in record.notes)


@pytest.mark.parametrize("plan", BACKENDS)
def test_a_sum_over_gathered_rows_is_read_by_the_next_kernel(plan):
    """A mixture-of-experts combine: expert rows put back in token order by a permutation, each
    token's two rows summed, viewed as [batch, seq, hidden], added to the residual and normed.
    The sum is unrolled over slices of the index, so the norm's kernel gathers the rows itself."""
    def combine(y, order, residual):
        mixed = y[order].view(-1, 2, y.shape[1]).sum(1).view(residual.shape) + residual
        return mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + 1e-6)

    record = compiled_record(combine, torch.randn(12, 8), torch.randperm(12), torch.randn(2, 3, 8), plan=plan)
    assert record.kernels == 1 and externs(record) == 0, record.final_code


def test_module_in_a_fresh_process():
    rerun_with_interpreter(__file__)
