"""The Triton kernels' direct launch path on a real GPU (skipped without one; run on an
H200): later calls skip Triton's launcher, and still match eager, including inputs whose
alignment differs from the first call's."""
from __future__ import annotations

import pytest
import torch

from pipeline import compile_with_plan
from pipeline.numerics import compare

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on an H200)")


@pytest.fixture
def made(monkeypatch) -> list:
    """Every TritonKernel constructed during the test."""
    from passes.codegen.triton import runtime as triton_runtime
    kernels = []
    original = triton_runtime.TritonKernel.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        kernels.append(self)

    monkeypatch.setattr(triton_runtime.TritonKernel, "__init__", remember)
    return kernels


def gelu_rows(x):
    return torch.nn.functional.gelu(x) * 2 + x.sum(-1, keepdim=True)


def test_later_calls_launch_directly_and_match_eager(made, monkeypatch):
    compiled = compile_with_plan(gelu_rows, "default")
    for _ in range(3):
        x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
        assert compare(gelu_rows(x), compiled(x)) is None
    assert made and all(k._fast is not None for k in made)
    (kernel,) = made
    monkeypatch.setattr(kernel, "launch", lambda *a, **k: pytest.fail("took Triton's launch path"))
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    assert compare(gelu_rows(x), compiled(x)) is None


def test_an_input_misaligned_since_the_first_call_takes_tritons_path(made, monkeypatch):

    def f(x):
        return (x * 3).exp()

    compiled = compile_with_plan(f, "default", options={"capture": {"dynamic": False}})
    x = torch.randn(1024, device="cuda")
    assert compare(f(x), compiled(x)) is None
    (kernel,) = made
    assert kernel._fast is not None
    shifted = torch.randn(1025, device="cuda")[1:]          # 4 bytes past a 16-byte boundary
    calls = []
    real_launch = kernel.launch
    monkeypatch.setattr(kernel, "launch", lambda *a, **k: calls.append(1) or real_launch(*a, **k))
    assert compare(f(shifted), kernel(shifted)[0]) is None
    assert calls, "a misaligned input must not reuse the binary specialized for aligned pointers"


def test_a_kernel_triton_cannot_compile_at_its_first_shape_runs_with_another():
    from test_triton_launch_shapes import five_outputs
    x = torch.randn(8, 512, 3072, device="cuda", dtype=torch.bfloat16)
    compiled = compile_with_plan(five_outputs, "default")
    with pytest.warns(UserWarning, match="could not compile kernel"):
        got = compiled(x)
    for expected, actual in zip(five_outputs(x), got):
        assert compare(expected, actual) is None
    for expected, actual in zip(five_outputs(x), compiled(x)):   # the direct launch path
        assert compare(expected, actual) is None


def test_a_graphs_kernels_compile_on_worker_threads_before_their_first_launch(made, monkeypatch):
    """codegen's compile_workers: every Triton compile of a new graph's kernels runs on the pool's
    threads during codegen; the first launch finds its binary in the JIT's cache."""
    import threading

    import triton.compiler
    threads = []
    original = triton.compiler.compile

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(triton.compiler, "compile", recording)

    def f(x, y):   # constants no other test uses: kernels of their own
        return (x * 1.8125).sin() + y.softmax(-1), (y - 0.4375).relu().sum(0)

    compiled = compile_with_plan(f, "default")
    x, y = torch.randn(64, 512, device="cuda"), torch.randn(64, 512, device="cuda")
    for expected, actual in zip(f(x, y), compiled(x, y)):
        assert compare(expected, actual) is None
    assert len(made) >= 2
    assert threads and all(name.startswith("triton-compile") for name in threads), threads


def test_padded_rows_run_over_their_padded_extent_and_match_eager(made):
    """GPT-2's logits layout (50257 of 50264, bf16): the pitched cross-entropy kernels match eager,
    write the output pad's padding, and fall back to the exact kernel on a short storage."""
    def statistics(x):
        m = x.float().amax(-1, keepdim=True)
        return m, (x.float() - m).exp().sum(-1, keepdim=True)

    def gradient(x, m, s):
        return torch.nn.functional.pad(((x.float() - m).exp() / s).to(x.dtype), (0, 7), value=1.5)

    base = torch.randn(64, 50264, device="cuda", dtype=torch.bfloat16)
    base[:, 50257:] = float("nan")
    x = base[:, :50257]
    compiled = compile_with_plan(statistics, "default")
    for _ in range(2):
        m, s = compiled(x)
        assert compare(statistics(x), (m, s)) is None
    backward = compile_with_plan(gradient, "default")
    for _ in range(2):
        out = backward(x, m, s)
        assert compare(gradient(x, m, s), out) is None
    assert torch.all(out[:, 50257:] == 1.5)
    pitched = [k for k in made if k.covers]
    assert len(pitched) == 2 and all(k._fast is not None for k in pitched)
    short = torch.randn(64 * 50264 - 7, device="cuda", dtype=torch.bfloat16).as_strided((64, 50257), (50264, 1))
    assert compare(statistics(short), compiled(short)) is None
    assert pitched[0].exact_calls == 1


def test_column_sums_run_as_split_reductions_and_match_eager():
    """A backward's bias and norm-weight gradients (bf16, 4096 x 768): two kernels, both on the
    direct launch path after the first call."""
    from passes.codegen.triton.split import SplitKernel
    made = []
    original = SplitKernel.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    def gradients(g, h, w):
        return g.sum(0), (g.float() * h.float() * w).sum(0).to(g.dtype)

    g, h = (torch.randn(4096, 768, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(768, device="cuda")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SplitKernel, "__init__", remember)
        compiled = compile_with_plan(gradients, "default")
        for _ in range(3):
            assert compare(gradients(g, h, w), compiled(g, h, w)) is None
    (kernel,) = made
    assert kernel.partial._fast is not None and kernel.combine._fast is not None


def cube_gelu_term(x):
    return x + 0.044715 * torch.pow(x, 3.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_cube_matches_eager_bit_for_bit(dtype):
    """ATen's CUDA kernel computes a half-precision x ** 3 as x * x * x in the half type (the
    square rounded); with eager rounding emulated, the fused kernel gives the same bits."""
    torch._dynamo.reset()
    compiled = compile_with_plan(cube_gelu_term, "default")
    x = torch.randn(256, 1024, device="cuda").mul(3).to(dtype)
    with torch.no_grad():
        assert torch.equal(compiled(x), cube_gelu_term(x))


def scaled_rsqrt(x):
    return torch.rsqrt(x) * 2.0


def test_an_fp32_rsqrt_matches_eager_bit_for_bit():
    """ATen's CUDA rsqrt calls rsqrtf (the hardware approximation); the kernel uses the same."""
    torch._dynamo.reset()
    compiled = compile_with_plan(scaled_rsqrt, "default")
    x = torch.rand(1 << 20, device="cuda") * 100 + 1e-3
    with torch.no_grad():
        assert torch.equal(compiled(x), scaled_rsqrt(x))


def residual_layer_norm(x, r, w, b):
    h = x + r
    return h, torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, 1e-5)


@pytest.mark.parametrize("n", [100, 768, 1000, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eager_norm_statistics_give_eager_layer_norm_bits(n, dtype):
    """codegen.eager_norm_statistics: the statistics in ATen's Welford order, the threads combined
    as ATen's shuffle tree does, so the fused residual add + layer norm gives eager's exact values."""
    torch._dynamo.reset()
    plan = {"extends": "default", "options": {"codegen": {"eager_norm_max_row": 8192, "eager_norm_min_row": 0}}}
    compiled = compile_with_plan(residual_layer_norm, plan)
    x = (torch.randn(512, n, device="cuda") * 0.05 + torch.randn(512, 1, device="cuda") * 0.01).to(dtype)
    r = (torch.randn(512, n, device="cuda") * 0.05).to(dtype)
    w, b = torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)
    with torch.no_grad():
        got, expected = compiled(x, r, w, b), residual_layer_norm(x, r, w, b)
    assert torch.equal(got[0], expected[0])
    assert torch.equal(got[1], expected[1]), f"{int((got[1] != expected[1]).sum())} values differ"


@pytest.mark.parametrize("n", [768, 4096])
@pytest.mark.parametrize("warps,tile", [(4, 1024), (4, 4096), (8, 4096), (16, 4096), (4, 8192), (8, 16384)])
def test_eager_norm_statistics_give_eager_bits_at_every_launch_shape(n, warps, tile, monkeypatch):
    """The same bits with 1 to 16 rows per program and 4, 8 or 16 warps (autotuning's shapes and
    more): the Welford states stay one column per thread."""
    from passes.codegen.triton import blocks as triton_blocks
    torch._dynamo.reset()
    monkeypatch.setattr(triton_blocks, "TILE_ELEMENTS", tile)
    monkeypatch.setattr(triton_blocks, "WARP_ELEMENTS", max(1, tile // warps))
    plan = {"extends": "default", "options": {"codegen": {"eager_norm_max_row": 8192, "eager_norm_min_row": 0}}}
    compiled = compile_with_plan(residual_layer_norm, plan)
    x = (torch.randn(1030, n, device="cuda") * 0.05 + torch.randn(1030, 1, device="cuda") * 0.01).bfloat16()
    r = (torch.randn(1030, n, device="cuda") * 0.05).bfloat16()
    w, b = torch.randn(n, device="cuda").bfloat16(), torch.randn(n, device="cuda").bfloat16()
    with torch.no_grad():
        got, expected = compiled(x, r, w, b), residual_layer_norm(x, r, w, b)
    assert torch.equal(got[1], expected[1]), f"{int((got[1] != expected[1]).sum())} values differ"


def test_the_default_plan_gives_eager_layer_norm_bits_for_gpt2_rows():
    """Rows of up to codegen.eager_norm_max_row (1024) elements get ATen's statistics by default."""
    torch._dynamo.reset()
    compiled = compile_with_plan(residual_layer_norm, "default")
    x = (torch.randn(4096, 768, device="cuda") * 0.05).bfloat16()
    r = (torch.randn(4096, 768, device="cuda") * 0.05).bfloat16()
    w, b = torch.randn(768, device="cuda").bfloat16(), torch.randn(768, device="cuda").bfloat16()
    with torch.no_grad():
        got, expected = compiled(x, r, w, b), residual_layer_norm(x, r, w, b)
    assert torch.equal(got[1], expected[1]), f"{int((got[1] != expected[1]).sum())} values differ"


def test_size_class_kernels_serve_every_batch_size_on_the_gpu(made, monkeypatch):
    """A graph with a symbolic batch: one Triton kernel per group for sizes Triton specializes
    differently (1 apart, multiples of 16, odd ones), each launched directly after its first call."""
    from pipeline import compilation_of
    from passes.codegen.triton import runtime as triton_runtime
    original_at = triton_runtime.TritonKernel.at
    monkeypatch.setattr(triton_runtime.TritonKernel, "at",
                        lambda self, binding: made.append(original_at(self, binding)) or made[-1])
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512)).cuda().eval()
    compiled = compile_with_plan(model, "default")
    with torch.no_grad():
        for n in (1, 2, 3, 16, 17, 64, 300, 3, 16):
            x = torch.randn(n, 256, device="cuda")
            assert compare(model(x), compiled(x), what=f"batch {n}") is None
    record = [r for r in compilation_of(compiled).graphs if r.metrics.get("size_specializations")][-1]
    seen = record.metrics["size_specializations"]
    assert seen["builds"] == 1 and seen["kernels"] == seen["groups"] > 0
    launched = [k for k in made if k.size_args and k._fast is not None]    # 2, 3, 16, 17, 64, 300 (1: a graph of its own)
    assert len({k.size_args for k in launched}) == 6, [k.size_args for k in made if k.size_args]


def test_per_size_cuda_graphs_of_a_dynamic_graph_replay_size_class_kernels():
    from pipeline import compilation_of
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU()).cuda().eval()
    compiled = compile_with_plan(model, "reduce-overhead", options={"capture": {"dynamic": None}})
    with torch.no_grad():
        for n in (4, 8, 24, 8, 4, 24):
            x = torch.randn(n, 128, device="cuda")
            assert compare(model(x), compiled(x), what=f"batch {n}") is None
    record = [r for r in compilation_of(compiled).graphs if r.metrics.get("size_specializations")][-1]
    assert record.metrics["size_specializations"]["builds"] == 1
    assert "cudagraph_replay_per_size" in record.final_code
