"""Triton's compiler rejects some valid kernels at some launch shapes (an MLIR pass fails on a
4096-element pointwise block that stores five outputs, GPT-2's GELU backward under save-all): the
kernel then tries the nest's other candidate launch shapes instead of failing the model."""
from __future__ import annotations

import pytest
import torch

from passes.codegen.triton.runtime import TritonCompileError, compile_for_sm90
from passes.codegen.triton.autotune import candidate_blocks
from passes.codegen.triton.source import kernel_source
from passes.kernel_ir.loops import analyze
from pipeline.testing import run_passes

pytest.importorskip("triton")


def five_outputs(x):
    t = x.float()
    half = (t * 0.5).to(torch.bfloat16)
    inner = torch.tanh((t + 0.044715 * t * t * t) * 0.7978845608028654)
    return half, t, inner, inner + 1.0, half.float() * (inner + 1.0)


def gelu_backward_nest():
    x = torch.randn(8, 512, 3072, dtype=torch.bfloat16)
    graph = run_passes(["functionalize", "decompose", "fuse"], torch.fx.symbolic_trace(five_outputs), [x])
    group = next(n.target for n in graph.graph.nodes if n.op == "call_function"
                 and type(n.target).__name__ == "FusedGroup")
    return analyze(group)


def test_a_shape_triton_rejects_has_a_candidate_it_compiles_for_sm90():
    nest = gelu_backward_nest()
    heuristic = kernel_source(nest, "triton_five_outputs")
    outcomes = []
    for blocks in candidate_blocks(nest):
        try:
            compile_for_sm90(kernel_source(nest, "triton_five_outputs", blocks=blocks).source)
            outcomes.append(True)
        except TritonCompileError:
            outcomes.append(False)
    assert any(outcomes), "no candidate launch shape compiles: the fallback would have nothing to try"
    if outcomes[0]:
        pytest.skip(f"this Triton compiles the heuristic shape {heuristic.constexprs} (the bug is fixed)")
