"""``capture.precompile``: Dynamo's capture of a model stored beside its compiled graphs, so that
a later process with the cache kept runs its first call without tracing the model again.

Each capture is a full-graph trace through torch's ahead-of-time compile
(:mod:`pipeline.compat.precompile`): the transformed bytecode, its guards, and the compile-cache
key of the graph it calls. Entries are kept per function and plan (the key hashes the model's
class and ``forward``, the plan, its passes and the machine, as a compiled graph's key does);
a call checks the guards of each entry in turn and runs the first that passes. With none
passing, the call is traced (and stored) as a new entry, up to the recompile limit.

A capture with symbolic sizes is stored like any other; its graph's entry is written again when the
graph makes a size class at run time (passes/codegen/specialize.py), and a graph rebuilt for it runs
a size outside its stored classes eagerly, group by group.

Calls this does not serve go through Dynamo as usual (the capture pass's normal path), with the
reason kept in :attr:`StoredCaptures.notes`: calls that need gradients (training graphs go
through AOTAutograd), a model that breaks the graph (a stored capture is one whole graph),
stances that change hits (``force_eager``, the ``*_then_compile`` ones), plans that verify
(``verify`` compares each graph with its capture), and calls past the recompile limit. Under ``eager_on_recompile`` and ``fail_on_recompile`` stored entries serve
their hits, and a miss runs eagerly or raises :class:`~pipeline.RecompileError` naming the
guards that failed, as Dynamo would."""
from __future__ import annotations

import hashlib
import pickle
import threading
import time
from typing import Any, Callable

import torch

from pipeline import compat
from pipeline.compat import precompile
from pipeline.errors import RecompileError
from pipeline.logs import get_logger

from .regions import with_own_code


class StoredCaptures:
    """The stored captures of one compiled function (module docstring); ``counts()`` appear in
    the compile report under ``calls``."""

    def __init__(self, target: Callable, context: Any, *, dynamic: bool | None, limit: int,
                 settings: Callable[[], Any], backend: Callable, stance: str = "default",
                 before_trace: Callable[[tuple, dict], None] | None = None):
        self.target = target
        self.context = context
        self.compilation = context.compilation
        self.dynamic = dynamic
        self.limit = limit
        self.settings = settings      # the Dynamo settings of the current grad mode (a context manager)
        self.backend = backend        # the capture pass's backend: (gm, example inputs) -> compiled graph
        self.stance = stance          # the plan's capture.stance
        self.before_trace = before_trace    # marks the plan's dynamic dims on a call about to be traced
        self.store = self.compilation.cache.captures
        self.call = _caller(target)
        self.disabled: str | None = precompile.untraceable(self.call)
        if stance not in compat.DIRECT_STANCES:
            self.disabled = f"capture.stance {stance}: calls go through Dynamo"
        if context.plan.verify != "off":     # verification compares with the captured graph
            self.disabled = f"verify: {context.plan.verify} checks every graph against its capture: calls go through Dynamo"
        self.entries: list[precompile.StoredCapture] | None = None
        self.key: str | None = None
        self.last: precompile.StoredCapture | None = None     # the entry the previous hit ran (checked first)
        self.notes: list[str] = []
        self.loaded = self.traced = self.stored = self.hits = self.misses = 0
        self.load_seconds = 0.0      # reading and checking stored entries, rebuilding their graphs
        self._log = get_logger("cache")
        self._lock = threading.RLock()    # loading and tracing: one thread at a time

    def counts(self) -> dict[str, int]:
        return {"stored_capture_hits": self.hits, "stored_captures_loaded": self.loaded,
                "captures_traced_for_storing": self.traced, "captures_stored": self.stored,
                "not_served_by_stored_captures": self.misses}

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)
            self._log.info("capture.precompile: %s", message)

    # -- one call ------------------------------------------------------------------------------------
    def __call__(self, args: tuple, kwargs: dict) -> Any:
        """The call's result, or :data:`compat.MISS` for the capture pass's normal path."""
        reason = self._declined(args, kwargs)
        if reason is not None:
            self.misses += 1
            self.note(reason)
            return compat.MISS
        if self.entries is None:
            with self._lock:
                if self.entries is None:
                    start = time.perf_counter()
                    self._load(args, kwargs)
                    self.load_seconds += time.perf_counter() - start
            if self.disabled is not None:       # nowhere to store (the cache is off)
                self.misses += 1
                self.note(self.disabled)
                return compat.MISS
        out = self._hit(args, kwargs)
        if out is not compat.MISS:
            return out
        with self._lock:     # one thread rebuilds or traces; it may find what another one added
            out = self._hit(args, kwargs, rebuild=True)
            return out if out is not compat.MISS else self._miss(args, kwargs)

    def _hit(self, args: tuple, kwargs: dict, *, rebuild: bool = False) -> Any:
        """The result through the first entry whose guards pass (the previous hit's first), or
        MISS; an entry whose graph is not rebuilt yet counts only when ``rebuild`` (under the lock)."""
        last = self.last
        if last is not None and last.check(args, kwargs):     # a repeated shape: the entry it ran last
            self.hits += 1
            return last.run(args, kwargs)
        for entry in list(self.entries):
            if entry is last or not entry.check(args, kwargs):
                continue
            if entry.graph is None:
                if not rebuild:
                    return compat.MISS
                start = time.perf_counter()
                rebuilt = self._rebuild(entry)
                self.load_seconds += time.perf_counter() - start
                if not rebuilt:
                    continue
            self.hits += 1
            self.last = entry
            return entry.run(args, kwargs)
        return compat.MISS

    def _miss(self, args: tuple, kwargs: dict) -> Any:
        """No entry's guards pass: a call that needs gradients goes to Dynamo (guards keep such
        calls off the stored entries: grad mode and ``requires_grad`` are among them), else the
        stance decides, else the call is traced and stored."""
        if torch.is_grad_enabled() and _needs_grad(self.target, args, kwargs):
            self.misses += 1
            self.note("calls that need gradients (training graphs) are not stored: they go through Dynamo")
            return compat.MISS
        stance = compat.current_stance()
        if stance == "default" and self.stance != "default":
            stance = self.stance
        if stance == "eager_on_recompile" and self.entries:
            self.misses += 1
            return self.target(*args, **kwargs)
        if stance == "fail_on_recompile" and self.entries:
            failed = "; ".join(entry.why(args, kwargs) for entry in self.entries[:3])
            raise RecompileError(f"stance fail_on_recompile: this call needs a new compiled variant (no stored "
                                 f"capture's guards pass: {failed})")
        if self.entries:        # a new variant beside stored ones: a recompile, with the guard that failed
            self.context.record_recompile(self.entries[0].why(args, kwargs))
        if self.traced >= self.limit:
            self.misses += 1
            self.note(f"{self.traced} captures traced in this process (the recompile limit): later variants "
                      f"go through Dynamo")
            return compat.MISS
        return self._trace(args, kwargs)

    def _declined(self, args: tuple, kwargs: dict) -> str | None:
        if self.disabled is not None:
            return self.disabled
        if compat.current_stance() not in compat.DIRECT_STANCES:
            return f"stance {compat.current_stance()}: calls go through Dynamo"
        return None

    # -- entries -------------------------------------------------------------------------------------
    def _material(self, args: tuple, kwargs: dict) -> str | None:
        target = self.compilation.target_for([v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)])
        material, reason = self.compilation.capture_material(target)
        if material is None:
            self.disabled = f"captures are not stored: {reason}"
            return None
        traced = self.target.forward if isinstance(self.target, torch.nn.Module) else self.target
        code = getattr(traced, "__code__", None)
        material["function"] = {
            "class": f"{type(self.target).__module__}.{type(self.target).__qualname__}",
            "qualname": getattr(traced, "__qualname__", None), "module": getattr(traced, "__module__", None),
            "code": hashlib.sha256(code.co_code).hexdigest() if code is not None else None,
        }
        material["dynamic"] = self.dynamic
        return self.store.key(material)

    def _load(self, args: tuple, kwargs: dict) -> None:
        self.entries = []
        self.key = self._material(args, kwargs)
        if self.key is None:
            return
        for name, data in self.store.entries(self.key):
            try:
                self.entries.append(precompile.load(data, self.call))
            except Exception as exc:  # noqa: BLE001 - an entry that does not load is traced again
                self.note(f"stored capture {name} not used: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            self.loaded += 1

    def _rebuild(self, entry: precompile.StoredCapture) -> bool:
        token = pickle.loads(entry.token)
        try:
            entry.bind(self.compilation.rebuild_graph(token["key"], token["target"]))
        except LookupError as exc:
            self.note(f"a stored capture's graph is no longer in the compile cache ({exc}): traced again")
            self.entries.remove(entry)
            self.last = None
            return False
        return True

    def _trace(self, args: tuple, kwargs: dict) -> Any:
        compilation = self.compilation
        storable: list[bool] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[Callable, bytes | None]:
            fn = self.backend(gm, example_inputs)
            graph_id = compilation.graphs[-1].graph_id if compilation.graphs else None
            key = compilation.stored_keys.get(graph_id)
            storable.append(False)
            if key is None:
                self.note(f"graph {graph_id} is not in the compile cache ({compilation.graphs[-1].cache.get('reason')}), "
                          f"so its capture is not stored")
                return fn, None
            storable[-1] = True
            return fn, pickle.dumps({"key": key, "target": compilation.target_for(example_inputs)})

        if self.before_trace is not None:
            self.before_trace(args, kwargs)
        try:
            with self.settings():
                capture = precompile.capture(self.call, args, kwargs, backend, dynamic=self.dynamic)
        except Exception as exc:  # noqa: BLE001 - the normal path captures it again (and raises its errors)
            kind = ("cannot be captured as one stored graph" if isinstance(exc, precompile.unsupported_capture_errors())
                    else "failed to be captured for storing")
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            self.disabled = f"the model {kind} ({type(exc).__name__}: {first}): calls go through Dynamo"
            self.misses += 1
            self.note(self.disabled)
            return compat.MISS
        self.traced += 1
        self.entries.append(capture)
        self.last = capture
        if self.key is not None and storable and all(storable):
            try:
                self.store.add(self.key, capture.to_bytes())
                self.stored += 1
            except Exception as exc:  # noqa: BLE001 - not storing never fails the call
                self.note(f"capture not stored: {type(exc).__name__}: {str(exc)[:300]}")
        return capture.run(args, kwargs)


def _caller(target: Callable) -> Callable:
    """What is traced and stored: a call of ``target`` (a module: with its hooks, as a call of the
    module runs them) whose closure, ``target`` itself, a loading process supplies."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return target(*args, **kwargs)
    # Its own code object, as the capture pass's own caller has: Dynamo's automatic-dynamic state
    # is kept per code object, and two models sharing one would make the second one's sizes symbolic.
    return precompile.with_own_globals(with_own_code(call, f"stored_{type(target).__name__}"))


def _needs_grad(target: Callable, args: tuple, kwargs: dict) -> bool:
    if any(isinstance(v, torch.Tensor) and v.requires_grad for v in (*args, *kwargs.values())):
        return True
    return isinstance(target, torch.nn.Module) and any(p.requires_grad for p in target.parameters())


__all__ = ["StoredCaptures"]
