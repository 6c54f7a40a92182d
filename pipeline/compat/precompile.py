"""Dynamo's capture stored on disk: the transformed bytecode and the guards of one full-graph
capture, through torch's ahead-of-time compile (``torch.compile(...).aot_compile``), so that a
later process checks the guards and runs the code without tracing the model again.

What is stored is what torch's ``aot_compile`` serializes, with three differences that let it
work on models whose ``forward`` is wrapped by a decorator (transformers' models are):

- the traced function's closure (the wrapped ``forward``) is not pickled: the loading process
  passes its own function's closure, and the stored entry is used only when every function the
  capture inlined still has the source it had (checksums of their lines);
- globals the transformed code reads that torch leaves out of its record (modules Dynamo
  installed by id) are stored by name with the code;
- the guards are rebuilt from the values torch stored, except those it could not store (a
  decorated function in the closure, marked missing), which come from this process.

Guards torch cannot serialize (object identities, globals) are left out, as ``aot_compile``
does by default: a stored capture is checked on the call's arguments and the module's state
(tensor metadata, attribute values), not on module-level globals the model reads."""
from __future__ import annotations

import builtins
import dataclasses
import hashlib
import importlib
import inspect
import io
import linecache
import pickle
import types
from typing import Any, Callable

import torch

from pipeline.compat.dynamo import unwrapped_function

_UNSERIALIZABLE = ("DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH",
                   "CLOSURE_MATCH", "WEAKREF_ALIVE")


def available() -> bool:
    """Whether this torch can store a capture (its ahead-of-time compile exists)."""
    try:
        from torch._dynamo import aot_compile  # noqa: F401
        from torch._dynamo.aot_compile_types import SerializableCallable  # noqa: F401
    except ImportError:     # a torch without ahead-of-time compile
        return False
    return hasattr(torch._dynamo.config, "enable_aot_compile")


def with_own_globals(fn: Callable) -> Callable:
    """``fn`` as a function whose globals are a fresh namespace holding the builtins: torch 2.11's
    ahead-of-time compile looks the names the transformed code loads (``type``, ``len``...) up in
    the traced function's globals only, and Dynamo installs the globals it adds there rather than
    in the defining module."""
    namespace = {**vars(builtins), "__builtins__": builtins, "__name__": fn.__module__}
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__module__ = fn.__qualname__, fn.__module__
    return copy


def untraceable(fn: Callable) -> str | None:
    """Why ``fn`` cannot have its capture stored, or None."""
    if not available():
        return f"torch {torch.__version__} has no ahead-of-time compile to store captures with"
    if not isinstance(getattr(fn, "__code__", None), types.CodeType):
        return f"{type(fn).__name__} is not a Python function"
    return None


def _serializable_guards(entries: Any) -> list[bool]:
    return [not (e.is_global or e.guard_type in _UNSERIALIZABLE
                 or any(t in _UNSERIALIZABLE for t in (e.derived_guard_types or ())))
            for e in entries]


_STORED_GRAPH: type | None = None


def _stored_graph_class() -> type:
    """``StoredGraph``, made on first use: its base class comes with Dynamo (and Triton), which
    importing this module does not import."""
    global _STORED_GRAPH
    if _STORED_GRAPH is not None:
        return _STORED_GRAPH
    from torch._dynamo.aot_compile_types import SerializableCallable

    class StoredGraph(SerializableCallable):
        """The compiled graph as Dynamo's code calls it, and the bytes that find it again (None:
        it has no stored form, and the capture is not stored)."""

        def __init__(self, fn: Callable, token: bytes | None):
            self.fn = fn
            self.token = token

        @classmethod
        def serialize_compile_artifacts(cls, fn: Any) -> bytes:
            """The token (raises when there is none: the capture is then not stored)."""
            if fn.token is None:
                raise ValueError("the compiled graph has no stored form")
            return fn.token

        @classmethod
        def deserialize_compile_artifacts(cls, data: bytes) -> Any:
            """The token as stored (:func:`load` turns it into the graph)."""
            return data

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.fn(*args, **kwargs)

    StoredGraph.__module__, StoredGraph.__qualname__ = __name__, "StoredGraph"
    _STORED_GRAPH = StoredGraph
    return StoredGraph


def __getattr__(name: str) -> Any:
    """``StoredGraph`` by name (a stored capture's pickle refers to it)."""
    if name == "StoredGraph":
        return _stored_graph_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _closure_data(fn: Any) -> dict[str, Any]:
    return {f"closure_{i}": cell.cell_contents for i, cell in enumerate(fn.__closure__ or ())}


class StoredCapture:
    """One full-graph capture that can be stored: ``check(args, kwargs)`` evaluates its guards,
    ``run(args, kwargs)`` runs its transformed code with the compiled graph inside, ``to_bytes()``
    gives its stored form. ``token`` is what finds the compiled graph again; a loaded capture
    runs only once :meth:`bind` gave it the graph (``graph`` is None until then)."""

    def __init__(self, compiled: Any, fn: Callable, token: bytes | None, graph: Callable | None):
        self._compiled = compiled
        self._fn = fn
        self.token = token
        code = fn.__code__
        closure = {name: cell.cell_contents for name, cell in zip(code.co_freevars, fn.__closure__ or ())}
        args_name, kwargs_name = code.co_varnames[:2]     # fn is ``f(*args, **kwargs)`` (capture checks)
        check = compiled._artifacts.guard_manager.check

        def frame_locals(args: tuple, kwargs: dict) -> dict:
            return {args_name: args, kwargs_name: kwargs, **closure}

        self._locals = frame_locals
        self.check = lambda args, kwargs: check(frame_locals(args, kwargs))
        self.graph: Callable | None = None
        if graph is not None:
            self.bind(graph)

    def bind(self, graph: Callable) -> None:
        """Run the transformed code with ``graph`` as its compiled graph, called directly (no
        wrapper of Dynamo's or of the stored form in between)."""
        runtime = self._compiled.fn
        namespace = {**runtime.__globals__, self._compiled._artifacts.backend_id: graph}
        run = unwrapped_function(runtime.__code__, namespace, runtime.__name__, runtime.__closure__)
        self.run = lambda args, kwargs: run(*args, **kwargs)
        self.graph = graph

    def why(self, args: tuple, kwargs: dict) -> str:
        """The first guard that fails for this call."""
        info = self._compiled._artifacts.guard_manager.check_verbose(self._locals(args, kwargs))
        parts = getattr(info, "verbose_code_parts", None) or [str(info)]
        return str(parts[0]).split("#")[0].strip()

    def to_bytes(self) -> bytes:
        """The stored form (raises when part of the capture cannot be stored)."""
        artifacts = self._compiled._artifacts
        env = artifacts.runtime_env
        found = self._fn.__globals__
        extra = {name: found[name] for name in env.external_refs
                 if name not in env.used_globals and name in found and name not in env.import_sources
                 and name != artifacts.backend_id}
        if extra:
            artifacts.runtime_env = dataclasses.replace(env, used_globals={**env.used_globals, **extra})
        info = artifacts.source_info
        try:
            artifacts.source_info = _without_module_texts(info)
            data = type(self._compiled).serialize(self._compiled, _closure_data(self._fn)).serialized_data
        finally:
            artifacts.runtime_env, artifacts.source_info = env, info
        return pickle.dumps({"capture": data, "sources": _source_checksums(info), "torch": torch.__version__})


def _source_lines(module_name: str, first: int, last: int) -> str:
    module = importlib.import_module(module_name)
    path = inspect.getsourcefile(module)
    if path is None:
        raise OSError(f"no source file for {module_name}")
    linecache.checkcache(path)
    return "".join(linecache.getlines(path)[first - 1:last - 1])


def _source_checksums(info: Any) -> list[tuple[str, int, int, str]]:
    """(module, first line, last line, SHA-256 of those lines) of every function the capture inlined."""
    return sorted((s.module, s.firstlineno, s.lastlineno,
                   hashlib.sha256(_source_lines(s.module, s.firstlineno, s.lastlineno).encode()).hexdigest())
                  for s in info.inlined_sources)


def _sources_unchanged(checksums: list) -> str | None:
    """None when every inlined function still has the lines it had, else which one changed."""
    for module, first, last, expected in checksums:
        try:
            text = _source_lines(module, first, last)
        except Exception as exc:  # noqa: BLE001 - a module that no longer imports: changed
            return f"{module} cannot be read ({type(exc).__name__})"
        if hashlib.sha256(text.encode()).hexdigest() != expected:
            return f"{module} lines {first}-{last - 1} changed"
    return None


def _without_module_texts(info: Any) -> Any:
    """The source record without each module's whole text (torch keeps it; checksums suffice)."""
    return dataclasses.replace(info, inlined_sources={dataclasses.replace(s, content="")
                                                      for s in info.inlined_sources})


def capture(fn: Callable, args: tuple, kwargs: dict, backend: Callable, *,
            dynamic: bool | None) -> StoredCapture:
    """Trace the Python function ``fn`` once as a full graph with ``backend``, which returns
    ``(compiled graph, token)``: the token is the bytes a later process finds the compiled graph
    by (None: the capture cannot be stored). ``fn``'s closure is
    not stored: a loading process gives its own (``fn`` is best a small closure over the model)."""

    def stored_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        graph, token = backend(gm, example_inputs)
        return _stored_graph_class()(graph, token)

    code = fn.__code__
    if not (code.co_argcount == 0 and code.co_kwonlyargcount == 0 and code.co_flags & inspect.CO_VARARGS
            and code.co_flags & inspect.CO_VARKEYWORDS):
        raise TypeError("capture() takes a function of the form f(*args, **kwargs)")
    with torch._dynamo.config.patch(enable_aot_compile=True):    # read by torch.compile itself on torch 2.11
        compiled_fn = torch.compile(fn, fullgraph=True, backend=stored_backend, dynamic=dynamic,
                                    options={"guard_filter_fn": _serializable_guards})
        compiled = compiled_fn.aot_compile((args, kwargs))
    if compiled._artifacts.original_code is not fn.__code__:
        raise ValueError("torch traced a wrapper around the function, whose closure cannot be given back")
    stored = compiled._artifacts.compiled_fn
    return StoredCapture(compiled, fn, stored.token, stored.fn)


def load(data: bytes, fn: Callable) -> StoredCapture:
    """A stored capture of ``fn`` (the function :func:`capture` was given, made again by this
    process: its closure is used), to :meth:`~StoredCapture.bind` to the graph its ``token``
    finds. Raises ``ValueError`` naming what no longer matches (a changed source, another torch)."""
    from torch._dynamo.aot_compile import AOTCompiledFunction, AOTCompileUnpickler, CompileArtifacts
    from torch._dynamo.package import SerializedCode, load_guard_manager, load_guards_state

    stored = pickle.loads(data)
    if stored["torch"] != torch.__version__:
        raise ValueError(f"stored by torch {stored['torch']}, this is torch {torch.__version__}")
    changed = _sources_unchanged(stored["sources"])
    if changed is not None:
        raise ValueError(f"the model's code changed since it was stored: {changed}")
    state = AOTCompileUnpickler(_closure_data(fn), io.BytesIO(stored["capture"])).load()
    env = state["runtime_env"]
    state["runtime_env"] = env = dataclasses.replace(env, bytecode=SerializedCode.to_code_object(env.bytecode))
    _, token = state["compiled_fn"]
    state["compiled_fn"] = _stored_graph_class()(None, token)
    state["original_code"] = SerializedCode.to_code_object(state["original_code"])
    f_locals = {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())}
    guards = load_guards_state(state["guards_state"])
    scope = guards.output_graph
    # Guards take their expected values from the stored scope; only what torch could not store
    # (a decorated function in the closure) comes from this process.
    from torch._dynamo.guards import _Missing
    live = {name: f_locals[name] if isinstance(value, _Missing) and name in f_locals else value
            for name, value in scope.local_scope.items()}
    if dataclasses.is_dataclass(scope) and not isinstance(scope, type):
        guards.output_graph = dataclasses.replace(scope, local_scope=live)
    else:
        scope.local_scope = live
    runtime_globals = {**fn.__globals__, **env.used_globals}
    state["guard_manager"] = load_guard_manager(guards, state["original_code"], runtime_globals)
    artifacts = CompileArtifacts(**state)
    return StoredCapture(AOTCompiledFunction(_artifacts=artifacts, _extra_globals=fn.__globals__), fn, token, None)


def unsupported_capture_errors() -> tuple[type, ...]:
    """Errors of a capture that cannot be stored (a graph break in a full-graph trace, a guard or
    value torch cannot serialize)."""
    from torch._dynamo import exc
    return tuple(t for t in (getattr(exc, "Unsupported", None), getattr(exc, "PackageError", None),
                             pickle.PicklingError) if t is not None)


__all__ = ["StoredCapture", "available", "capture", "load", "unsupported_capture_errors", "untraceable",
           "with_own_globals"]
