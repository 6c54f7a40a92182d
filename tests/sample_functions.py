"""Small functions several test modules compile: reductions with a prologue/epilogue (each should
become one kernel) and a data-dependent branch (one graph break)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def softmax(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def masks(a, b, n):
    """Bool and integer bitwise ops (a causal-mask-like bool expression, int bit twiddling)."""
    keep = (a[:, None] <= b[None, :]) & (a[:, None] != 3) | ~(b[None, :] == 0) ^ (a[:, None] > b[None, :])
    bits = (n & 6) ^ (~n | 1)
    return torch.where(keep, bits, n)


def mask_inputs():
    return (torch.randint(0, 6, (16,)), torch.randint(0, 6, (24,)),
            torch.randint(-50, 50, (16, 24), dtype=torch.int32))


def padded_softmax(x):
    """A row kernel's result reshaped, then padded at the end of its rows (as pad-mm pads a matmul
    operand): the kernel writes the padded buffer itself."""
    return F.pad(torch.softmax(x, -1).view(2, -1, x.shape[-1]), (0, 3), value=1.5)


def padded_rows(x, y):
    """A pointwise result with rows appended (pad-mm's padding of a transposed operand's M)."""
    return F.pad(torch.sigmoid(x) * y + 1, (0, 0, 0, 5))


def branchy(x):
    """Two graphs and one graph break: ``.item()`` decides the branch."""
    y = torch.sin(x) * 2
    if y.sum().item() > 0:
        return y.cos()
    return y.tanh()


def safe_softmax(x, mask):
    """Attention's math-path softmax: masked scores, rows that are all masked give zeros (the
    decomposition tests each row with ``all``)."""
    return torch.ops.aten._safe_softmax(x.masked_fill(mask, float("-inf")), -1)


def safe_softmax_inputs():
    mask = torch.rand(4, 1, 24, 24) > 0.6
    mask[1, 0, 5] = True            # one row masked whole
    return torch.randn(4, 3, 24, 24), mask
