"""One-hot scatters (one index per line along ``dim``, as the backward of cross-entropy's ``gather``
makes) become ``where(iota == index, value, self)`` when ``fuse`` re-traces, and fuse with their
fill and their consumers into one kernel: no fill, no scatter copy, no materialized one-hot.
Both backends generate the index ramp; the Triton kernels run in the interpreter here.

``TRITON_INTERPRET`` must be on when triton is first imported: it is set below, at collection
(see tests/test_triton_backend.py); should triton have been imported earlier, the Triton tests
skip.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import pipeline  # noqa: E402
import passes.fuse  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from pipeline.testing import assert_gradients_match  # noqa: E402

CPP = "cpu-inference"
TRITON = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}}}
TRAINING_CPP = {"extends": "training", "options": {"codegen": {"backend": "cpp"}}}
TRAINING_TRITON = {"extends": "training", "options": {"codegen": {"backend": "triton"}}}
HAS_TRITON = importlib.util.find_spec("triton") is not None
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


def needs_interpreter() -> None:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    from passes.codegen.triton import runtime as triton_runtime
    if not triton_runtime.interpreting() or triton_runtime.interpreter_problem():
        pytest.skip("the Triton interpreter is not usable in this process (triton imported before "
                    "TRITON_INTERPRET was set)")


def cross_entropy(logits, labels):
    return F.cross_entropy(logits.float(), labels)


def without_rewrite(monkeypatch) -> None:
    """The fuse pass as it was before the one-hot rewrite (scatter and full_like kept)."""
    table = {op: fn for op, fn in passes.fuse.FUSION_DECOMPOSITIONS.items()
             if op not in (torch.ops.aten.scatter.value, torch.ops.aten.scatter.src,
                           torch.ops.aten.full_like.default)}
    monkeypatch.setattr(passes.fuse, "FUSION_DECOMPOSITIONS", table)


def backward_record(plan, fn, *args):
    """The compile record of ``fn``'s backward graph after one forward and backward."""
    torch._dynamo.reset()
    compiled = pipeline.compile_with_plan(fn, plan)
    compiled(*args).backward()
    (record,) = [g for g in pipeline.compilation_of(compiled).graphs if g.role == "backward"]
    return record


def extern_names(record) -> set:
    return {name.split(".")[1] for name in record.contents["extern_calls"]}


def run(plan, fn, *args):
    """Compile and run ``fn`` (no grad), check it against eager, return the graph's record."""
    torch._dynamo.reset()
    compiled = pipeline.compile_with_plan(fn, plan)
    with torch.no_grad():
        problem = compare(fn(*args), compiled(*args))
    assert problem is None, problem
    return pipeline.compilation_of(compiled).graphs[0]


def ce_inputs(rows: int = 16, classes: int = 37):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(rows, classes, generator=generator).requires_grad_(True),
            torch.randint(0, classes, (rows,), generator=generator))


# -- cross-entropy training -------------------------------------------------------------------
@pytest.mark.parametrize("plan", [TRAINING_CPP, "training"], ids=["cpp", "training-plan"])
def test_cross_entropy_loss_and_gradients_match_eager(plan):
    logits, labels = ce_inputs()
    assert_gradients_match(plan, cross_entropy, [logits.detach(), labels])


def test_cross_entropy_backward_has_no_scatter_or_fill_and_fewer_steps(monkeypatch):
    logits, labels = ce_inputs()
    after = backward_record(TRAINING_CPP, cross_entropy, logits, labels)
    assert not extern_names(after) & {"scatter", "full", "full_like"}, after.final_code
    assert "prims.iota" in [op for k in after.contents["kernels"] for op in k["ops"]]
    without_rewrite(monkeypatch)
    before = backward_record(TRAINING_CPP, cross_entropy, logits, labels)
    assert {"scatter", "full_like"} <= extern_names(before)
    steps = lambda r: r.kernels + sum(r.contents["extern_calls"].values())  # noqa: E731
    assert after.kernels <= before.kernels - 1 and steps(after) < steps(before), (before.final_code, after.final_code)


def test_cross_entropy_backward_on_triton_matches_eager_without_scatter():
    needs_interpreter()
    logits, labels = ce_inputs(8, 50)
    assert_gradients_match(TRAINING_TRITON, cross_entropy, [logits.detach(), labels])
    record = backward_record(TRAINING_TRITON, cross_entropy, logits, labels)
    assert not extern_names(record) & {"scatter", "full", "full_like"}, record.final_code
    assert not record.contents["eager_groups"]


# -- the rewrite on random one-hot scatters ---------------------------------------------------
@st.composite
def one_hot_cases(draw):
    """(function, inputs) of a one-hot scatter: a random shape and dim, a fill (zeros, a full
    constant or an input tensor), a scalar value or a source tensor, and a dtype."""
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    dim = draw(st.integers(-rank, rank - 1))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.int64, torch.float16]))
    fill = draw(st.sampled_from(["zeros_like", "full", "input"]))
    source = draw(st.sampled_from(["value", "src"]))
    value = draw(st.sampled_from([-1.0, 2.5, 3]))
    extra = draw(st.integers(0, 2))            # a source longer than the index along dim
    generator = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    x = (torch.randn(shape, generator=generator) * 4).to(dtype)
    index_shape = list(shape)
    index_shape[dim] = 1
    index = torch.randint(0, shape[dim], index_shape, generator=generator)
    src_shape = list(index_shape)
    src_shape[dim] += extra
    src = (torch.randn(src_shape, generator=generator) * 4).to(dtype)

    def fn(x, index, src):
        base = {"zeros_like": lambda: torch.zeros_like(x), "full": lambda: torch.full(x.shape, 7, dtype=x.dtype),
                "input": lambda: x}[fill]()
        out = torch.scatter(base, dim, index, value if source == "value" else src)
        return out * 2 if fill != "input" else out

    fn.__name__ = f"scatter_{fill}_{source}_dim{dim}"
    return fn, (x, index, src)


@SETTINGS
@given(one_hot_cases())
def test_one_hot_scatter_matches_eager_torch_scatter_in_cpp_without_a_scatter(case):
    fn, args = case
    record = run(CPP, fn, *args)
    assert "scatter" not in extern_names(record), record.final_code
    assert not record.contents["eager_groups"]


@SETTINGS
@given(one_hot_cases())
def test_one_hot_scatter_matches_eager_torch_scatter_in_triton_without_a_scatter(case):
    needs_interpreter()
    fn, args = case
    record = run(TRITON, fn, *args)
    assert "scatter" not in extern_names(record), record.final_code
    assert not record.contents["eager_groups"]


def test_a_scatter_with_several_indices_per_line_stays_a_scatter():
    def fn(x, index):
        return torch.scatter(torch.zeros_like(x), 1, index, -1.0) + x

    x = torch.randn(4, 6)
    index = torch.tensor([[0, 1], [2, 2], [5, 3], [4, 4]])      # two writes per row, one duplicated
    record = run(CPP, fn, x, index)
    assert {"scatter", "scatter_"} & extern_names(record)     # in place: it writes a fresh zero buffer


def test_a_scatter_writing_only_part_of_the_other_axes_stays_a_scatter():
    def fn(x, index):
        return torch.scatter(x, 1, index, 5.0)

    record = run(CPP, fn, torch.randn(4, 6), torch.randint(0, 6, (2, 1)))   # rows 2 and 3 untouched
    assert "scatter" in extern_names(record)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_a_hand_written_arange_one_hot_is_one_kernel(backend):
    """User code's own ``arange(n)[:, None] == index`` ramp fuses too (arange, then a view)."""
    if backend == "triton":
        needs_interpreter()

    def fn(x, index):
        hot = torch.arange(x.shape[0])[:, None] == index
        return torch.where(hot, x, 0.0).sum(0)

    record = run(CPP if backend == "cpp" else TRITON, fn, torch.randn(7, 5), torch.randint(0, 7, (1, 5)))
    assert record.kernels == 1 and not record.contents["extern_calls"], record.final_code


def test_generated_triton_kernels_compile_for_sm90():
    """The ramp and fill code compiles for the H200 (no GPU needed): a cross-entropy backward, a
    looped row reduction of a one-hot mask over a row longer than one tile, and one-hot scatters
    along a leading axis in fp16 and int64 with a NaN fill."""
    needs_interpreter()
    from passes.codegen.triton.runtime import compile_all_for_sm90

    def leading(x, index):
        return torch.scatter(torch.full(x.shape, float("nan"), dtype=x.dtype), 0, index, 1.5) + x

    def integer(x, index):
        return torch.scatter(torch.zeros_like(x), 0, index, 3) * x

    def picked_rows(x, index):       # the mask times a full-size x: no closed form, a looped row sum
        return (torch.zeros_like(x).scatter(1, index, 1.0) * x).sum(1)

    logits, labels = ce_inputs(2, 9000)
    records = [backward_record(TRAINING_TRITON, cross_entropy, logits, labels),
               run(TRITON, picked_rows, torch.randn(2, 9000), torch.randint(0, 9000, (2, 1))),
               run(TRITON, leading, torch.randn(6, 5, 3).half(), torch.randint(0, 6, (1, 5, 3))),
               run(TRITON, integer, torch.randint(-9, 9, (6, 5)), torch.randint(0, 6, (1, 5)))]
    sources = [k["source"] for r in records for k in r.contents["kernels"]]
    assert any("for roff" in s and "i1.to(tl.int64)" in s for s in sources)
    results = compile_all_for_sm90(sources)
    assert len(results) == len(sources) and all(r["cubin_bytes"] > 0 for r in results)
