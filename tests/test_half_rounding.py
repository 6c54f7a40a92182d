"""C++ kernels round bf16/fp16 values where eager does (``codegen.emulate_precision_casts``), so a
fused half-precision chain gives eager's bits: checked bit for bit against eager on CPU."""
from __future__ import annotations

import re

import pytest
import torch

from pipeline import compile_report, compile_with_plan


def cube_gelu_term(x):
    return x + 0.044715 * torch.pow(x, 3.0)


def square_plus(x):
    return torch.pow(x, 2.0) + x


@pytest.mark.parametrize("fn", [cube_gelu_term, square_plus])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_powers_match_eager_bit_for_bit(fn, dtype):
    """ATen's CPU kernel computes ``x ** 3`` as ``x * x * x`` in float32, float64 and bf16 (the
    bf16 square rounded before the last product) and an fp16 one through ``std::pow`` (rounded
    once)."""
    torch._dynamo.reset()
    x = (torch.randn(64, 96) * 3).to(dtype)
    compiled = compile_with_plan(fn, "cpu-inference")
    with torch.no_grad():
        got = compiled(x)
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)


def test_a_bf16_cube_rounds_the_square_in_the_kernel_source():
    torch._dynamo.reset()
    compiled = compile_with_plan(cube_gelu_term, "cpu-inference", report=True)
    compiled(torch.randn(8, 16).to(torch.bfloat16))
    (source,) = [k["source"] for g in compile_report(compiled)["graphs"] for k in g["kernels"]]
    assert re.search(r"\(bf16_to_f\(f_to_bf16\(\(([^*]+) \* \1\)\)\) \* \1\)", source), source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_full_precision_cube_is_a_product_not_a_pow_call(dtype):
    """libmvec's vector ``powf`` takes a scalar path for negative bases, so the cube is written as
    a product, which is also what eager's kernel computes."""
    torch._dynamo.reset()
    compiled = compile_with_plan(cube_gelu_term, "cpu-inference", report=True)
    compiled(torch.randn(8, 16, dtype=dtype))
    (source,) = [k["source"] for g in compile_report(compiled)["graphs"] for k in g["kernels"]]
    assert "pp_pow" not in source and "* " in source, source
