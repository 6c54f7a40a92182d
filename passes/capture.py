"""``capture``: the frontend. Turns a model or function into FX graphs and hands each one to the
rest of the plan. ``frontend: dynamo`` uses TorchDynamo (guards, graph breaks, recompiles);
``frontend: export`` uses ``torch.export`` (one whole graph, no Python fallback)."""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Literal

import attrs
import torch

from pipeline import CaptureContext, CapturePass, GraphCompiler, device_types, option, positive
from pipeline import compat
from pipeline.errors import GraphBreakError, PipelineError, RecompileError, did_you_mean

from .attention_gqa import grouped_query_attention
from .attention_masks import constant_attention_masks, dense_attention_masks
from .capture_checks import EagerRejected, eager_rejection
from .regions import with_own_code


def _check_dims(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return "a mapping from a parameter name (or position, as a string) to a list of dims"
    for name, dims in value.items():
        if not isinstance(dims, list) or not all(type(d) is int for d in dims):
            return f"{name}: a list of dims (integers), not {dims!r}"
    return None


@attrs.frozen
class CaptureOptions:
    frontend: Literal["dynamo", "export"] = option(
        "dynamo", "dynamo: TorchDynamo with guards and graph breaks; export: torch.export, whole graph only.")
    fullgraph: bool = option(False, "Turn any graph break into an error naming its source line.")
    dynamic: bool | None = option(
        None, "Dynamo's dynamic-shape mode: null specializes first and generalizes on a size change; "
              "false always specializes; true makes sizes symbolic from the start.")
    recompile_limit: int = option(8, "Most compiled variants per function before the limit is hit.",
                                  check=positive)
    on_recompile_limit: Literal["error", "warn"] = option(
        "warn", "warn (torch.compile's behaviour): hitting the recompile limit warns once, runs new variants "
                "eagerly and records the fallback in the compile record; error: it raises RecompileError.")
    stance: Literal["default", "force_eager", "eager_on_recompile", "fail_on_recompile"] = option(
        "default", "torch.compiler stance applied to every call of the compiled model.")
    strict: bool = option(False, "export only: use strict (Dynamo-based) export tracing.")
    regions: list[str] = option(
        [], "dynamo only: regional compilation. Classes of repeated blocks (full name such as "
            "transformers.models.gpt2.modeling_gpt2.GPT2Block, or the bare class name): each block instance "
            "runs through one compiled function per class, so the block is compiled once and reused by every "
            "instance that passes the same guards; the rest of the model runs eagerly (docs/caching.md).")
    ignore_logging: bool = option(
        False, "dynamo only: logging.Logger calls (debug ... critical, and the warning_once/info_once that "
               "transformers adds) in compiled code are skipped instead of breaking the graph: the model is "
               "captured in fewer, larger graphs, and those log messages are not emitted while it runs compiled.")
    region_hooks: Literal["auto", "compiled", "eager"] = option(
        "auto", "With regions: compiled traces each block's forward hooks with it; eager runs them in "
                "nn.Module.__call__ and compiles only the class's forward; auto is eager for FSDP2 "
                "(fully_shard) blocks, whose hooks Dynamo cannot trace, and compiled otherwise "
                "(docs/distributed.md).")
    trace_numpy: bool = option(
        False, "dynamo only: true traces NumPy calls into torch operators (torch.compile's default), which also "
               "turns a NumPy array passed where a tensor is expected into a tensor where eager raises; false runs "
               "NumPy code as NumPy, eagerly, as the model does without compiling.")
    direct_calls: bool = option(
        True, "dynamo only: a call whose guards pass runs the cached compiled code directly, skipping Dynamo's "
              "per-call wrappers (the guards checked are Dynamo's own). "
              "Calls that miss, graphs with breaks, and the force_eager / *_then_compile stances go through "
              "Dynamo as usual. false: every call goes through Dynamo.")
    dynamic_dims: dict[str, list[int]] = option(
        {}, "dynamo only: dimensions made symbolic from the first call, by the forward's parameter name (or "
            "position, as a string) -> dims (torch._dynamo.maybe_mark_dynamic on each call that may compile): "
            "{input_ids: [0]} with dynamic: false keeps every other size static, so a plan can say \"batch is "
            "dynamic, hidden size is not\". Sizes 0 and 1 still specialize, as Dynamo does.",
        check=_check_dims)
    unknown_dynamic_dims: Literal["error", "ignore"] = option(
        "error", "dynamo only: a dynamic_dims name the forward has no parameter for: error, or ignore (a plan "
                 "written for several models, such as llm-serving's Hugging Face input names).")
    data_dependent: bool = option(
        False, "dynamo only: capture .item() and operators whose output shape depends on the data (nonzero, "
               "unique, masked_select...) with unbacked sizes instead of breaking the graph (Dynamo's "
               "capture_scalar_outputs and capture_dynamic_output_shape_ops, set while the model is called); "
               "groups with such sizes get kernels per size seen like other symbolic groups. Off unless a "
               "plan sets it (the default plan does); when Dynamo's own tracing of an unbacked size fails "
               "(combinations), the function is captured again without it and the reason recorded.")
    dense_attention_masks: list[str] = option(
        ["cuda"], "dynamo only: devices on which an attention mask broadcast along its key axis (stride 0 there, "
                  "as transformers' encoder masks are under tracing) is made dense before the graph is traced "
                  "to ATen: the fused attention kernels need a unit stride there, and tracing otherwise picks "
                  "the float32 math path (passes/attention_masks.py). [] keeps every mask as captured.",
        check=device_types)
    constant_attention_masks: list[str] = option(
        ["cpu", "cuda"], "dynamo only: devices on which an attention mask computed from no input (transformers "
                         "builds one under tracing for a model called without a padding mask) is evaluated when "
                         "the graph is captured: one that hides nothing is dropped, and one that is the causal "
                         "pattern becomes is_causal=True, so the fused kernels read no mask "
                         "(passes/attention_masks.py). [] keeps every mask.", check=device_types)
    gqa_attention: list[str] = option(
        ["cpu", "cuda"], "dynamo only: devices on which an attention call whose key and value are transformers' "
                         "repeat_kv of fewer heads takes the unrepeated heads with enable_gqa=True (no key/value "
                         "copies, and a faster fused kernel: CPU flash attention, cuDNN's), in inference (no input "
                         "requiring gradients) (passes/attention_gqa.py). [] keeps every repeat.",
        check=device_types)
    dict_tag_guards: bool = option(
        True, "dynamo only: guards skip the checks under a module whose dictionaries (parameters, buffers, "
              "submodules, attributes) are untouched since the last call (Dynamo's "
              "use_recursive_dict_tags_for_guards; it already does so for a dictionary's own tensors). A "
              "process-wide Dynamo setting, applied while this plan's model is called and restored after.")
    precompile: bool = option(
        False, "dynamo only: store each capture (Dynamo's transformed code and its guards, through torch's "
               "ahead-of-time compile) in the compile cache beside its compiled graph, so a later process's "
               "first call checks the stored guards instead of tracing the model (passes/stored_capture.py). "
               "Whole graphs of inference calls with static sizes only; other calls, and models that break "
               "the graph, go through Dynamo as usual, with the reason in the runtime's notes. Guards on "
               "module-level globals the model reads are not stored (as torch's aot_compile).")


class Capture(CapturePass):
    """Capture graphs with Dynamo (guards, graph breaks, recompiles) or torch.export."""

    name = "capture"
    Options = CaptureOptions
    version = "10"
    provides = frozenset({"captured"})

    def capture(self, fn: Callable, compile_graph: GraphCompiler, context: CaptureContext) -> Callable:
        if self.options.frontend == "export":
            if self.options.regions:
                raise PipelineError("capture.regions (regional compilation) works with frontend: dynamo only; "
                                    "remove regions or use frontend: dynamo.")
            if self.options.precompile:
                raise PipelineError("capture.precompile (stored captures) works with frontend: dynamo only; "
                                    "remove precompile or use frontend: dynamo.")
            return _ExportRunner(fn, compile_graph, context, self.options)
        return self._capture_dynamo(fn, compile_graph, context)

    def _capture_dynamo(self, fn: Callable, compile_graph: GraphCompiler, context: CaptureContext) -> Callable:
        opts = self.options
        failures_seen = compat.guard_failure_counts()

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            nonlocal failures_seen
            reasons = compat.new_guard_failures(failures_seen)
            failures_seen = compat.guard_failure_counts()
            rejected = eager_rejection(gm)
            if rejected is not None:     # eager's own error, raised before anything compiles
                raise EagerRejected(rejected)
            compile_id = compat.current_compile_id()
            if compile_id is not None and compile_id[1] > 0:
                context.record_recompile(compat.recompile_reason(reasons, compile_id[0])
                                         or (reasons[0] if reasons else "guard failed (reason not recorded)"))
            if opts.constant_attention_masks:
                constant_attention_masks(gm, opts.constant_attention_masks)
            if opts.dense_attention_masks:
                dense_attention_masks(gm, opts.dense_attention_masks)
            if opts.gqa_attention:
                grouped_query_attention(gm, opts.gqa_attention)
            return compile_graph(gm, example_inputs)

        sharded: list = []
        if opts.regions:
            from .regions import RegionalRunner
            optimized = RegionalRunner(fn, opts.regions, lambda region: compat.dynamo_compile(
                region, backend, fullgraph=opts.fullgraph, dynamic=opts.dynamic), opts.region_hooks)
        else:
            from .regions import sharded_block_classes
            sharded = sharded_block_classes(fn)
            if sharded:
                warnings.warn(f"pipeline: {type(fn).__name__} has FSDP2 (fully_shard) submodules, whose hooks "
                              f"Dynamo does not trace: compiled whole, its graph breaks at every sharded "
                              f"module and only the frames between the hooks are compiled. To compile each "
                              f"sharded block's forward once, with its hooks eager, use capture: {{regions: "
                              f"{sharded}}} (docs/distributed.md).", stacklevel=4)
            target = _module_caller(fn) if isinstance(fn, torch.nn.Module) else fn
            optimized = compat.dynamo_compile(target, backend, fullgraph=opts.fullgraph, dynamic=opts.dynamic)
        ignored_logging = frozenset()
        if opts.ignore_logging:
            if compat.logging_can_be_ignored():
                ignored_logging = compat.logger_functions()
            else:
                warnings.warn("pipeline: capture.ignore_logging is set, but this torch's Dynamo cannot skip "
                              "logging calls: they break the graph as usual.", stacklevel=4)
        unsupported = compat.unsupported_error_types()
        refused = compat.recompile_error_types()
        backend_failed = compat.backend_failure_types()

        # The plan's declared shape buckets (context.planned_variants) are variants on purpose.
        def dynamo_settings(data_dependent: bool) -> compat.DynamoSettings:
            return compat.DynamoSettings(recompile_limit=opts.recompile_limit + context.planned_variants,
                                         fail_on_limit=opts.on_recompile_limit == "error",
                                         ignore_logging=ignored_logging, dict_tag_guards=opts.dict_tag_guards,
                                         trace_numpy=opts.trace_numpy, data_dependent=data_dependent)

        # Per grad mode, a global state Dynamo guards on: tracing an unbacked size can fail with grad
        # enabled only (a library's backward formula), and then calls without grad keep their
        # whole graphs (their cache entries were made under these settings).
        whole = dynamo_settings(opts.data_dependent)
        settings = {False: whole, True: whole}
        compiled_name = getattr(getattr(target, "__code__", None), "co_name", None) if not opts.regions else None

        if opts.stance != "default":
            inner = optimized

            def optimized(*args: Any, **kwargs: Any) -> Any:
                if compat.current_stance() != "default":   # a stance the caller set wins over the plan's
                    return inner(*args, **kwargs)
                with compat.stance(opts.stance):
                    return inner(*args, **kwargs)

        direct = None
        if opts.direct_calls and not opts.regions and opts.stance in compat.DIRECT_STANCES and not sharded:
            direct = compat.DirectCall(target, backend, allowed=context.without_graph_breaks)
            context.expose("direct_calls", direct)

        mark = _dim_marker(fn, opts.dynamic_dims, opts.unknown_dynamic_dims) if opts.dynamic_dims else None
        stored = None
        if opts.precompile and (opts.regions or sharded):
            warnings.warn("pipeline: capture.precompile is not applied with regional compilation (capture.regions "
                          "or FSDP2-sharded blocks): each region is traced in every process.", stacklevel=4)
        elif opts.precompile:
            from .stored_capture import StoredCaptures
            stored = StoredCaptures(fn, context, dynamic=opts.dynamic,
                                    limit=opts.recompile_limit + context.planned_variants,
                                    settings=lambda: settings[torch.is_grad_enabled()], backend=backend,
                                    stance=opts.stance, before_trace=mark)
            context.expose("stored_captures", stored)

        def call(args: tuple, kwargs: dict) -> Any:
            hits = compat.recompile_limit_hit_count()
            try:
                with settings[torch.is_grad_enabled()]:
                    out = optimized(*args, **kwargs)
            except PipelineError:
                raise
            except backend_failed as exc:
                inner = getattr(exc, "inner_exception", None) or exc.__cause__
                if isinstance(inner, EagerRejected):
                    raise inner.error.with_traceback(None) from None
                if isinstance(inner, PipelineError):
                    # Our own error, without Dynamo's wrapper, keeping its cause (a plugin's traceback).
                    raise inner from inner.__cause__
                raise
            except unsupported as exc:
                if not opts.fullgraph:
                    raise
                raise GraphBreakError(_graph_break_message(exc)) from None
            except refused as exc:
                raise RecompileError(_recompile_message(exc, opts)) from None
            except RuntimeError as exc:
                if compat.is_refused_recompile(exc):
                    raise RecompileError(_recompile_message(exc, opts)) from None
                raise
            # on_recompile_limit: warn, and Dynamo gave up. (Under error, the thread that hit the
            # limit got the RecompileError; the count is process-wide, so other threads see it too.)
            if opts.on_recompile_limit == "warn" and compat.recompile_limit_hit_count() != hits:
                for hit in compat.recompile_limit_hits(hits):
                    if compiled_name is not None and compiled_name not in hit:
                        continue      # another compiled function (another thread) hit its limit
                    reason = (f"capture hit its recompile limit (capture.recompile_limit {opts.recompile_limit}, "
                              f"on_recompile_limit: {opts.on_recompile_limit}), so new variants run eagerly: {hit}")
                    if context.record_fallback(reason):
                        warnings.warn(f"pipeline: {reason}. Raise the limit, declare shape buckets, or make the "
                                      f"changing dimension dynamic.", stacklevel=3)
            return out

        data_dependent = {False: opts.data_dependent, True: opts.data_dependent}

        def run(*args: Any, **kwargs: Any) -> Any:
            if stored is not None:
                out = stored(args, kwargs)
                if out is not compat.MISS:
                    return out
            if direct is not None:
                out = direct(args, kwargs)
                if out is not compat.MISS:
                    return out
            if mark is not None:
                mark(args, kwargs)
            try:
                return call(args, kwargs)
            except Exception as exc:
                grad = torch.is_grad_enabled()
                failure = compat.data_dependent_failure(exc) if data_dependent[grad] else None
                if failure is None:
                    raise
            # Tracing an unbacked size failed (in Dynamo, in AOTAutograd, in a library's backward
            # formula): from now on this function is captured without data_dependent in this grad
            # mode, where the data-dependent operator breaks the graph and runs eagerly.
            settings[grad], data_dependent[grad] = dynamo_settings(False), False
            context.record_graph_break(f"capture.data_dependent: tracing a data-dependent size failed ({failure}) "
                                       f"with grad {'enabled' if grad else 'disabled'}; captured again in that "
                                       f"mode with data-dependent operators breaking the graph")
            return call(args, kwargs)

        return run


def _dim_marker(fn: Callable, dims: dict[str, list[int]], unknown: str = "error") -> Callable[[tuple, dict], None]:
    """``mark(args, kwargs)``: Dynamo's maybe_mark_dynamic on the declared dims of the call's
    tensors, found by parameter name in ``fn``'s signature (a module's forward) or by position;
    a name the signature lacks is an error unless ``unknown`` is ``"ignore"``."""
    signature = inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn)
    names = [p.name for p in signature.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    where = []
    for key, marked in dims.items():
        if key.isdigit():
            where.append((int(key), None, marked))
        elif key in signature.parameters:
            where.append((names.index(key) if key in names else None, key, marked))
        elif unknown != "ignore":
            owner = getattr(fn, "__name__", type(fn).__name__)
            raise PipelineError(f"capture.dynamic_dims: {key!r} is not a parameter of {owner}"
                                f"{did_you_mean(key, list(signature.parameters))}")

    def mark(args: tuple, kwargs: dict) -> None:
        for position, name, marked in where:
            value = args[position] if position is not None and position < len(args) else kwargs.get(name)
            if isinstance(value, torch.Tensor):
                for dim in marked:
                    if -value.dim() <= dim < value.dim():
                        compat.mark_dynamic(value, dim % value.dim())
    return mark


def _module_caller(module: torch.nn.Module) -> Callable:
    """A plain function calling the module: Dynamo skips frames whose code lives in torch.nn (for
    example ``nn.Sequential.forward``), but traces into modules called from user-level code."""

    def call_module(*args: Any, **kwargs: Any) -> Any:
        return module(*args, **kwargs)

    # One code object per compiled module (see with_own_code): separately compiled modules share
    # neither Dynamo's cache and recompile count nor its automatic-dynamic shape state.
    return with_own_code(call_module, f"compiled_{type(module).__name__}")


def _graph_break_message(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = text.splitlines()
    summary = lines[0] if lines else type(exc).__name__
    where = ""
    if "from user code:" in text:
        where = text.split("from user code:", 1)[1].split("Set TORCHDYNAMO_VERBOSE")[0].strip()
    return ("capture found a graph break, but the plan sets capture.fullgraph: true.\n"
            f"  reason: {summary}\n"
            + (f"  where:\n    {where}\n" if where else "")
            + "Fix that line (keep tensor-dependent decisions on the device, e.g. torch.where instead of "
              "`if tensor.item()`), or set capture.fullgraph: false to allow graph breaks.")


def _recompile_message(exc: BaseException, opts: CaptureOptions) -> str:
    text = " ".join(str(exc).split())
    return (f"capture refused to recompile (recompile_limit {opts.recompile_limit}): "
            f"{text}. A guard failed for a new input; declare the changing dimension dynamic "
            f"(capture.dynamic or torch._dynamo.mark_dynamic), pass changing scalars as tensors, or "
            f"raise capture.recompile_limit.")


class _ExportRunner:
    """Exports on the first call and re-exports (counted as a recompile) when input shapes,
    dtypes or devices change, up to the recompile limit."""

    def __init__(self, fn: Callable, compile_graph: GraphCompiler, context: CaptureContext,
                 opts: CaptureOptions):
        self.fn = fn
        self.compile_graph = compile_graph
        self.context = context
        self.opts = opts
        self.variants: dict[tuple, Callable] = {}

    def stance(self) -> str:
        """The stance in force: one set by the caller (``pipeline.stance``, ``shapes.after_warmup``)
        wins over the plan's ``capture.stance``, as under Dynamo."""
        current = compat.current_stance()
        return current if current != "default" else self.opts.stance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stance() == "force_eager":
            return self.fn(*args, **kwargs)
        if torch.is_grad_enabled() and _wants_grad(self.fn, args, kwargs):
            raise PipelineError(
                "capture.frontend: export compiles inference graphs only, and this call needs gradients. "
                "Call the model under torch.no_grad() / torch.inference_mode(), or use "
                "capture.frontend: dynamo for training.")
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        key = (spec, tuple(_meta_key(v) for v in flat))
        compiled = self.variants.get(key)
        if compiled is None:
            with compat.compile_lock():      # export traces with process-wide state, as Dynamo does
                compiled = self._compile(key, args, kwargs, flat)
            if compiled is None:
                return self.fn(*args, **kwargs)
        out = compiled(*[v for v in flat if isinstance(v, torch.Tensor)])
        return torch.utils._pytree.tree_unflatten(list(out), self.out_spec)

    def _compile(self, key: tuple, args: tuple, kwargs: dict, flat: list) -> Callable | None:
        if self.variants:
            reason = "input metadata changed: " + _describe_change(next(iter(self.variants)), key)
            stance = self.stance()
            if stance == "fail_on_recompile":
                raise RecompileError(f"capture (export) refused to recompile under stance "
                                     f"'fail_on_recompile': {reason}")
            if stance == "eager_on_recompile":
                return None
            if len(self.variants) >= self.opts.recompile_limit + self.context.planned_variants:
                message = (f"capture (export) hit recompile_limit {self.opts.recompile_limit}: {reason}")
                if self.opts.on_recompile_limit == "error":
                    raise RecompileError(message)
                import warnings
                warnings.warn(f"pipeline: {message}; running eagerly", stacklevel=3)
                return None
            self.context.record_recompile(reason)
        try:
            exported = compat.export_graph(self.fn, args, kwargs, strict=self.opts.strict)
        except Exception as exc:  # noqa: BLE001 - export's own message says which op or line
            raise GraphBreakError(
                f"torch.export could not capture the model as one graph (capture.frontend: export): "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:2000]}\n"
                f"Use capture.frontend: dynamo to allow graph breaks.") from None
        tensors = [v for v in flat if isinstance(v, torch.Tensor)]
        graph, out_spec = _flat_graph(exported, args, kwargs, tensors)
        self.out_spec = out_spec
        compiled = self.compile_graph(graph, compat.as_fake(tensors, _new_fake_mode()))
        self.variants[key] = compiled
        return compiled


def _wants_grad(fn: Callable, args: tuple, kwargs: dict) -> bool:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    if any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves):
        return True
    return isinstance(fn, torch.nn.Module) and any(p.requires_grad for p in fn.parameters())


def _meta_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
    return ("value", repr(value))


def _describe_change(old: tuple, new: tuple) -> str:
    for index, (a, b) in enumerate(zip(old[1], new[1])):
        if a != b:
            return f"input {index} was {a[1:]} and is now {b[1:]}"
    return "input structure changed"


def _new_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _flat_graph(exported: torch.fx.GraphModule, args: tuple, kwargs: dict, tensors: list):
    """Retrace the exported module into a graph taking the flat tensor inputs and returning a
    flat tuple, the calling convention every graph pass sees."""
    from torch.fx.experimental.proxy_tensor import make_fx
    box: dict = {}

    def flat_fn(*flat_tensors):
        it = iter(flat_tensors)
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        rebuilt = [next(it) if isinstance(v, torch.Tensor) else v for v in flat]
        a, k = torch.utils._pytree.tree_unflatten(rebuilt, spec)
        out = exported(*a, **k)
        leaves, box["spec"] = torch.utils._pytree.tree_flatten(out)
        return tuple(leaves)

    with torch.no_grad():
        graph = make_fx(flat_fn, tracing_mode="real")(*tensors)
    return graph, box["spec"]
