"""Dtype-aware comparison of a compiled result against eager PyTorch."""
from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

# (rtol, atol) per dtype. Fusion and decomposition reorder floating-point work, so the bounds
# allow a few ulps of the dtype plus accumulated rounding; integers and booleans must be exact.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1.3e-5, 1e-5),
    torch.complex32: (1e-3, 1e-3),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) used for ``dtype`` (a complex dtype as its real parts); exact for integers and bool."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def compare(expected: Any, actual: Any, *, what: str = "output", rtol: float | None = None,
            atol: float | None = None) -> str | None:
    """None when ``actual`` matches ``expected`` (same structure, shapes, dtypes, values within
    the dtype's tolerance, NaNs in the same places), else a message saying where it differs."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"{what}: structure differs: expected {exp_spec}, got {act_spec}"
    for index, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        where = f"{what}[{index}]" if len(exp_leaves) > 1 else what
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            problem = _compare_tensor(e, a, rtol, atol)
            if problem:
                return f"{where}: {problem}"
        elif e != a and not (isinstance(e, float) and isinstance(a, float) and e != e and a != a):
            return f"{where}: expected {e!r}, got {a!r}"
    return None


def _compare_tensor(e: Any, a: Any, rtol: float | None, atol: float | None) -> str | None:
    if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
        return f"expected {type(e).__name__}, got {type(a).__name__}"
    if e.shape != a.shape:
        return f"shape differs: expected {tuple(e.shape)}, got {tuple(a.shape)}"
    if e.dtype != a.dtype:
        return f"dtype differs: expected {e.dtype}, got {a.dtype}"
    if e.device != a.device:
        return f"device differs: expected {e.device}, got {a.device}"
    d_rtol, d_atol = tolerance(e.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    try:
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
    except AssertionError as exc:
        return " ".join(str(exc).split())
    return None
