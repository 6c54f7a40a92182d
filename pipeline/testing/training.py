"""Checking a plan's training path against eager autograd: outputs, and the gradients of every
floating-point input, on fresh inputs for each seed.

The loss is the sum of each floating-point output times a fixed random weight of its shape, so
every output element gets its own upstream gradient (a plain ``sum()`` would hide a gradient
that is wrong by a permutation or a broadcast)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from pipeline.api import compile_with_plan
from pipeline.numerics import compare, tolerance
from pipeline.testing.assertions import SemanticsError
from pipeline.testing.strategies import GraphCase


def gradient_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Detached copies of ``inputs``; floating-point tensors require grad (leaves of the check)."""
    out = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if value.is_floating_point():
                value.requires_grad_(True)
        out.append(value)
    return out


def loss_and_gradients(fn: Callable, inputs: Sequence[Any], seed: int = 0) -> tuple[Any, list]:
    """(outputs, gradients of the weighted-sum loss for each input that requires grad; None where
    the loss does not depend on it). Raises ValueError when no output depends on such an input."""
    outputs = fn(*inputs)
    leaves = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    generator = torch.Generator().manual_seed(1000 + seed)
    terms = []
    for out in leaves:
        if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
            weight = torch.randn(out.shape, generator=generator, dtype=torch.float32).to(out.dtype)
            terms.append((out * weight).float().sum())
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not terms or not wrt:
        raise ValueError("no output depends on an input that requires grad")
    loss = torch.stack(terms).sum()
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return outputs, [g.detach() if g is not None else None for g in grads]


def assert_gradients_match(plan: Any, case: GraphCase | Callable, inputs: Sequence[Any] | None = None, *,
                           seeds: Sequence[int] = (0, 1), grad_scale: float = 4.0,
                           noise_factor: float = 4.0) -> None:
    """Assert that ``case`` compiled with ``plan`` (training: AOTAutograd, the plan's split and
    its passes on both halves) gives eager's outputs and input gradients, for fresh inputs per
    seed (a :class:`GraphCase`) or the given ``inputs``.

    Each gradient element may differ from eager's by the dtype's tolerance times ``grad_scale``
    (a backward chains more rounding steps than a forward) plus ``noise_factor`` times eager's
    own rounding error there, measured against the same computation in float64 when the case
    runs in float64: a gradient that is mathematically near zero (a layer norm over two
    elements) is rounding noise in any evaluation order, and must not fail the check."""
    fn = case.gm if isinstance(case, GraphCase) else case
    compiled = compile_with_plan(fn, plan)
    input_sets = ([case.make_inputs(seed) for seed in seeds] if inputs is None
                  else [list(inputs)])
    for seed, args in enumerate(input_sets):
        expected_out, expected_grads = loss_and_gradients(fn, gradient_inputs(args), seed)
        exact = _float64_gradients(fn, args, seed)
        actual_out, actual_grads = loss_and_gradients(compiled, gradient_inputs(args), seed)
        problem = compare(_detached(expected_out), _detached(actual_out), what="output")
        for index, (e, a) in enumerate(zip(expected_grads, actual_grads)):
            if problem:
                break
            if e is None or a is None:
                if (e is None) != (a is None) and not _all_zero(e if a is None else a):
                    problem = f"gradient {index}: eager gives {e is not None and 'a tensor' or None}, " \
                              f"compiled gives {a is not None and 'a tensor' or None}"
                continue
            problem = _compare_gradient(e, a, exact[index] if exact else None, index, grad_scale, noise_factor)
        if problem:
            raise SemanticsError(f"plan {plan!r} training path differs from eager: {problem}\n{case!r}")


def _float64_gradients(fn: Callable, args: Sequence[Any], seed: int) -> list | None:
    """Eager gradients of the same loss with floating-point inputs in float64, or None when the
    case does not run in float64 (dtype-specific constants or ops)."""
    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    try:
        return loss_and_gradients(fn, gradient_inputs(wide), seed)[1]
    except (RuntimeError, ValueError, TypeError):
        return None


def _compare_gradient(e: torch.Tensor, a: torch.Tensor, exact: torch.Tensor | None, index: int,
                      grad_scale: float, noise_factor: float) -> str | None:
    rtol, atol = tolerance(e.dtype)
    if exact is None or exact.shape != e.shape:
        return compare(e, a, what=f"gradient {index}", rtol=rtol * grad_scale, atol=atol * grad_scale)
    if a.shape != e.shape or a.dtype != e.dtype:
        return compare(e, a, what=f"gradient {index}")
    e64, a64 = e.double(), a.double()
    allowed = atol * grad_scale + rtol * grad_scale * e64.abs() + noise_factor * (e64 - exact).abs()
    both_nan = e64.isnan() & a64.isnan()
    bad = ~both_nan & ~((a64 - e64).abs() <= allowed)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        return (f"gradient {index}: {int(bad.sum())} of {e.numel()} elements differ beyond tolerance plus "
                f"{noise_factor}x eager's own rounding error; first at {where}: eager {e[where].item():.6g}, "
                f"compiled {a[where].item():.6g}, float64 {exact[where].item():.6g}")
    return None


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


def _all_zero(value: torch.Tensor) -> bool:
    return bool((value == 0).all())
