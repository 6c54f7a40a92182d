"""Inputs eager PyTorch rejects but Dynamo's fake tensors let through.

Fake (meta) kernels check shapes, but not every dtype rule of the real kernels: ``mm``, ``addmm``
and friends accept a float64 input against float32 weights on fake tensors, so Dynamo captures a
graph that can only fail when it runs, after a compile and with a recompile-limit slot used.
:func:`eager_rejection` finds such a node in a captured graph by a table of operators whose real
kernels need operands of one dtype, and confirms it by running that one operator eagerly on
empty tensors of the same metadata: the exception it raises is eager's own, and capture raises it
instead of compiling the graph (Dynamo keeps no variant of a graph whose compile raised)."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

F = torch.nn.functional

#: Operators (as Dynamo records them) and the positions of the arguments whose dtypes eager's
#: kernels require to be equal.
SAME_DTYPE: dict[Any, tuple[int, ...]] = {
    torch._C._nn.linear: (0, 1, 2), F.linear: (0, 1, 2), F.bilinear: (0, 1, 2, 3),
    torch.matmul: (0, 1), operator.matmul: (0, 1), torch.mm: (0, 1), torch.bmm: (0, 1),
    torch.mv: (0, 1), torch.dot: (0, 1), torch.addmm: (0, 1, 2), torch.baddbmm: (0, 1, 2),
    torch.addbmm: (0, 1, 2), torch.addmv: (0, 1, 2),
    torch.conv1d: (0, 1, 2), torch.conv2d: (0, 1, 2), torch.conv3d: (0, 1, 2),
    F.conv1d: (0, 1, 2), F.conv2d: (0, 1, 2), F.conv3d: (0, 1, 2),
    F.conv_transpose1d: (0, 1, 2), F.conv_transpose2d: (0, 1, 2), F.conv_transpose3d: (0, 1, 2),
    F.scaled_dot_product_attention: (0, 1, 2),
}
#: Tensor methods with the same rule, by name (``x.matmul(w)`` is a ``call_method`` node).
SAME_DTYPE_METHODS: dict[str, tuple[int, ...]] = {
    "matmul": (0, 1), "mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1), "__matmul__": (0, 1),
    "addmm": (0, 1, 2), "baddbmm": (0, 1, 2),
}


def _value(arg: Any) -> Any:
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else arg


def _dtypes(node: torch.fx.Node, positions: tuple[int, ...]) -> set:
    found = set()
    for position in positions:
        if position < len(node.args):
            value = _value(node.args[position])
            if isinstance(value, torch.Tensor):
                found.add(value.dtype)
    return found


def _empty_like(value: Any) -> Any:
    """A real tensor with the metadata of a fake one (sizes at their hints); other values as they are."""
    if isinstance(value, (list, tuple)):
        return type(value)(_empty_like(v) for v in value)
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return int(hint) if hint is not None else value
    if not isinstance(value, torch.Tensor):
        return value
    sizes = [_empty_like(s) for s in value.shape]
    strides = [_empty_like(s) for s in value.stride()]
    return torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device).zero_()


def _run_eagerly(node: torch.fx.Node) -> BaseException | None:
    """Run the node's operator on real tensors shaped like its fake arguments: eager's exception,
    or None when eager accepts them."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
        args = [_empty_like(_value(a)) for a in node.args]
        kwargs = {k: _empty_like(_value(v)) for k, v in node.kwargs.items()}
        try:
            if node.op == "call_method":
                getattr(args[0], node.target)(*args[1:], **kwargs)
            else:
                node.target(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - eager's own rejection is the answer
            return exc
    return None


def eager_rejection(gm: torch.fx.GraphModule) -> BaseException | None:
    """The exception eager PyTorch raises for this graph's inputs at a node the fake kernels let
    through (operands of mixed dtypes), or None."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            positions = SAME_DTYPE.get(node.target) if _hashable(node.target) else None
        elif node.op == "call_method":
            positions = SAME_DTYPE_METHODS.get(node.target)
        else:
            continue
        if positions is None or len(_dtypes(node, positions)) < 2:
            continue
        rejected = _run_eagerly(node)
        if rejected is not None:
            return rejected
    return None


def _hashable(target: Any) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


class EagerRejected(Exception):
    """Raised from capture's Dynamo backend when eager would reject the call: carries eager's
    exception, which capture raises to the caller instead of Dynamo's wrapper."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error
