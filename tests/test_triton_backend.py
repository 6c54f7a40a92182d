"""The Triton backend of ``codegen``, on CPU through the Triton interpreter (``TRITON_INTERPRET=1``),
plus a proof that every kernel this module generates compiles for the H200 (sm_90) without a GPU.

The interpreter must be on when triton itself is first imported (``tl.sum`` and friends are
decorated then). These tests run in the pytest process: the variable is set below, at collection,
before anything imports triton (no module of the suite imports it at import time). Should triton
have been imported earlier anyway, every test here skips and ``test_module_in_a_fresh_process``
runs this file again in a new process instead. A process that interpreted kernels cannot compile
them for a GPU, so the sm_90 compile runs in one fresh process (``compile_all_for_sm90``).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import ast  # noqa: E402
import importlib.util  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import attrs  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402
from passes.kernel_ir.groups import FusedGroup  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from pipeline.testing import assert_preserves_semantics, graphs  # noqa: E402
from conftest import record_triton_graphs, rerun_with_interpreter, triton_interpreter_ready  # noqa: E402
from sample_functions import (layer_norm, log_softmax, mask_inputs, masks, padded_rows, padded_softmax,  # noqa: E402
                              rms_norm, safe_softmax, safe_softmax_inputs, softmax)

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e '.[gpu]')")

PLAN = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton"}}}
GENERATED: dict = {}        # source path -> TritonKernel, every kernel this module generated
LAST: dict = {}             # the graph the last triton codegen produced


@pytest.fixture(autouse=True)
def _record_kernels(monkeypatch, request):
    """Fresh Dynamo state, and remember every Triton kernel the codegen pass makes."""
    torch._dynamo.reset()
    if not HAS_TRITON:
        yield
        return
    from passes.codegen.triton import runtime as triton_runtime
    if not triton_interpreter_ready(request):
        yield
        return

    def seen(graph):
        LAST["graph"] = graph
        for node in graph.graph.nodes:
            if isinstance(node.target, triton_runtime.TritonKernel):
                GENERATED.setdefault(str(node.target.path), node.target)

    record_triton_graphs(monkeypatch, seen)
    yield


def kernels_of(graph) -> tuple[list, list]:
    """(Triton kernels, groups left eager) called by a graph."""
    from passes.codegen.triton.runtime import TritonKernel
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    return ([t for t in targets if isinstance(t, TritonKernel)], [t for t in targets if isinstance(t, FusedGroup)])


def run_plan(fn, *args, plan=PLAN):
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        out = compiled(*args)
        problem = compare(fn(*args), out)
    assert problem is None, problem
    return compilation_of(compiled).graphs[0]


def chain(x, y):
    return torch.where(x > 0, torch.sigmoid(x) * torch.tanh(y), torch.sqrt(x.abs() + 1)).exp()


def argmax(x):
    return x.argmax(-1)


def amax(x):
    return x.amax(-1)


def gelu_new(x):
    """GPT-2's tanh GELU, written with Python operators as transformers writes it."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def one_minus_tanh(x):
    return (1 - torch.tanh(x * 1.5)) * x


def with_specials(rows: int, cols: int) -> torch.Tensor:
    x = torch.randn(rows, cols) * 4
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 90.0, -120.0, 0.0])
    return x


def with_nans(rows: int, cols: int) -> torch.Tensor:
    x = torch.randn(rows, cols)
    x[1, 3] = float("nan")
    x[2, 0] = float("nan")
    x[2, cols - 1] = float("nan")
    x[3] = 1.0                      # ties: argmax takes the first index
    return x


CASES = {
    "softmax": (softmax, lambda: (torch.randn(32, 100),)),
    "log_softmax": (log_softmax, lambda: (torch.randn(32, 100),)),
    "safe_softmax_with_a_row_masked_whole": (safe_softmax, safe_softmax_inputs),
    "layer_norm": (layer_norm, lambda: (torch.randn(32, 100), torch.randn(100), torch.randn(100))),
    "rms_norm": (rms_norm, lambda: (torch.randn(32, 100), torch.randn(100))),
    "pointwise_chain_broadcast_permuted": (chain, lambda: (torch.randn(64, 48).t(), torch.randn(64))),
    "argmax": (argmax, lambda: (with_nans(8, 50),)),
    "amax_with_nan": (amax, lambda: (with_nans(8, 50),)),
    "bool_and_int_bitwise": (masks, mask_inputs),
    "padded_output_of_a_row_kernel": (padded_softmax, lambda: (torch.randn(8, 13),)),
    "padded_output_rows_appended": (padded_rows, lambda: (torch.randn(6, 10), torch.randn(10))),
    "tanh_gelu_from_python_operators": (gelu_new, lambda: (with_specials(16, 64),)),
    "one_minus_tanh": (one_minus_tanh, lambda: (with_specials(16, 64),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_eager_and_is_one_triton_kernel(name):
    fn, make = CASES[name]
    record = run_plan(fn, *make())
    kernels, eager = kernels_of(LAST["graph"])
    assert record.kernels == 1 and len(kernels) == 1 and not eager
    assert kernels[0].backend == "triton" and "@triton.jit" in kernels[0].source


@pytest.mark.parametrize("fn", [gelu_new, one_minus_tanh])
def test_one_plus_or_minus_tanh_is_computed_as_a_sigmoid(fn):
    run_plan(fn, with_specials(16, 64))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert re.search(r"= \(2\.0 / \(1\.0 \+ tl\.exp\(-?2\.0 \* v\d+_mul\)\)\)", kernel.source), kernel.source


def test_in_bf16_one_plus_tanh_rounds_tanh_as_eager_does():
    """Eager rounds tanh(u) to bf16 before adding 1; the kernel rounds the same tanh (written
    1 - 2 / (1 + exp(2u))) before its add, so GPT-2's logits stay as close to eager's as before."""
    x = with_specials(16, 64).to(torch.bfloat16)
    compiled = compile_with_plan(gelu_new, PLAN)
    with torch.no_grad():
        compiled(x)
    (kernel,), _ = kernels_of(LAST["graph"])
    assert re.search(r"= \(1\.0 \+ \(1\.0 - 2\.0 / \(1\.0 \+ tl\.exp\(2\.0 \* v\d+_mul\)\)\)"
                     r"\.to\(tl\.bfloat16\)", kernel.source), kernel.source


def cube_gelu_term(x):
    return x + 0.044715 * torch.pow(x, 3.0)


def test_in_bf16_a_cube_rounds_the_square_as_eager_does():
    """ATen computes a half-precision ``x ** 3`` as ``x * x * x`` in the half type, the square
    rounded before the last product (CUDA for fp16 and bf16, CPU for bf16); the kernel does too.
    The interpreter's bf16 conversion is not round-to-nearest, so only the source is checked
    here; tests/test_gpu_runtime.py compares the bits with eager's on the GPU."""
    x = with_specials(16, 64).to(torch.bfloat16)
    compiled = compile_with_plan(cube_gelu_term, PLAN)
    with torch.no_grad():
        compiled(x)
    (kernel,), _ = kernels_of(LAST["graph"])
    assert re.search(r"\(\((\w+) \* \1\)\.to\(tl\.bfloat16\)\.to\(tl\.float32\) \* \1\)", kernel.source), \
        kernel.source


def test_fp32_rsqrt_is_the_hardware_reciprocal_square_root_as_in_aten():
    run_plan(layer_norm, torch.randn(32, 100), torch.randn(100), torch.randn(100))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "tl.math.rsqrt(" in kernel.source and "sqrt_rn" not in kernel.source, kernel.source


EXACT_STATISTICS = {"extends": "cpu-inference",
                    "options": {"codegen": {"backend": "triton", "eager_norm_max_row": 8192,
                                            "eager_norm_min_row": 0}}}


@pytest.mark.parametrize("n", [64, 100, 1000])
def test_eager_norm_statistics_reduce_per_thread_welford_states_with_atens_combine(n):
    """codegen.eager_norm_statistics: the variance is Welford's in ATen's thread layout, one state
    per thread column of a [128, XBLOCK] block, combined pairwise in the order of ATen's shuffle
    tree (written with reshapes here; a reduction over the threads on CUDA, checked bit for bit in
    test_gpu_runtime)."""
    x, w, b = torch.randn(6, n) * 3 + 1, torch.randn(n), torch.randn(n)
    compiled = compile_with_plan(layer_norm, EXACT_STATISTICS)
    with torch.no_grad():
        problem = compare(layer_norm(x, w, b), compiled(x, w, b))
    assert problem is None, problem
    (kernel,), _ = kernels_of(LAST["graph"])
    body = kernel.source.split("def triton_")[1]
    assert "tl.zeros([128, XBLOCK], tl.float32)" in body and "tl.sum(" not in body
    assert body.count("pp_welford_halve(") == 7 and "tl.reduce(" not in body
    assert kernel.generated.num_warps >= 4


def _state_layouts(ttgir: str) -> set[str]:
    """The layouts of the operands of the kernel's three-operand reductions (the Welford states),
    as Triton's TTGIR spells them."""
    lines = ttgir.splitlines()
    layouts = dict(line.split(" = ", 1) for line in lines if line.startswith(("#blocked", "#linear")))
    found = set()
    for k, line in enumerate(lines):
        if '"tt.reduce"' in line and ":3 = " in line:      # mean, m2 and count
            closing = next(other for other in lines[k:] if other.strip().startswith("}) :"))
            operands = closing.split("->")[0]
            found |= {layouts[part.split(", ")[1].split(">")[0]] for part in operands.split("tensor<")[1:]}
    return found


def _one_column_per_thread(layout: str) -> bool:
    """A [128, XBLOCK] layout whose 32 lanes and first 2 warp bits walk the 128 columns, one
    column (and any number of rows) per thread."""
    if layout.startswith("#ttg.blocked"):
        found = re.search(r"sizePerThread = \[1, 1\], threadsPerWarp = \[32, 1\], warpsPerCTA = \[(\d+), \d+\]", layout)
        return found is not None and int(found.group(1)) >= 4
    bases = dict(re.findall(r"(register|lane|warp) = (\[[^=]*?\])(?=, \w+ =|\}>)", layout))
    registers, lanes, warps = (ast.literal_eval(bases[k]) for k in ("register", "lane", "warp"))
    return (lanes == [[1, 0], [2, 0], [4, 0], [8, 0], [16, 0]] and warps[:2] == [[32, 0], [64, 0]]
            and all(r[0] == 0 for r in registers))


@pytest.mark.parametrize("n,warps", [(768, 4), (768, 8), (768, 16), (4096, 4), (4096, 8)])
def test_eager_norm_statistics_states_are_one_column_per_thread_in_the_sm90_kernel(n, warps, monkeypatch):
    """On CUDA the states are combined by a reduction over their columns, which is ATen's tree
    (lanes pairwise by offsets 16 to 1, then the 4 warps by 2 and 1) when each thread holds one
    column: so it is in the kernel Triton builds for the H200, for every warp count autotuning
    tries."""
    from passes.codegen.triton import blocks as triton_blocks, source as triton_source
    from passes.codegen.triton.autotune import candidate_blocks
    from passes.codegen.triton.runtime import compile_all_for_sm90
    from passes.codegen.triton.nest import TritonNest
    from passes.kernel_ir.loops import analyze
    compile_with_plan(layer_norm, EXACT_STATISTICS)(torch.randn(64, n), torch.randn(n), torch.randn(n))
    (kernel,), _ = kernels_of(LAST["graph"])
    nest = TritonNest.of(analyze(kernel.group))
    nest.aten_statistics = True
    assert all(b.num_warps >= 4 for b in candidate_blocks(nest))
    monkeypatch.setattr(triton_blocks, "WARP_ELEMENTS", 4 * 1024 // warps)
    emit = triton_source.emit_statistics
    monkeypatch.setattr(triton_source, "emit_statistics", lambda writer, variance, cuda: emit(writer, variance, True))
    source = triton_source.kernel_source(nest, "triton_welford_layout")
    assert source.num_warps == warps and ", 0, pp_welford_combine)" in source.source
    (result,) = compile_all_for_sm90([source], ttgir=True)
    assert "error" not in result, result
    (layout,) = _state_layouts(result["ttgir"])
    assert _one_column_per_thread(layout), layout


def test_without_eager_norm_statistics_a_variance_is_two_sums():
    plan = {"extends": "cpu-inference", "options": {"codegen": {"backend": "triton", "eager_norm_statistics": False}}}
    run_plan(layer_norm, torch.randn(6, 100), torch.randn(100), torch.randn(100), plan=plan)
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford" not in kernel.source and kernel.source.count("tl.sum(") == 2


def test_eager_norm_statistics_apply_by_default_to_rows_up_to_eager_norm_max_row():
    run_plan(layer_norm, torch.randn(6, 1024), torch.randn(1024), torch.randn(1024))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford_combine" in kernel.source
    torch._dynamo.reset()
    run_plan(layer_norm, torch.randn(6, 1028), torch.randn(1028), torch.randn(1028))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford" not in kernel.source and kernel.source.count("tl.sum(") == 2


def test_rows_shorter_than_eager_norm_min_row_take_two_sums_by_default():
    """ATen's 128 threads of 4 lanes would leave most of a 96-element row's lanes idle (a
    ConvNeXt layer norm over its channels): such rows take the plain persistent two-sum kernel."""
    run_plan(layer_norm, torch.randn(6, 96), torch.randn(96), torch.randn(96))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford" not in kernel.source and kernel.source.count("tl.sum(") == 2
    torch._dynamo.reset()
    run_plan(layer_norm, torch.randn(6, 256), torch.randn(256), torch.randn(256))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford_combine" in kernel.source


def test_rows_of_a_length_not_divisible_by_4_keep_two_sums_with_the_option():
    compile_with_plan(layer_norm, EXACT_STATISTICS)(torch.randn(6, 30), torch.randn(30), torch.randn(30))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert "pp_welford" not in kernel.source


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 5), quarter=st.integers(1, 160), scale=st.floats(1e-3, 1e3), shift=st.floats(-50, 50))
def test_property_eager_norm_statistics_are_as_accurate_as_fp32_allows(rows, quarter, scale, shift):
    """Against a float64 layer norm, the exact statistics' outputs are off by no more than eager's
    own fp32 outputs plus what 8 units in the last place of the row's mean move them (rows such
    as 50 + 0.03 * randn are ill-conditioned: any fp32 mean is that far off, eager's included,
    so equality with eager within the fp32 tolerance cannot be asked of them)."""
    torch._dynamo.reset()
    n = 4 * quarter
    x, w, b = torch.randn(rows, n) * scale + shift, torch.randn(n), torch.randn(n)
    with torch.no_grad():
        got = compile_with_plan(layer_norm, EXACT_STATISTICS)(x, w, b).double()
        eager = layer_norm(x, w, b).double()
    expected = layer_norm(x.double(), w.double(), b.double())
    x64 = x.double()
    rstd = (x64.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    mean_ulps = 8 * torch.finfo(torch.float32).eps * x64.mean(-1, keepdim=True).abs() * rstd * w.double().abs()
    bound = (eager - expected).abs().amax() + mean_ulps + 1e-5
    assert ((got - expected).abs() <= bound).all(), float(((got - expected).abs() - bound).amax())


def test_reduction_kernels_are_persistent_when_the_row_fits():
    run_plan(softmax, torch.randn(32, 100))
    (kernel,), _ = kernels_of(LAST["graph"])
    assert kernel.generated.persistent and "for roff" not in kernel.source


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm", "argmax", "amax_with_nan"])
def test_looped_reductions_match_eager(name, monkeypatch):
    """Rows longer than one tile: multi-pass kernels looping over chunks of RBLOCK."""
    from passes.codegen.triton import blocks as triton_blocks
    monkeypatch.setattr(triton_blocks, "PERSISTENT_MAX", 32)
    monkeypatch.setattr(triton_blocks, "LOOPED_RBLOCK", 32)
    fn, make = CASES[name]
    record = run_plan(fn, *make())
    (kernel,), _ = kernels_of(LAST["graph"])
    assert record.kernels == 1 and not kernel.generated.persistent
    assert "for roff in range(0, " in kernel.source


@pytest.mark.parametrize("fn", [lambda x: (x * 2).sum(0), lambda x: torch.log_softmax(x, 0),
                                lambda x: (x.exp() + 1).mean((0, 2)), lambda x: (x * 3).sum()],
                         ids=["sum_dim0", "log_softmax_dim0", "mean_two_axes", "sum_all"])
def test_reductions_over_other_axes_match_eager(fn):
    record = run_plan(fn, torch.randn(12, 9, 5))
    assert record.kernels >= 1 and not kernels_of(LAST["graph"])[1]


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "pointwise_chain_broadcast_permuted", "argmax"])
def test_every_autotune_candidate_matches_eager(name):
    """Autotuning picks among these launch shapes by speed alone, so each must be correct."""
    from passes.codegen.triton.runtime import TritonKernel, load_module, write_source
    from passes.codegen.triton.autotune import candidate_blocks
    from passes.codegen.triton.source import kernel_source
    from passes.codegen.triton.nest import TritonNest
    from passes.kernel_ir.loops import analyze
    fn, make = CASES[name]
    args = make()
    run_plan(fn, *args)
    (kernel,), _ = kernels_of(LAST["graph"])
    nest = analyze(kernel.group)
    candidates = candidate_blocks(nest)
    assert len(candidates) > 1 and candidates[0] == kernel_source_blocks(kernel)
    placeholders = [n for n in kernel.group.subgraph.graph.nodes if n.op == "placeholder"]
    expected = kernel.group(*group_inputs(kernel, args))
    for blocks in candidates:
        generated = kernel_source(nest, "triton_candidate", blocks=blocks)
        path, _ = write_source(generated.source)
        candidate = TritonKernel(kernel.group, generated, load_module(path), path,
                                 [p.meta["val"] for p in placeholders], [n.meta["val"] for n, _ in nest.outputs])
        GENERATED.setdefault(str(path), candidate)
        got = candidate(*group_inputs(kernel, args))
        for e, g in zip(expected, got):
            assert compare(e, g) is None, (blocks, compare(e, g))


def test_many_row_reductions_also_try_register_capped_launches_that_compile_for_sm90():
    """Autotuning a persistent row kernel over many rows also tries the heuristic's launch with at
    most 64 and 72 registers a thread; the cap reaches the sm_90 PTX."""
    from passes.codegen.triton.autotune import candidate_blocks
    from passes.codegen.triton.runtime import compile_all_for_sm90
    from passes.codegen.triton.source import kernel_source
    from passes.codegen.triton.nest import TritonNest
    from passes.kernel_ir.loops import analyze
    run_plan(layer_norm, torch.randn(1024, 64), torch.randn(64), torch.randn(64))
    (kernel,), _ = kernels_of(LAST["graph"])
    nest = analyze(kernel.group)
    capped = [b for b in candidate_blocks(nest) if b.maxnreg]
    assert sorted(b.maxnreg for b in capped) == [64, 72]
    assert all(attrs.evolve(b, maxnreg=None) == kernel_source_blocks(kernel) for b in capped)
    results = compile_all_for_sm90([kernel_source(nest, "triton_capped", blocks=b) for b in capped])
    assert [r.get("maxnreg") for r in results] == [64, 72], results


def kernel_source_blocks(kernel):
    from passes.codegen.triton.blocks import Blocks
    g = kernel.generated
    consts = g.constexprs
    return Blocks(g.persistent, consts.get("XBLOCK", consts.get("BLOCK")), consts.get("RBLOCK", 1), g.grid[0],
                  g.num_warps)


def group_inputs(kernel, args):
    """The group's own inputs for the function's arguments (the fused group is the whole graph
    for these cases, so its inputs are the arguments minus unused ones, in order)."""
    placeholders = [n for n in kernel.group.subgraph.graph.nodes if n.op == "placeholder"]
    shapes = [tuple(p.meta["val"].shape) for p in placeholders]
    picked, pool = [], list(args)
    for shape in shapes:
        match = next(a for a in pool if tuple(a.shape) == shape)
        pool.remove(match)
        picked.append(match)
    return picked


def softmax_matmul_softmax(x, w):
    return torch.softmax(torch.softmax(x, -1) @ w, -1)


def test_identical_groups_share_one_kernel_named_after_its_content():
    """Two groups doing the same work on same-shaped inputs (as every transformer layer does) give
    the same source: one file, one module, one Triton compile; the name says what the kernel does."""
    record = run_plan(softmax_matmul_softmax, torch.randn(16, 32), torch.randn(32, 32))
    kernels, eager = kernels_of(LAST["graph"])
    assert len(kernels) == 2 and not eager
    assert kernels[0].path == kernels[1].path and kernels[0].source == kernels[1].source
    assert re.fullmatch(r"triton_red_amax_exp_sum_[0-9a-f]{10}", kernels[0].generated.name)
    assert [k["kernel"] for k in record.contents["kernels"]] == [kernels[0].generated.name] * 2


def test_a_pointwise_kernel_writes_into_a_dying_computed_input():
    """The matmul's result dies at the kernel, which stores its output over it (loads first)."""
    record = run_plan(lambda x, w: torch.sigmoid(x @ w) * x.sum(), torch.randn(8, 16), torch.randn(16, 32))
    assert "donors=(0,))" in record.final_code


def test_reductions_over_zero_elements_match_eager():
    """An empty reduced axis: every load is masked (an unmasked one reads out of bounds)."""
    record = run_plan(lambda x: (x * 2).sum(-1) + 1, torch.randn(4, 0))
    assert record.kernels == 1
    record = run_plan(lambda x: torch.var(x, -1, unbiased=True), torch.randn(3, 0))
    assert record.kernels >= 1
    run_plan(lambda x: torch.var_mean(x, -1, correction=0), torch.randn(3, 0))   # (NaN, NaN) as eager's


def test_fp16_layer_norm_matches_eager():
    record = run_plan(layer_norm, torch.randn(8, 40, dtype=torch.float16), torch.randn(40, dtype=torch.float16),
                      torch.randn(40, dtype=torch.float16))
    assert record.kernels == 1


def test_inputs_with_unexpected_strides_run_the_group_eagerly(monkeypatch):
    run_plan(chain, torch.randn(64, 48), torch.randn(48))
    (kernel,), _ = kernels_of(LAST["graph"])
    monkeypatch.setattr(kernel, "launch", lambda *a, **k: pytest.fail("launched with unexpected strides"))
    x, y = torch.randn(48, 64).t(), torch.randn(48)
    (out,) = kernel(x, y)
    assert compare(chain(x, y), out) is None


def test_cpu_groups_stay_eager_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    record = run_plan(softmax, torch.randn(4, 8))
    notes = " ".join(n["message"] for n in record.notes if n["pass"] == "codegen")
    assert record.kernels == 0 and "only under TRITON_INTERPRET=1" in notes


def test_auto_backend_picks_cpp_on_cpu():
    record = run_plan(softmax, torch.randn(4, 8),
                      plan={"extends": "cpu-inference", "options": {"codegen": {"backend": "auto"}}})
    assert record.kernels == 1 and "cpp_fused_0" in record.final_code


def test_sources_are_files_named_by_content_hash_and_reused(tmp_path):
    import hashlib
    plan = dict(PLAN, cache={"dir": str(tmp_path)})
    run_plan(softmax, torch.randn(8, 24), plan=plan)
    (kernel,), _ = kernels_of(LAST["graph"])
    assert kernel.path.read_text() == kernel.source
    assert kernel.path.stem == "t_" + hashlib.sha256(kernel.source.encode()).hexdigest()[:32]
    torch._dynamo.reset()
    record = run_plan(softmax, torch.randn(8, 24), plan=plan)
    assert any("1 cache hit" in n["message"] for n in record.notes if n["pass"] == "codegen")


def test_core_import_path_does_not_import_triton():
    code = ("import sys, pipeline, passes, passes.codegen, passes.codegen.triton.runtime; "
            "sys.exit('triton' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


SEARCH = settings(max_examples=20, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))


@SEARCH
@given(graphs(dtypes=(torch.float32,), max_ops=8, max_dim=6))
def test_triton_codegen_preserves_semantics(case):
    from passes.codegen import Codegen, CodegenOptions
    assert_preserves_semantics(Codegen(CodegenOptions(backend="triton")), case)


def test_every_generated_kernel_compiles_for_sm90():
    """Runs last: compiles each kernel the tests above generated (or, run alone, the named cases')
    to PTX and a cubin for the H200 with Triton's own compiler, no GPU needed. This process
    interpreted them, so the compile runs in one fresh process without TRITON_INTERPRET."""
    from passes.codegen.triton.runtime import compile_all_for_sm90
    if not GENERATED:
        for fn, make in CASES.values():
            torch._dynamo.reset()
            run_plan(fn, *make())
    results = compile_all_for_sm90([GENERATED[path] for path in sorted(GENERATED)])
    assert len(results) == len(GENERATED)
    assert all(r["ptx_bytes"] > 0 and r["cubin_bytes"] > 0 for r in results)


def test_every_generated_kernel_with_exact_statistics_has_one_column_per_thread_on_sm90(monkeypatch):
    """Runs last too: the kernels above that computed ATen-order statistics (the interpreter's
    variant, a tree of reshapes) are generated again as for CUDA tensors (a reduction over the
    threads) and compiled for the H200; in each, the Welford states are one column per thread."""
    from passes.codegen.triton import source as triton_source
    from passes.codegen.triton.runtime import compile_all_for_sm90
    from passes.codegen.triton.nest import TritonNest
    from passes.kernel_ir.loops import analyze
    exact = [k for _, k in sorted(GENERATED.items()) if "pp_welford_halve(" in k.source]
    if not exact:
        pytest.skip("no kernel with exact statistics was generated in this run")
    emit = triton_source.emit_statistics
    monkeypatch.setattr(triton_source, "emit_statistics", lambda writer, variance, cuda: emit(writer, variance, True))
    sources = []
    for k in exact:
        nest = TritonNest.of(analyze(k.group))
        nest.aten_statistics = True
        sources.append(triton_source.kernel_source(nest, f"triton_cuda_{len(sources)}"))
    assert all(", 0, pp_welford_combine)" in s.source for s in sources)
    results = compile_all_for_sm90(sources, ttgir=True)
    for result in results:
        layouts = _state_layouts(result["ttgir"])
        assert layouts and all(_one_column_per_thread(layout) for layout in layouts), (result["name"], layouts)


def test_compile_for_sm90_names_the_kernel_it_cannot_compile():
    from passes.codegen.triton.runtime import TritonCompileError, compile_for_sm90
    source = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef broken_kernel(in0, BLOCK: tl.constexpr):\n"
              "    tl.store(in0 + tl.arange(0, BLOCK), tl.no_such_function(1))\n\n"
              "KERNEL = broken_kernel\nSIGNATURE = {'in0': '*fp32', 'BLOCK': 'constexpr'}\n"
              "CONSTEXPRS = {'BLOCK': 16}\nGRID = (1,)\nNUM_WARPS = 1\n")
    with pytest.raises(TritonCompileError, match="broken_kernel"):
        compile_for_sm90(source)


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET (the
    interpreter needs it at import time): run this file again in a new process."""
    rerun_with_interpreter(__file__)


def test_launchers_are_built_on_the_pool_once_per_distinct_signature(monkeypatch):
    """After the parallel compile, each distinct kernel signature's launcher (a C stub Triton
    builds with the host compiler at a first launch) is built on the pool; a failing build is
    left to that first launch."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from triton.runtime import driver

    from passes.codegen.triton.precompile import build_launchers

    built = []

    def launcher_cls(src, metadata):
        built.append((src.signature["x"], threading.current_thread().name))
        if src.signature["x"] == "*fp16":
            raise RuntimeError("the C compiler failed")

    monkeypatch.setattr(driver, "_active", SimpleNamespace(launcher_cls=launcher_cls))

    def binary(pointer: str, block: int = 64):
        return SimpleNamespace(src=SimpleNamespace(signature={"x": pointer, "n": "i32"}, constants={"BLOCK": block}),
                               metadata=object())

    binaries = [binary("*fp32"), binary("*fp32"), binary("*fp32", 128), binary("*fp16"), None, object()]
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="triton-compile") as pool:
        assert build_launchers(binaries, pool) == 3
    assert sorted(sig for sig, _ in built) == ["*fp16", "*fp32", "*fp32"]
    assert all(name.startswith("triton-compile") for _, name in built)


def test_precompile_submits_each_distinct_kernel_once_under_tritons_async_compile_mode():
    """The orchestration of codegen's parallel compile (the compile itself needs a GPU:
    tests/test_gpu_runtime.py): one warm-up per distinct (function, dtypes, launch constants),
    each while Triton's AsyncCompileMode is active, with the kernel's grid and constants."""
    from types import SimpleNamespace

    from triton.runtime import _async_compile

    from passes.codegen.triton.precompile import precompile

    calls = []

    class Function:
        def warmup(self, *dtypes, grid, **kwargs):
            calls.append((self, dtypes, grid, kwargs, _async_compile.active_mode.get() is not None))

    shared, other = Function(), Function()

    def kernel(function, block=64, sizes=()):
        return SimpleNamespace(function=function, device=torch.device("cuda", 0), empty=False,
                               kwargs={"BLOCK": block, "num_warps": 4}, grid=(8,), size_args=sizes)

    f32 = [torch.float32, torch.float32]
    count, _ = precompile([(kernel(shared), f32), (kernel(shared), f32), (kernel(shared, 128), f32),
                           (kernel(other), f32), (kernel(other), [torch.float16, torch.float16])], workers=2)
    assert count == len(calls) == 4
    assert all(active for *_, active in calls)
    assert calls[0] == (shared, tuple(f32), (8,), {"BLOCK": 64, "num_warps": 4}, True)
    # Size arguments compile once per specialization Triton makes of them (1, multiples of 16, other).
    calls.clear()
    count, _ = precompile([(kernel(shared, sizes=(5,)), f32), (kernel(shared, sizes=(7,)), f32),
                           (kernel(shared, sizes=(32,)), f32), (kernel(shared, sizes=(1,)), f32)], workers=2)
    assert count == len(calls) == 3
    assert calls[0][1] == (*f32, 5)
