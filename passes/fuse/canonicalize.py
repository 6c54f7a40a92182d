"""Rewrites that make reductions fusable: mean, var and var_mean become sums and pointwise ops,
so every reduction a kernel sees is a plain sum/amax/amin/argmax/argmin/prod."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def _norm_dims(x: torch.Tensor, dim) -> list[int]:
    if x.dim() == 0:
        return []           # dim 0 or -1 of a 0-d tensor: nothing to reduce
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % max(x.dim(), 1) for d in dim})


def _count(x: torch.Tensor, dims: list[int]) -> int:
    return math.prod(x.shape[d] for d in dims) if dims else 1


def _accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    dims = _norm_dims(x, dim)
    source = x if dtype is None else x.to(dtype)
    acc = source.to(_accumulation_dtype(source))
    out = acc.sum(dims, keepdim=keepdim) / _count(x, dims)
    return out.to(source.dtype)


def mean_all(x, *, dtype=None):
    return mean_dim(x, None, False, dtype=dtype)


def _variance(x, dims, correction, keepdim):
    """Two-pass variance (sum, then sum of squared deviations) in the accumulation dtype; also
    returns the mean with reduced axes kept."""
    n = _count(x, dims)
    corr = 1 if correction is None else correction
    acc = x.to(_accumulation_dtype(x))
    mean_keep = acc.sum(dims, keepdim=True) / n
    centered = acc - mean_keep
    return (centered * centered).sum(dims, keepdim=keepdim) / max(n - corr, 0), mean_keep


def var_correction(x, dim=None, *, correction=None, keepdim=False):
    var, _ = _variance(x, _norm_dims(x, dim), correction, keepdim)
    return var.to(x.dtype)


def var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    dims = _norm_dims(x, dim)
    var, mean_keep = _variance(x, dims, correction, keepdim)
    mean = mean_keep if keepdim or not dims else mean_keep.squeeze(dims)
    return var.to(x.dtype), mean.to(x.dtype)


FUSION_DECOMPOSITIONS = {
    aten.mean.dim: mean_dim,
    aten.mean.default: mean_all,
    aten.var.correction: var_correction,
    aten.var_mean.correction: var_mean_correction,
}
