"""FX graphs to plain data and back, for reproducers: every node with its operator by name, its
arguments, and the graph's tensor constants kept apart (saved with ``torch.save``).

Operators are stored by name (``aten.add.Tensor``, ``_operator:getitem``) and looked up again on
load, so a saved graph never pickles code. Fused groups are stored with their subgraph. Graphs that
call modules, generated kernels or other objects that cannot be named raise
:class:`UnsupportedGraph` (the reproducer then keeps the readable source only)."""
from __future__ import annotations

import importlib
import math
from typing import Any

import torch
import torch.fx

from . import compat
from .fused import FusedGroup

FORMAT = 1


class UnsupportedGraph(Exception):
    """The graph holds something that cannot be written as data; the message says what."""


def graph_to_data(gm: torch.fx.GraphModule) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(data, constants)``: JSON-ready description of ``gm`` and its tensor attributes."""
    constants: dict[str, torch.Tensor] = {}
    data = _graph_data(gm, constants, prefix="")
    return {"format": FORMAT, **data}, constants


def data_to_graph(data: dict, constants: dict[str, torch.Tensor]) -> torch.fx.GraphModule:
    """The graph module described by :func:`graph_to_data`'s output."""
    if data.get("format") != FORMAT:
        raise UnsupportedGraph(f"graph data format {data.get('format')!r} is not {FORMAT}")
    return _build(data, constants, prefix="")


# -- writing -------------------------------------------------------------------------------------
def _graph_data(gm: torch.fx.GraphModule, constants: dict, prefix: str) -> dict:
    nodes = []
    for node in gm.graph.nodes:
        entry: dict = {"name": node.name, "op": node.op}
        if node.op == "get_attr":
            value = _attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedGraph(f"node {node.name} reads attribute {node.target} of type "
                                       f"{type(value).__name__}, not a tensor")
            constants[prefix + node.target] = value.detach().clone()
            entry["target"] = node.target
        elif node.op == "call_function":
            entry["target"] = _target_data(node, constants, prefix)
        elif node.op in ("placeholder", "call_method", "output"):
            entry["target"] = node.target
        else:
            raise UnsupportedGraph(f"node {node.name} is a {node.op} of {node.target}")
        entry["args"] = _value_data(node.args, node)
        entry["kwargs"] = _value_data(dict(node.kwargs), node)
        nodes.append(entry)
    return {"nodes": nodes}


def _target_data(node: torch.fx.Node, constants: dict, prefix: str) -> dict:
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = compat.op_name(target)
        if compat.resolve_op(name) is not target:
            raise UnsupportedGraph(f"node {node.name}: operator {name} cannot be looked up by name")
        return {"op": name}
    if isinstance(target, FusedGroup):
        if not all(isinstance(d, int) for d in target.domain):
            raise UnsupportedGraph(f"node {node.name}: fused group {target.name} has a symbolic domain")
        sub = _graph_data(target.subgraph, constants, prefix=f"{prefix}{target.name}.")
        return {"fused_group": {"name": target.name, "domain": list(target.domain),
                                "reduced": list(target.reduced), "graph": sub}}
    for module, qualname in _names_of(target):
        if _import(module, qualname) is target:
            return {"callable": f"{module}:{qualname}"}
    raise UnsupportedGraph(f"node {node.name} calls {target!r}, which cannot be looked up by name")


# Where torch's C-level functions (torch.tanh is a builtin method of torch._C._VariableFunctions)
# are found by name.
_TORCH_NAMESPACES = ("torch", "torch.nn.functional", "torch._C._nn", "torch._C._linalg",
                     "torch._C._special", "torch._C._fft")


def _names_of(target: Any) -> list[tuple[str, str]]:
    """(module, qualified name) pairs under which ``target`` may be importable."""
    out = []
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and qualname:
        out.append((module, qualname))
    name = getattr(target, "__name__", None)
    if name:
        out.extend((namespace, name) for namespace in _TORCH_NAMESPACES)
    return out


def _value_data(value: Any, node: torch.fx.Node) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_value_data(v, node) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[str(k), _value_data(v, node)] for k, v in value.items()]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_value_data(v, node) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise UnsupportedGraph(f"node {node.name} has an argument of type {type(value).__name__}")


# -- reading -------------------------------------------------------------------------------------
def _build(data: dict, constants: dict, prefix: str) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, torch.fx.Node] = {}
    for entry in data["nodes"]:
        op = entry["op"]
        target = entry["target"]
        if op == "call_function":
            target = _load_target(target, constants, prefix)
        elif op == "get_attr":
            _set_attr(root, target, constants[prefix + target])
        args = _load_value(entry["args"], env)
        kwargs = _load_value(entry["kwargs"], env)
        node = graph.create_node(op, target, tuple(args), kwargs, name=entry["name"])
        env[entry["name"]] = node
    graph.lint()
    return torch.fx.GraphModule(root, graph)


def _load_target(data: dict, constants: dict, prefix: str) -> Any:
    if "op" in data:
        op = compat.resolve_op(data["op"])
        if op is None:
            raise UnsupportedGraph(f"operator {data['op']} does not exist in torch {compat.TORCH_VERSION}")
        return op
    if "fused_group" in data:
        group = data["fused_group"]
        sub = _build(group["graph"], constants, prefix=f"{prefix}{group['name']}.")
        return FusedGroup(group["name"], sub, tuple(group["domain"]), tuple(group["reduced"]))
    module, qualname = data["callable"].split(":", 1)
    found = _import(module, qualname)
    if found is None:
        raise UnsupportedGraph(f"cannot import {data['callable']}")
    return found


def _load_value(value: Any, env: dict) -> Any:
    if not isinstance(value, dict):
        return value
    (kind, inner), = value.items()
    if kind == "node":
        return env[inner]
    if kind == "list":
        return [_load_value(v, env) for v in inner]
    if kind == "tuple":
        return tuple(_load_value(v, env) for v in inner)
    if kind == "dict":
        return {k: _load_value(v, env) for k, v in inner}
    if kind == "float":
        return float(inner)
    if kind in ("dtype", "layout", "memory_format"):
        return getattr(torch, inner)
    if kind == "device":
        return torch.device(inner)
    if kind == "slice":
        return slice(*[_load_value(v, env) for v in inner])
    if kind == "ellipsis":
        return Ellipsis
    raise UnsupportedGraph(f"unknown value kind {kind!r}")


# -- helpers -------------------------------------------------------------------------------------
def _import(module: str, qualname: str) -> Any:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj


def _attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _set_attr(root: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, last = target.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    module.register_buffer(last, value)


__all__ = ["graph_to_data", "data_to_graph", "UnsupportedGraph"]
