"""The Dynamo part of the compatibility module (:mod:`pipeline.compat` re-exports every public
name here): compiling with our backend, the process-wide settings a plan makes (recompile limit,
limit policy, logging calls to skip), stances, recompile-limit hits and Dynamo's exception types."""
from __future__ import annotations

import inspect
import logging
import threading
import types
from typing import Any, Callable

import torch

from pipeline.compat.fixes import apply_data_dependent_fixes


def dynamo_compile(fn: Callable, backend: Callable, *, fullgraph: bool, dynamic: bool | None) -> Callable:
    """Dynamo-optimize ``fn`` with our own backend (no Inductor involved)."""
    return torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=dynamic)


_own_compile_lock = threading.RLock()


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Ask Dynamo to trace ``dim`` of ``tensor`` with a symbolic size (``maybe_mark_dynamic``: a
    size Dynamo then specializes, 0 or 1, is no error)."""
    torch._dynamo.maybe_mark_dynamic(tensor, dim)


def compile_lock() -> Any:
    """The lock Dynamo holds while it compiles a frame (re-entrant), for compiles that run outside
    Dynamo: a training graph's backward, compiled lazily when autograd first runs it, and
    ``torch.export`` captures. Tracing (``make_fx``, FX's tracer) patches ``torch.nn.Module``
    process-wide while it runs, so it must never overlap Dynamo tracing in another thread."""
    from torch._dynamo import convert_frame
    return getattr(convert_frame, "compile_lock", _own_compile_lock)


class DynamoSettings:
    """Dynamo's process-wide settings a plan needs while its model is called: the recompile limit
    and its policy (``fail_on_recompile_limit_hit``), the logging functions traced code skips
    instead of breaking the graph at (``ignore_logging``, see :func:`logger_functions`), and
    whether guards skip a module subtree whose dictionaries are unchanged since the last call
    (``dict_tag_guards``: Dynamo's ``use_recursive_dict_tags_for_guards``), whether NumPy calls
    are traced into torch operators (``trace_numpy``), whether ``.item()`` and operators with
    data-dependent output shapes are captured with unbacked sizes instead of breaking the graph
    (``data_dependent``: ``capture_scalar_outputs``, ``capture_dynamic_output_shape_ops``); and
    Dynamo ignores FX's process-wide tracing flag, which another thread's compile sets while it
    traces.

    Used as a context manager around each call that may compile (Dynamo reads these when a frame
    misses its cache): entering sets them, leaving the last active call restores what they were,
    so nothing outlives the call that needed it and an unrelated ``torch.compile`` keeps
    Dynamo's defaults. Calls overlapping in several threads share one setting of the values (the
    last plan entered wins while they overlap) and the first values are restored when the last
    one leaves. Settings this torch's Dynamo lacks are skipped."""

    _lock = threading.Lock()
    _active = 0
    _saved: dict[str, Any] = {}

    def __init__(self, *, recompile_limit: int, fail_on_limit: bool, ignore_logging: frozenset = frozenset(),
                 dict_tag_guards: bool = False, trace_numpy: bool = True, data_dependent: bool = False):
        config = torch._dynamo.config
        wanted: dict[str, Any] = {"recompile_limit": recompile_limit}
        for name in ("capture_scalar_outputs", "capture_dynamic_output_shape_ops"):
            if hasattr(config, name):
                wanted[name] = data_dependent
        if hasattr(config, "trace_numpy"):
            wanted["trace_numpy"] = trace_numpy
        if hasattr(config, "force_compile_during_fx_trace"):
            # FX's "tracing now" flag is process-wide: another thread's make_fx (a backward graph
            # compiling lazily) must not turn this thread's call into "nested FX tracing".
            wanted["force_compile_during_fx_trace"] = True
        if hasattr(config, "fail_on_recompile_limit_hit"):
            wanted["fail_on_recompile_limit_hit"] = fail_on_limit
        if hasattr(config, "use_recursive_dict_tags_for_guards"):
            wanted["use_recursive_dict_tags_for_guards"] = dict_tag_guards
        self._ignore_logging = ignore_logging if hasattr(config, "ignore_logging_functions") else frozenset()
        if self._ignore_logging:
            _quiet_metrics_config_error()
        self._wanted = wanted
        if data_dependent:
            apply_data_dependent_fixes()

    def __enter__(self) -> None:
        config = torch._dynamo.config
        cls = DynamoSettings
        with cls._lock:
            if cls._active == 0:
                cls._saved = {name: getattr(config, name) for name in self._wanted}
                if self._ignore_logging:
                    cls._saved["ignore_logging_functions"] = set(config.ignore_logging_functions)
            cls._active += 1
            for name, value in self._wanted.items():
                if getattr(config, name) != value:
                    setattr(config, name, value)
            if self._ignore_logging and not self._ignore_logging <= config.ignore_logging_functions:
                config.ignore_logging_functions = set(config.ignore_logging_functions) | self._ignore_logging

    def __exit__(self, *exc: Any) -> None:
        config = torch._dynamo.config
        cls = DynamoSettings
        with cls._lock:
            cls._active -= 1
            if cls._active == 0:
                for name, value in cls._saved.items():
                    if getattr(config, name) != value:
                        setattr(config, name, value)
                cls._saved = {}


_METRICS_LOGGER = "torch._dynamo.metrics_context"
_metrics_filter_installed = False


def _unsortable_config_error(record: logging.LogRecord) -> bool:
    """A filter dropping one known-harmless error record: Dynamo (torch 2.11) sorting every set in
    its config to log compilation metrics, which fails on the functions in
    ``ignore_logging_functions`` (torch 2.13 leaves that key out). Nothing else is affected."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, TypeError) and "'function'" in str(exc)
                and "compilation metrics" in record.getMessage())


def _quiet_metrics_config_error() -> None:
    global _metrics_filter_installed
    if _metrics_filter_installed:
        return
    logging.getLogger(_METRICS_LOGGER).addFilter(_unsortable_config_error)
    _metrics_filter_installed = True


_LOGGER_METHODS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log",
                   "warning_once", "info_once")   # the last two: what transformers adds to logging.Logger


def logger_functions() -> frozenset:
    """The functions behind ``logging.Logger``'s methods, transformers' ``warning_once`` included."""
    return frozenset(logging.Logger.__dict__[name] for name in _LOGGER_METHODS if name in logging.Logger.__dict__)


def logging_can_be_ignored() -> bool:
    """Whether this torch's Dynamo can skip logger calls instead of breaking the graph."""
    return hasattr(torch._dynamo.config, "ignore_logging_functions")


def stance(name: str):
    """Context manager applying a torch.compiler stance."""
    return torch.compiler.set_stance(name)


class ReusableStance:
    """A context manager applying one stance, cheap to enter on every call of a compiled model
    (``torch.compiler.set_stance`` builds its state anew each time). Not re-entrant: one per
    caller, entered by one thread at a time."""

    def __init__(self, name: str):
        from torch._dynamo import eval_frame
        self._set = eval_frame._set_stance
        self._stance = eval_frame.DynamoStance(name)
        self._prior: Any = None

    def __enter__(self) -> None:
        self._prior = self._set(self._stance)

    def __exit__(self, *exc: Any) -> None:
        self._set(self._prior)


STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile", "eager_then_compile",
           "aot_eager_then_compile")


def current_stance() -> str:
    """The torch.compiler stance in force now (``"default"`` unless someone set another)."""
    from torch._dynamo import eval_frame
    return str(getattr(getattr(eval_frame, "_stance", None), "stance", "default"))


_limit_hits: list[str] = []
_limit_filter_installed = False


def _record_limit_hit(record: Any) -> bool:
    """A logging filter on Dynamo's convert_frame logger: remember each "hit config.recompile_limit"
    warning (Dynamo says nothing else when it gives up compiling a function), let it through."""
    message = record.msg if isinstance(record.msg, str) else ""
    if "hit config." in message:
        text = record.getMessage().splitlines()
        _limit_hits.append(" ".join(line.strip() for line in text[:3]))
    return True


def max_variants_per_function() -> int:
    """Dynamo's ceiling on compiled variants of one function, whatever its recompile limit
    (``accumulated_recompile_limit``)."""
    return int(getattr(torch._dynamo.config, "accumulated_recompile_limit", 256))


def recompile_limit_hit_count() -> int:
    """How many times Dynamo has hit a recompile limit in this process (see
    :func:`recompile_limit_hits`); cheap enough to read around every call."""
    global _limit_filter_installed
    if not _limit_filter_installed:
        logging.getLogger("torch._dynamo.convert_frame").addFilter(_record_limit_hit)
        _limit_filter_installed = True
    return len(_limit_hits)


def recompile_limit_hits(since: int = 0) -> list[str]:
    """Dynamo's own text for each recompile-limit hit after the first ``since`` (limit, function,
    last guard failure)."""
    return list(_limit_hits[since:])


_break_counts: dict[str, int] = {}
_break_hook: bool | None = None     # None: not tried yet; False: this Dynamo has no log_graph_break
_NOT_A_SPLIT = "Failed to handle graph break gracefully"   # the whole frame runs eagerly instead


def _count_logged_breaks() -> bool:
    """Count every graph break Dynamo logs, by reason, in :data:`_break_counts`.

    Dynamo's ``counters["graph_break"]`` misses some: in torch 2.13 a data-dependent branch
    (``if tensor.sum() > 0:``) in the frame being compiled splits the graph but is counted under
    ``counters["unimplemented"]``, beside unsupported operations that split nothing. Every split
    goes through ``InstructionTranslatorBase.log_graph_break`` once (it marks the exception
    logged), so a wrapper there counts each one; the call logging a frame that falls back to
    eager whole (an exception leaving the compiled function, for example) is not a split."""
    global _break_hook
    if _break_hook is None:
        from torch._dynamo import symbolic_convert
        cls = getattr(symbolic_convert, "InstructionTranslatorBase", None)
        original = getattr(cls, "log_graph_break", None)
        _break_hook = original is not None
        if _break_hook and not getattr(original, "_pipeline_counting", False):
            def log_graph_break(self: Any, *args: Any, **kwargs: Any) -> Any:
                exc = kwargs.get("exc", args[2] if len(args) > 2 else None)
                reason = str(kwargs.get("reason", args[1] if len(args) > 1 else ""))
                if exc is not None and not getattr(exc, "logged", False) and not reason.startswith(_NOT_A_SPLIT):
                    key = getattr(exc, "msg", None) or reason
                    _break_counts[key] = _break_counts.get(key, 0) + 1
                return original(self, *args, **kwargs)

            log_graph_break._pipeline_counting = True
            cls.log_graph_break = log_graph_break
    return _break_hook


def graph_break_counts() -> dict[str, int]:
    """The running count of graph breaks by reason, process-wide: per reason the larger of
    Dynamo's own counter and the breaks its log calls showed since the first call of this
    function (see :func:`_count_logged_breaks`). Each covers what the other may miss on some
    torch release; both key a reason by the exception's message."""
    from torch._dynamo.utils import counters
    counted = dict(counters["graph_break"])
    if _count_logged_breaks():
        for reason, count in _break_counts.items():
            counted[reason] = max(count, counted.get(reason, 0))
    return counted


def unsupported_error_types() -> tuple[type, ...]:
    """Exceptions Dynamo raises for a graph break under ``fullgraph=True``."""
    from torch._dynamo import exc
    return (exc.Unsupported, exc.UserError)


def recompile_error_types() -> tuple[type, ...]:
    """Exceptions Dynamo raises for a refused recompile (fail_on_recompile, the limit)."""
    from torch._dynamo import exc
    types = [exc.RecompileError]
    for name in ("FailOnRecompileLimitHit", "RecompileLimitExceeded", "CacheLimitExceeded"):
        if hasattr(exc, name):
            types.append(getattr(exc, name))
    return tuple(types)


def is_refused_recompile(exc: BaseException) -> bool:
    """True for Dynamo's refusal to compile under stance fail_on_recompile (a plain RuntimeError)."""
    return isinstance(exc, recompile_error_types()) or (
        isinstance(exc, RuntimeError) and "stance is 'fail_on_recompile'" in str(exc))


def data_dependent_failure(error: BaseException) -> str | None:
    """When ``error`` (or an exception it wraps) is a failure to trace an unbacked size (a guard on
    a data-dependent expression, an unbacked symbol Dynamo lost track of, a failure inside
    Dynamo's own tracing): its type and first line; else None."""
    from torch._dynamo import exc as dynamo_exc
    from torch.fx.experimental import symbolic_shapes
    kinds = tuple(getattr(symbolic_shapes, name) for name in
                  ("GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound") if hasattr(symbolic_shapes, name))
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kinds) or isinstance(error, dynamo_exc.InternalTorchDynamoError):
            text = str(error).strip().splitlines()
            return f"{type(error).__name__}: {text[0][:200] if text else ''}"
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def backend_failure_types() -> tuple[type, ...]:
    """Dynamo's wrapper exceptions for an error raised inside a compiler backend (ours), so
    capture can unwrap the project's own error from them."""
    from torch._dynamo import exc
    return (exc.BackendCompilerFailed,)


def reset_dynamo() -> None:
    """Forget every Dynamo cache and compiled frame (tests and ``bisect`` start from scratch)."""
    torch._dynamo.reset()


MISS = object()
"""What :meth:`DirectCall.__call__` returns when it did not run the call (Dynamo's path must)."""

DIRECT_STANCES = frozenset({"default", "eager_on_recompile", "fail_on_recompile"})
"""Stances under which :class:`DirectCall` runs hits (they differ from the default on misses only)."""


_DISABLED_CODE: Any = None


def _without_disable(fn: Callable) -> Callable:
    """``fn`` without the ``torch._dynamo.disable`` wrappers around it (each is a function with
    the code object of Dynamo's disabling wrapper, which keeps the wrapped one as ``__wrapped__``)."""
    global _DISABLED_CODE
    if _DISABLED_CODE is None:
        _DISABLED_CODE = torch._dynamo.disable(lambda: None).__code__
    while getattr(fn, "__code__", None) is _DISABLED_CODE and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def unwrapped_function(code: Any, f_globals: dict, name: str, closure: tuple | None,
                       defaults: tuple = (None, None)) -> Callable:
    """Dynamo's transformed ``code`` (one compiled graph, no resume functions) as a plain function
    to run with no frame hook installed. Dynamo wraps the compiled graph in ``disable`` (its
    frame hook off while the graph runs: three hook swaps a call); here the code gets a copy of
    the globals in which that name is the graph itself, and the profiler-range markers around
    the graph call are unwrapped the same way."""
    namespace = dict(f_globals)
    for compiled in (n for n in code.co_names if n.startswith("__compiled_fn")):
        namespace[compiled] = _without_disable(namespace[compiled])
    for used in code.co_names:
        if used in namespace and getattr(namespace[used], "__name__", "") == "torch._dynamo.utils":
            namespace[used] = _UtilsWithoutDisable(namespace[used])
    runnable = types.FunctionType(code, namespace, name, defaults[0], closure)
    runnable.__kwdefaults__ = defaults[1]
    return runnable


class _UtilsWithoutDisable:
    """``torch._dynamo.utils`` as the transformed code of a direct call reads it: its
    ``record_pregraph_bytecode_enter/exit`` (a profiler range around the graph call) and the size
    readers of graphs with symbolic sizes (``call_size``, ``call_stride``, ``call_storage_offset``),
    each behind a disabling wrapper, without the wrappers; every other name is the module's."""

    _UNWRAPPED = ("record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit", "call_size", "call_stride",
                  "call_storage_offset")

    def __init__(self, module: Any):
        self._module = module
        for name in self._UNWRAPPED:
            fn = getattr(module, name, None)
            if fn is not None:
                setattr(self, name, getattr(fn, "__wrapped__", fn))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class DirectCall:
    """Runs a Dynamo-compiled function's cached code without Dynamo's frame machinery.

    A call through ``torch.compile`` goes through Python wrappers that swap Dynamo's frame
    callback in and out, then through the C frame hook, which evaluates the guards of each cache
    entry and runs the first passing entry's transformed bytecode (load the graph's inputs, call
    the compiled graph, rebuild the outputs). The guards themselves are a small part of that: most
    of it is the wrappers' bookkeeping, paid on every call.

    This does the same lookup directly: the frame's locals are built from the call's arguments
    and the function's closure, each cache entry compiled by *our* backend has its guard manager
    checked in Dynamo's order (the entry the previous direct call ran first: a graph for size 1
    after a size change has Dynamo check the newer dynamic entry's failing guards on every call,
    and any entry whose guards pass is valid for the call), and the first that passes has its
    transformed code run as a plain function, with the compiled graph and Dynamo's profiler-range
    markers unwrapped from their ``disable`` wrappers (no frame hook is installed on this path).
    It declines (returns :data:`MISS`, and the caller goes through Dynamo) when no entry passes
    (a recompile is due), when ``allowed()`` says no (capture: once a call of the current grad
    mode saw a graph break), when the entry that passes calls anything but one compiled graph
    (resume functions after a graph break are compiled by Dynamo's frame hook only, and would
    run eagerly here), under a stance that changes hits (``force_eager``, the ``*_then_compile``
    stances), and when called while Dynamo is tracing or its frame hook is installed (a compiled
    function calling this one). It does not read ``torch._dynamo.config.disable`` (a costly
    config read): a process that turns Dynamo off after compiling keeps running what was
    compiled until a call misses.
    """

    def __init__(self, fn: Callable, backend: Callable, allowed: Callable[[], bool] = lambda: True):
        self._code = fn.__code__
        self._allowed = allowed
        self._globals = fn.__globals__
        self._closure = fn.__closure__ or ()
        self._defaults = (fn.__defaults__, fn.__kwdefaults__)
        self._backend = backend
        self._runnable: dict[Any, Any] = {}       # transformed code -> function, or None
        code = self._code
        flags = code.co_flags
        self._varargs_only = (code.co_argcount == 0 and code.co_kwonlyargcount == 0
                              and flags & inspect.CO_VARARGS and flags & inspect.CO_VARKEYWORDS)
        self._signature = None if self._varargs_only else inspect.signature(fn)
        from torch._dynamo import eval_frame
        self._eval_frame = eval_frame
        self._entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
        self._frame_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback
        self._is_compiling = torch.compiler.is_compiling
        self._last = None  # guard manager of the entry the last direct call ran
        self.hits = 0      # calls run directly
        self.misses = 0    # calls left to Dynamo

    def counts(self) -> dict[str, int]:
        """Calls run directly and calls that went through Dynamo (compiles, recompiles, breaks)."""
        return {"direct": self.hits, "through_dynamo": self.misses}

    def _locals(self, args: tuple, kwargs: dict) -> dict:
        if self._varargs_only:
            names = self._code.co_varnames
            local = {names[0]: args, names[1]: kwargs}
        else:
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            local = dict(bound.arguments)
        for name, cell in zip(self._code.co_freevars, self._closure):
            local[name] = cell.cell_contents
        return local

    def _function(self, code: Any) -> Any:
        """The transformed ``code`` as a function, or None when it needs Dynamo's frame hook."""
        runnable = self._runnable.get(code, MISS)
        if runnable is not MISS:
            return runnable
        if len(self._runnable) > 64:     # entries Dynamo dropped (a reset) are not kept forever
            self._runnable.clear()
        runnable = None
        compiled = [name for name in code.co_names if name.startswith("__compiled_fn")]
        if (code.co_freevars == self._code.co_freevars and len(compiled) == 1
                and not any(name.startswith("__resume_at") for name in code.co_names)):
            runnable = unwrapped_function(code, self._globals, self._code.co_name, self._closure or None,
                                          self._defaults)
        self._runnable[code] = runnable
        return runnable

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        # Every check here is paid on every call, so each is the cheapest form of its question.
        stance = getattr(self._eval_frame._stance, "stance", "default")
        if (stance not in DIRECT_STANCES or self._is_compiling() or self._frame_callback() is not None
                or not self._allowed()):
            self.misses += 1
            return MISS
        entries = self._entries(self._code)
        local = self._locals(args, kwargs)
        last = self._last
        if last is not None:        # the entry the previous hit ran, whose guards a repeated size passes
            for entry in entries:
                if entry.guard_manager is last:
                    if last.check(local):
                        return self._run(entry, args, kwargs)
                    break
        for entry in entries:
            if entry.guard_manager is last or getattr(entry.backend, "compiler_fn", entry.backend) is not self._backend:
                continue
            if entry.guard_manager.check(local):
                return self._run(entry, args, kwargs)
        self.misses += 1
        return MISS

    def _run(self, entry: Any, args: tuple, kwargs: dict) -> Any:
        function = self._function(entry.code)
        if function is None:
            self._last = None
            self.misses += 1
            return MISS
        self._last = entry.guard_manager
        self.hits += 1
        return function(*args, **kwargs)
