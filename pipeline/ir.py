"""Helpers on FX graphs shared by passes (a pass never imports another pass's internals)."""
from __future__ import annotations

import heapq
import weakref
from typing import Any, Callable

import torch
import torch.fx

from pipeline import compat

# Calls that must stay even when nothing uses their result.
_SIDE_EFFECTS = {torch._assert, print}
for _name in ("_assert_async", "_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size",
              "_assert_tensor_metadata"):
    _op = getattr(torch.ops.aten, _name, None)
    if _op is not None:
        _SIDE_EFFECTS.update(compat.overloads_of(_op))


def has_side_effects(node: torch.fx.Node) -> bool:
    """True when removing or merging ``node`` could change behaviour beyond its own value:
    mutation of an argument, assertions, printing, calls into submodules, randomness."""
    if node.op in ("placeholder", "output"):
        return True
    if node.op == "call_module":
        return True
    if node.op == "call_function":
        target = node.target
        if target in _SIDE_EFFECTS or compat.is_mutating(target) or compat.has_effect(target):
            return True
        try:
            return bool(node.is_impure())
        except Exception:  # noqa: BLE001 - unknown impurity is treated as impure
            return True
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__")
    return False


def is_random(node: torch.fx.Node) -> bool:
    """True for a call of a random operator (its result differs run to run: never merged or folded)."""
    return node.op == "call_function" and compat.is_nondeterministic(node.target)


def finish(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Recompile a graph module after edits and drop submodules/attributes nothing uses."""
    gm.graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [k for k in list(gm._buffers) if k not in used and k.startswith("_folded")]:
        del gm._buffers[name]
    return gm


def dependencies(nodes: list) -> set:
    """``nodes`` and every node they depend on, directly or through others."""
    seen: set = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(node.all_input_nodes)
    return seen


def restore_order(graph: torch.fx.Graph) -> None:
    """Put ``graph`` in topological order again after an edit placed a node before one of its
    inputs; nodes keep their relative order wherever their inputs allow."""
    nodes = list(graph.nodes)
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    index = {n: i for i, n in enumerate(nodes)}
    ready = [i for i, n in enumerate(nodes) if not waiting[n]]
    heapq.heapify(ready)
    previous = None
    while ready:
        node = nodes[heapq.heappop(ready)]
        if previous is not None and previous.next is not node:
            previous.append(node)
        previous = node
        for user in node.users:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, index[user])


def node_args_hashable(value: Any) -> Any:
    """A hashable stand-in for node arguments (nodes by identity), or raise TypeError."""
    if isinstance(value, torch.fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(node_args_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, node_args_hashable(v)) for k, v in value.items())))
    if isinstance(value, slice):
        return ("slice", node_args_hashable(value.start), node_args_hashable(value.stop),
                node_args_hashable(value.step))
    if isinstance(value, torch.Tensor):
        raise TypeError("tensor literal")
    if isinstance(value, float) and value != value:
        return ("nan",)
    hash(value)
    return (type(value).__name__, value)



def value_bytes(value: Any) -> int:
    """Bytes a tensor value (a node's ``meta["val"]``, fake or real) holds: elements times element
    size, symbolic sizes at the value Dynamo saw; 0 for anything that is not a tensor."""
    if not isinstance(value, torch.Tensor):
        return 0
    numel = 1
    for size in value.shape:
        numel *= int(compat.size_hint(size) or 0)
    return numel * value.element_size()


def saved_for_backward(backward: torch.fx.GraphModule) -> dict:
    """What a backward graph receives from its forward: every placeholder that is not a tangent
    (AOTAutograd names those ``tangents_N``), as ``{"tensors": [{name, shape, dtype, bytes,
    input}], "total_bytes", "activation_bytes", "symints"}``. ``input`` marks inputs of the
    compiled region passed through (``primals_N``: parameters, the batch), which the caller keeps
    alive anyway; ``activation_bytes`` counts the others. Tensors sharing one storage (views of
    a saved tensor) count once, at the size of the largest of them."""
    tensors, symints = [], 0
    storages: dict = {}
    activations: dict = {}
    for node in backward.graph.nodes:
        if node.op != "placeholder" or str(node.target).startswith("tangents"):
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            symints += 1
            continue
        size = value_bytes(value)
        is_input = str(node.target).startswith("primals")
        tensors.append({"name": node.name, "shape": [compat.size_hint(d) for d in value.shape],
                        "dtype": str(value.dtype).removeprefix("torch."), "bytes": size, "input": is_input})
        try:
            storage = id(value.untyped_storage())
        except (NotImplementedError, RuntimeError):
            storage = id(value)
        storages[storage] = max(storages.get(storage, 0), size)
        if not is_input:
            activations[storage] = max(activations.get(storage, 0), size)
    return {"tensors": tensors, "total_bytes": sum(storages.values()),
            "activation_bytes": sum(activations.values()), "symints": symints}


def transposed_matrix(node: Any) -> torch.fx.Node | None:
    """``w`` when ``node`` is ``t(w)`` or ``permute(w, [1, 0])`` of a 2-D ``w`` (how ATen spells a
    linear layer's ``weight.t()``); else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    aten = torch.ops.aten
    if node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0]):
        matrix = node.args[0]
        value = matrix.meta.get("val") if isinstance(matrix, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            return matrix
    return None


def is_static_input(value: Any) -> bool:
    """A parameter or buffer (Dynamo marks buffers as static inputs): the same tensor, at the same
    address, in every call of a compiled graph."""
    return isinstance(value, torch.nn.Parameter) or getattr(value, "_dynamo_static_input_type", None) is not None


class KeptWeightValue:
    """A value derived from a parameter or buffer (a transposed copy, a packed layout), kept between
    calls while the weight is unchanged: the same tensor object at the same address, with the same
    version counter, shape and strides. Every in-place update through the tensor itself bumps the
    counter (an optimizer's step, ``copy_``, ``add_`` under no_grad) and ``weight.data = other``
    moves the address; a write through ``weight.data`` (``weight.data.copy_(...)``) changes none of
    these and cannot be seen, so passes that keep such values are opt-in. ``made`` counts
    derivations."""

    def __init__(self, derive: Callable[[torch.Tensor], Any]) -> None:
        self._derive = derive
        self._source: Any = None          # weakref to the weight the value was derived from
        self._stamp: tuple = ()
        self._value: Any = None
        self.made = 0

    def get(self, weight: torch.Tensor) -> Any:
        """The kept value for ``weight``, derived again when the weight changed."""
        stamp = (weight.data_ptr(), weight._version, weight.shape, weight.stride())
        if self._value is None or self._stamp != stamp or self._source() is not weight:
            with torch.no_grad():
                self._value = self._derive(weight)
            self._source, self._stamp = weakref.ref(weight), stamp
            self.made += 1
        return self._value
