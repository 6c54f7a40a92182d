"""FX graphs to plain data and back, for reproducers: every node with its operator by name, its
arguments, and the graph's tensor constants kept apart (saved with ``torch.save``).

Operators are stored by name (``aten.add.Tensor``, ``_operator:getitem``) and looked up again on
load, so a saved graph never pickles code.

Other objects a graph calls (fused groups, generated kernels) are written only when their class
opts in to the :class:`Describable` protocol, ``to_data(codec)`` / ``from_data(data, codec)``;
objects whose data needs no codec services (no files, no shared texts: a fused group with its
subgraph) say so with ``portable = True`` and are written by every caller. The data names the
class by module and qualified name, and loading imports that class from the installed packages
(never code from the saved file) and lets it rebuild itself. The graph module's own class (a
``GraphModule`` subclass such as the generated host module) is kept the same way. Graphs that
call modules or other objects that cannot be described raise :class:`UnsupportedGraph` (the
reproducer then keeps the readable source only; the compile cache does not store the graph)."""
from __future__ import annotations

import hashlib
import importlib
import math
from typing import Any, Protocol, runtime_checkable

import torch
import torch.fx

from pipeline import compat

FORMAT = 2


class UnsupportedGraph(Exception):
    """The graph holds something that cannot be written as data; the message says what."""


class Codec:
    """What a :class:`Describable` object gets to write and read itself: subgraphs (with their
    tensor constants kept apart), shared texts (one copy of a source many kernels refer to) and the cache folder it
    was configured with (``cache_dir``, None for the default)."""

    def __init__(self, constants: dict[str, torch.Tensor], texts: dict[str, str] | None = None,
                 cache_dir: str | None = None, portable_only: bool = False, context: Any = None):
        self.constants = constants
        # The PassContext of the compile the graph is rebuilt in (None outside one): objects that
        # note decisions at run time (a CUDA-graph runner) attach to it.
        self.context = context
        self.portable_only = portable_only   # describe only objects that say ``portable = True``
        self.texts: dict[str, str] = texts if texts is not None else {}
        self.cache_dir = cache_dir
        self.files: list[str] = []
        # Objects that several described objects of one graph share (the kernels of one graph
        # sharing what made them): each from_data finds or adds them here, by a key its data names.
        self.shared: dict = {}
        self._groups = 0

    def need_file(self, path: str | Any) -> None:
        """Declare a file (a compiled library, a kernel module) the object needs on disk when it
        is rebuilt: the compile cache checks its hash before rebuilding, and portable artifacts
        carry it."""
        if str(path) not in self.files:
            self.files.append(str(path))

    def subgraph_to_data(self, gm: torch.fx.GraphModule, name: str) -> dict:
        """Plain data of a graph module an object holds (its tensor constants kept apart, its
        module class kept as :func:`graph_to_data` keeps it)."""
        self._groups += 1
        prefix = f"object{self._groups}.{name}."
        graph = _graph_data(gm, self.constants, prefix, self)
        if not self.portable_only:
            graph.update(_module_class(gm))
        return {"prefix": prefix, "graph": graph}

    def subgraph_from_data(self, data: dict) -> torch.fx.GraphModule:
        """The graph module :meth:`subgraph_to_data` described."""
        return _with_class(_build(data["graph"], self.constants, prefix=data["prefix"], codec=self), data["graph"])

    def describe(self, obj: Any) -> dict:
        """An object held by a described object (a kernel a kernel keeps) as data naming its
        class, rebuilt by :meth:`rebuild`; raises :class:`UnsupportedGraph` as ``to_data`` does."""
        kind = type(obj)
        if not (isinstance(obj, Describable) and _importable(kind)):
            raise UnsupportedGraph(f"{obj!r} cannot be described")
        return {"class": f"{kind.__module__}:{kind.__qualname__}", "data": obj.to_data(self)}

    def rebuild(self, data: dict) -> Any:
        """The object :meth:`describe` described (its class imported from the installed packages)."""
        cls = self.import_class(data["class"])
        if not (hasattr(cls, "from_data") and hasattr(cls, "to_data")):
            raise UnsupportedGraph(f"{data['class']} is not an installed class with from_data/to_data")
        return cls.from_data(data["data"], self)

    @staticmethod
    def class_name(cls: type) -> str:
        """``module:qualname`` of a class, as :meth:`import_class` reads it."""
        return f"{cls.__module__}:{cls.__qualname__}"

    @staticmethod
    def import_class(name: str) -> type:
        """The class named ``module:qualname`` (by :meth:`class_name`), imported from the installed
        packages (never from the data)."""
        cls = _import(*name.split(":", 1))
        if not isinstance(cls, type):
            raise UnsupportedGraph(f"{name} is not an installed class")
        return cls

    def put_text(self, text: str) -> str:
        """Store ``text`` once; returns the id :meth:`text` reads it back with."""
        key = hashlib.sha256(text.encode()).hexdigest()[:32]
        self.texts[key] = text
        return key

    def text(self, key: str) -> str:
        """A text stored with :meth:`put_text`."""
        if key not in self.texts:
            raise UnsupportedGraph(f"text {key} is missing from the graph data")
        return self.texts[key]


@runtime_checkable
class Describable(Protocol):
    """An object a graph calls that can be written as plain data and rebuilt from it (generated
    kernels opt in with these two methods). ``to_data`` returns JSON-ready data or raises
    :class:`UnsupportedGraph` saying why it cannot; ``from_data`` rebuilds an equivalent object
    (reloading a compiled kernel from the kernel cache, compiling it again only if it is gone)."""

    def to_data(self, codec: Codec) -> dict:
        """JSON-ready data describing this object (groups and shared texts through ``codec``)."""
        ...

    @classmethod
    def from_data(cls, data: dict, codec: Codec) -> Any:
        """An object equivalent to the one :meth:`to_data` described."""
        ...


def graph_to_data(gm: torch.fx.GraphModule, codec: Codec | None = None,
                  traces: bool = True) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(data, constants)``: JSON-ready description of ``gm`` and its tensor attributes. With a
    ``codec``, :class:`Describable` objects are described too and the constants land in
    ``codec.constants``. ``traces=False`` leaves the nodes' stack traces out (what a cache key
    records: the same graph captured from another line is the same graph)."""
    constants: dict[str, torch.Tensor] = codec.constants if codec is not None else {}
    writer = codec if codec is not None else Codec(constants, portable_only=True)
    data = _graph_data(gm, constants, prefix="", codec=writer, traces=traces)
    if codec is not None:
        data.update(_module_class(gm))
    return {"format": FORMAT, **data}, constants


def data_to_graph(data: dict, constants: dict[str, torch.Tensor], codec: Codec | None = None) -> torch.fx.GraphModule:
    """The graph module described by :func:`graph_to_data`'s output."""
    if data.get("format") != FORMAT:
        raise UnsupportedGraph(f"graph data format {data.get('format')!r} is not {FORMAT}")
    gm = _build(data, constants, prefix="", codec=codec if codec is not None else Codec(constants, portable_only=True))
    return _with_class(gm, data)


def _module_class(gm: torch.fx.GraphModule) -> dict:
    """``{"module_class": ...}`` when ``gm``'s class (a generated host module) is not a plain
    GraphModule. GraphModule.__new__ makes a class per instance: the nearest class importable by
    name is kept."""
    kind = next((c for c in type(gm).__mro__ if issubclass(c, torch.fx.GraphModule) and _importable(c)),
                torch.fx.GraphModule)
    return {} if kind is torch.fx.GraphModule else {"module_class": f"{kind.__module__}:{kind.__qualname__}"}


def _with_class(gm: torch.fx.GraphModule, data: dict) -> torch.fx.GraphModule:
    if "module_class" not in data:
        return gm
    cls = _import(*data["module_class"].split(":", 1))
    if not (isinstance(cls, type) and issubclass(cls, torch.fx.GraphModule)):
        raise UnsupportedGraph(f"{data['module_class']} is not a GraphModule class")
    return cls(gm, gm.graph)


def _importable(cls: type) -> bool:
    return _import(cls.__module__, cls.__qualname__) is cls


# -- writing -------------------------------------------------------------------------------------
def _graph_data(gm: torch.fx.GraphModule, constants: dict, prefix: str, codec: Codec | None = None,
                traces: bool = True) -> dict:
    nodes = []
    seen: dict[str, int] = {}     # each distinct stack trace once (reports and profiles name the user's line)
    for node in gm.graph.nodes:
        entry: dict = {"name": node.name, "op": node.op}
        trace = node.meta.get("stack_trace")
        if traces and isinstance(trace, str):
            entry["trace"] = seen.setdefault(trace, len(seen))
        if node.op == "get_attr":
            value = _attr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedGraph(f"node {node.name} reads attribute {node.target} of type "
                                       f"{type(value).__name__}, not a tensor")
            constants[prefix + node.target] = value.detach().clone()
            entry["target"] = node.target
        elif node.op == "call_function":
            entry["target"] = _target_data(node, constants, prefix, codec)
        elif node.op in ("placeholder", "call_method", "output"):
            entry["target"] = node.target
        else:
            raise UnsupportedGraph(f"node {node.name} is a {node.op} of {node.target}")
        entry["args"] = _value_data(node.args, node)
        entry["kwargs"] = _value_data(dict(node.kwargs), node)
        nodes.append(entry)
    return {"nodes": nodes, "traces": list(seen)} if seen else {"nodes": nodes}


def _target_data(node: torch.fx.Node, constants: dict, prefix: str, codec: Codec | None = None) -> dict:
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = compat.op_name(target)
        if compat.resolve_op(name) is not target:
            raise UnsupportedGraph(f"node {node.name}: operator {name} cannot be looked up by name")
        return {"op": name}
    if codec is not None and isinstance(target, Describable) and _importable(type(target)) and (
            not codec.portable_only or getattr(target, "portable", False)):
        kind = type(target)
        try:
            described = target.to_data(codec)
        except UnsupportedGraph as exc:
            raise UnsupportedGraph(f"node {node.name}: {exc}") from None
        return {"object": {"class": f"{kind.__module__}:{kind.__qualname__}", "data": described}}
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
def _build(data: dict, constants: dict, prefix: str, codec: Codec | None = None) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[str, torch.fx.Node] = {}
    traces = data.get("traces", [])
    for entry in data["nodes"]:
        op = entry["op"]
        target = entry["target"]
        if op == "call_function":
            target = _load_target(target, constants, prefix, codec)
        elif op == "get_attr":
            _set_attr(root, target, constants[prefix + target])
        args = _load_value(entry["args"], env)
        kwargs = _load_value(entry["kwargs"], env)
        node = graph.create_node(op, target, tuple(args), kwargs, name=entry["name"])
        if "trace" in entry:
            node.meta["stack_trace"] = traces[entry["trace"]]
        env[entry["name"]] = node
    graph.lint()
    return torch.fx.GraphModule(root, graph)


def _load_target(data: dict, constants: dict, prefix: str, codec: Codec | None = None) -> Any:
    if "op" in data:
        op = compat.resolve_op(data["op"])
        if op is None:
            raise UnsupportedGraph(f"operator {data['op']} does not exist in torch {compat.TORCH_VERSION}")
        return op
    if "object" in data:
        if codec is None:
            raise UnsupportedGraph("the graph calls described objects; reading them needs a Codec")
        described = data["object"]
        cls = _import(*described["class"].split(":", 1))
        if not (isinstance(cls, type) and hasattr(cls, "from_data") and hasattr(cls, "to_data")):
            raise UnsupportedGraph(f"{described['class']} is not an installed class with from_data/to_data")
        return cls.from_data(described["data"], codec)
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


__all__ = ["graph_to_data", "data_to_graph", "UnsupportedGraph", "Codec", "Describable"]
