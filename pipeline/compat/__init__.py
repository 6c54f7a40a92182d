"""The one place that touches private torch APIs (Dynamo, AOTAutograd, make_fx, fake tensors,
decomposition tables). Tested on torch 2.11 (GPU machine) and 2.13 (CPU machines); the next torch
release should be a change to this package alone: this file, :mod:`pipeline.compat.dynamo` (the
Dynamo settings part), :mod:`pipeline.compat.tracing` (fake tensors and re-tracing) and
:mod:`pipeline.compat.shapes`, whose public names it re-exports, and
:mod:`pipeline.compat.precompile` (captures stored through torch's ahead-of-time compile), which
callers import by name."""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

import torch
import torch.fx

from pipeline.compat.dynamo import (  # noqa: F401  (re-exported: callers import one compatibility module)
    DIRECT_STANCES, MISS, STANCES, DirectCall, DynamoSettings, ReusableStance, backend_failure_types, compile_lock,
    data_dependent_failure,
    mark_dynamic, current_stance, dynamo_compile, graph_break_counts, is_refused_recompile, logger_functions, logging_can_be_ignored,
    max_variants_per_function, recompile_error_types, recompile_limit_hit_count, recompile_limit_hits,
    reset_dynamo, stance, unsupported_error_types)
from pipeline.compat.tracing import (  # noqa: F401  (re-exported)
    as_fake, backend_inputs, example_value, fake_mode_of, has_effect, is_fake, restart_exceptions, retrace,
    tensorify_python_scalars, traced_as_one_call, tracing_now)
from pipeline.compat.shapes import (  # noqa: F401  (re-exported)
    guards_suppressed, is_backed, known_equal, rebuild_symbolic_metadata, replay_shape_guards, same_sizes, shape_facts,
    shape_guard_count, shape_guards_since)

TORCH_VERSION = torch.__version__


def capturing_cuda_graph() -> bool:
    """Whether the current CUDA stream is recording a CUDA graph."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()



# -- operators and decomposition tables --------------------------------------------------------
def resolve_op(name: str):
    """``"aten.addmm"`` or ``"aten.addmm.default"`` to the operator object, or None if unknown."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    namespace = getattr(torch.ops, parts[0], None)
    if namespace is None:
        return None
    try:
        packet = getattr(namespace, parts[1])
    except (AttributeError, RuntimeError):
        return None
    if len(parts) == 2:
        return packet
    try:
        return getattr(packet, parts[2]) if len(parts) == 3 else None
    except (AttributeError, RuntimeError):
        return None


def overloads_of(op: Any) -> list:
    """Every overload of an operator packet, or the overload itself."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, o) for o in op.overloads()]
    return [op]


def core_aten_table() -> dict:
    """torch's core-ATen decomposition table (about 940 entries on torch 2.13)."""
    from torch._decomp import core_aten_decompositions
    return dict(core_aten_decompositions())


def decompositions_for(ops: list) -> dict:
    """Entries of torch's global decomposition registry for ``ops`` (packets or overloads);
    ops without a registered decomposition are simply absent from the result."""
    from torch._decomp import get_decompositions
    return dict(get_decompositions(ops))


def op_name(target: Any) -> str:
    """``aten.add.Tensor`` style name of a node target (falls back to its qualified name)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target._qualified_op_name.replace('::', '.')}"
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__name__', repr(target))}".lstrip(".")


def is_view_op(target: Any) -> bool:
    """True for ATen operators whose result aliases their first argument (select, slice, view...)."""
    return isinstance(target, torch._ops.OpOverload) and bool(getattr(target, "is_view", False))


def is_mutating(target: Any) -> bool:
    """True for operators that write into an argument (in-place and out= variants)."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.is_mutable
    name = getattr(target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def is_nondeterministic(target: Any) -> bool:
    """True for random or otherwise non-repeatable operators (never merged or folded)."""
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return True
    name = getattr(target, "__name__", "")
    return name in {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "dropout",
                    "bernoulli", "multinomial", "normal", "randperm", "native_dropout"}


# -- AOTAutograd -------------------------------------------------------------------------------
def aot_compile(gm: torch.fx.GraphModule, example_inputs: list, *, forward: Callable,
                backward: Callable, partition: Callable | None = None,
                inference: Callable | None = None) -> Callable:
    """Trace the joint forward/backward graph with AOTAutograd and compile each half with the
    given compilers (``compiler(graph, example_inputs) -> callable taking *args``).
    ``inference`` compiles the graph instead when AOTAutograd finds that no output needs a
    gradient after all (then there is no joint graph and no backward).

    ``partition(joint, flat_inputs, num_primals, num_forward_outputs) -> (forward, backward)``
    replaces torch's default partitioner. ``joint`` takes its inputs flat (primals, then
    tangents; placeholders named ``primals_N`` and ``tangents_N``) and returns the forward's
    outputs followed by one gradient (or None) per primal. The halves follow AOTAutograd's
    contract: the forward takes the primals and returns its outputs, then the tensors saved for
    the backward, then saved SymInts; the backward takes the saved SymInts, the saved tensors,
    then every tangent, and returns one gradient (or None) per primal."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch._aot_autograd.utils import make_boxed_func

    def boxed(compiler: Callable) -> Callable:
        # Never traced by Dynamo: a backward compiles lazily, at the first backward call, and
        # that call can come from code Dynamo is running (``torch.autograd.grad`` inside a
        # compiled function), where Dynamo would otherwise trace our compiler as user code.
        @torch._dynamo.disable
        def compile_boxed(graph: torch.fx.GraphModule, inputs: list) -> Callable:
            # AOTAutograd calls its compilers inside its fake mode; ours run as the inference
            # path does, outside it (passes enter the fake mode of their example inputs).
            with real_tensors():
                compiled = compiler(graph, list(inputs))
            return boxed_form(compiled) or make_boxed_func(compiled)
        return compile_boxed

    extra: dict = {}
    if partition is not None:
        def partition_fn(joint: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                         **_: Any) -> tuple:
            flat = list(torch.utils._pytree.tree_leaves(joint_inputs))
            # AOTAutograd's joint takes ([primals], [tangents]) through a pytree calling
            # convention; passes see (and re-trace) a graph that takes its inputs flat.
            joint.graph._codegen = torch.fx.graph.CodeGen()
            joint.recompile()
            return partition(joint, flat, len(joint_inputs[0]), num_fwd_outputs)
        extra["partition_fn"] = partition_fn
    if inference is not None and "inference_compiler" in inspect.signature(aot_module_simplified).parameters:
        extra["inference_compiler"] = boxed(inference)
    # Counted as torch's own AOTAutograd backends count: DDPOptimizer (DistributedDataParallel's
    # graph split at bucket boundaries) reads this counter to learn that a bucket's graph went
    # through AOTAutograd, so that it takes the fake first call AOTAutograd returns then and keeps
    # each bucket's forward metadata for its backward; uncounted, that fake output reaches the user.
    from torch._dynamo.utils import counters
    counters["aot_autograd"]["total"] += 1
    return aot_module_simplified(gm, example_inputs, fw_compiler=boxed(forward),
                                 bw_compiler=boxed(backward), keep_inference_input_mutations=True,
                                 **extra)


def boxed_form(compiled: Callable) -> Callable | None:
    """``compiled`` under AOTAutograd's boxed calling convention (a function of one list of inputs,
    which it may empty) when it is the bound ``forward`` of a module that also offers
    ``boxed_forward(args)``; else None. A backward called boxed can free each saved tensor at its
    last use, where ``compiled(*args)`` would keep all of them alive until it returns."""
    owner = getattr(compiled, "__self__", None)
    run = getattr(owner, "boxed_forward", None)
    if run is None or getattr(compiled, "__name__", None) != "forward":
        return None

    def call_boxed(args: list) -> Any:
        return run(args)
    call_boxed._boxed_call = True     # AOTAutograd's mark: hand over the list, do not unpack it
    return call_boxed


def rename_placeholders(gm: torch.fx.GraphModule, names: list[str]) -> None:
    """Give the graph's placeholders these names (and targets), in order: a re-traced joint graph
    gets ``arg0_1``-style names, and torch's partitioners tell primals from tangents by name."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if [n.name for n in placeholders] == list(names):
        return
    for node, name in zip(placeholders, names):
        node.target = name
        node._rename(name)
    gm.recompile()


def torch_partition(joint: torch.fx.GraphModule, flat_inputs: list, *, num_primals: int,
                    num_forward_outputs: int, strategy: str,
                    memory_budget: float | None = None) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Split a joint graph with one of torch's partitioners: ``default`` (save what the forward
    computed and the backward reads) or ``min-cut`` (min_cut_rematerialization_partition, which
    recomputes cheap ops to cut saved bytes; ``memory_budget`` is torch's
    ``activation_memory_budget``, a fraction of the save-everything activation memory).

    A joint graph our passes re-traced has lost AOTAutograd's forward/backward tags; they are
    restored from the data flow (forward: what the forward outputs and input updates need)."""
    from torch._functorch import config as functorch_config
    from torch._functorch import partitioners
    _tag_joint(joint, num_forward_outputs)
    inputs = [flat_inputs[:num_primals], flat_inputs[num_primals:]]
    if strategy == "default":
        return partitioners.default_partition(joint, inputs, num_fwd_outputs=num_forward_outputs)
    if strategy != "min-cut":
        raise ValueError(f"unknown torch partitioner '{strategy}' (default, min-cut)")
    patch = {} if memory_budget is None else {"activation_memory_budget": float(memory_budget)}
    with functorch_config.patch(patch):
        return partitioners.min_cut_rematerialization_partition(
            joint, inputs, compiler="inductor", num_fwd_outputs=num_forward_outputs)


def _tag_joint(joint: torch.fx.GraphModule, num_forward_outputs: int) -> None:
    nodes = list(joint.graph.nodes)
    if any("partitioner_tag" in n.meta for n in nodes if n.op != "output"):
        return
    output = nodes[-1]
    roots = [a for a in output.args[0][:num_forward_outputs] if isinstance(a, torch.fx.Node)]
    roots += [n for n in nodes if n.op == "call_function" and is_mutating(n.target)
              and not any(_is_tangent_name(a) for a in n.all_input_nodes)]
    forward: set = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in forward:
            continue
        forward.add(node)
        stack.extend(node.all_input_nodes)
    for node in nodes:
        if node.op == "placeholder":
            node.meta["partitioner_tag"] = "is_backward" if _is_tangent_name(node) else "is_forward"
        elif node.op != "output":
            node.meta["partitioner_tag"] = "is_forward" if node in forward else "is_backward"


def _is_tangent_name(node: torch.fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


# -- torch.export ------------------------------------------------------------------------------
def export_graph(fn: Callable, args: tuple, kwargs: dict, *, strict: bool) -> torch.fx.GraphModule:
    """``torch.export`` a module (or function wrapped in one) and return its callable graph module,
    which takes the same arguments as ``fn``."""
    module = fn if isinstance(fn, torch.nn.Module) else _FunctionModule(fn)
    program = torch.export.export(module, args, kwargs or None, strict=strict)
    return program.module()


class _FunctionModule(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def current_compile_id() -> tuple[int, int] | None:
    """(frame id, compile index of that frame) of the Dynamo compile in progress, or None.
    A compile index above 0 means the frame is being recompiled."""
    from torch._guards import CompileContext
    cid = CompileContext.current_compile_id()
    if cid is None:
        return None
    return (cid.frame_id, cid.frame_compile_id)


def guard_failure_counts() -> dict[Any, int]:
    """How many guard failures Dynamo has recorded per code object (process-wide)."""
    from torch._dynamo.utils import guard_failures
    return {code: len(reasons) for code, reasons in guard_failures.items()}


def new_guard_failures(before: dict[Any, int]) -> list[str]:
    """Guard-failure reasons recorded since the ``before`` snapshot."""
    from torch._dynamo.utils import guard_failures
    out = []
    for code, reasons in guard_failures.items():
        out.extend(str(r) for r in reasons[before.get(code, 0):])
    return out


def recompile_reason(reasons: list[str], frame_id: int) -> str | None:
    """Of the guard failures a recompile of frame ``frame_id`` produced (one per compiled variant
    it already had, each starting with that variant's ``frame/compile`` id), the failure of the
    newest variant: the guard that this call's change broke. Older variants fail on older guards
    (the first call's sizes, say), which are not why this call recompiled."""
    best: tuple[int, str] | None = None
    for reason in reasons:
        head = reason.split(":", 1)[0].strip()
        parts = head.split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) != frame_id:
            continue
        if best is None or int(parts[1]) > best[0]:
            best = (int(parts[1]), reason)
    return best[1] if best is not None else None


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Run real computations even while a compile's fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        yield


def fake_copies(values: list) -> list:
    """Fake tensors (in a fresh fake mode) with the metadata of ``values``; other values as they are."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in values]


# -- what Dynamo knows about a captured graph (reports, explain) --------------------------------
def capture_details(gm: torch.fx.GraphModule) -> dict | None:
    """Why Dynamo ended this graph (reason text, whether it is a graph break, the user source
    lines), the guards it is installing for it, and the source of each input. None when ``gm``
    was not handed over by Dynamo (``torch.export``, tests)."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None:
        return None
    where = [{"file": frame.filename, "line": frame.lineno, "code": (frame.line or "").strip()}
             for frame in getattr(reason, "user_stack", None) or []]
    return {
        "reason": str(getattr(reason, "reason", "")),
        "graph_break": bool(getattr(reason, "graph_break", False)),
        "where": where,
        "guards": _current_guards(),
        "inputs": _input_sources(gm),
    }


def _current_guards() -> list[dict]:
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    guards = getattr(getattr(context, "guards_context", None), "dynamo_guards", None)
    if guards is None:
        return []
    out = []
    for guard in guards:
        try:
            kind = guard.create_fn_name()
        except Exception:  # noqa: BLE001 - a guard without a builder name is still listed
            kind = "?"
        out.append({"source": str(guard.name), "kind": str(kind)})
    out.sort(key=lambda g: (g["source"], g["kind"]))
    return out


def _input_sources(gm: torch.fx.GraphModule) -> list[dict]:
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        arg = node.meta.get("grapharg")
        source = getattr(arg, "source", None)
        name = getattr(source, "name", None)
        name = name() if callable(name) else name
        value = node.meta.get("example_value")
        entry: dict = {"source": str(name) if name is not None else node.name}
        if isinstance(value, torch.Tensor):
            entry["shape"] = [d if isinstance(d, int) else str(d) for d in value.shape]
            entry["dtype"] = str(value.dtype).removeprefix("torch.")
            entry["dynamic"] = any(not isinstance(d, int) for d in value.shape)
        elif isinstance(value, torch.SymInt):
            entry["symbol"] = str(value)
        out.append(entry)
    return out


def fake_propagate(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """Fill ``node.meta['val']`` of every node from fake copies of ``example_inputs`` (how a graph
    loaded from a reproducer gets the metadata passes read); returns those fake inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in example_inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return fakes


def static_tensor_metadata(gm: torch.fx.GraphModule) -> list[dict] | None:
    """Shape, stride, dtype and device of each placeholder's ``meta['val']``, or None when one is
    not a tensor of static sizes (what :func:`propagate_metadata` can rebuild)."""
    out = []
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        sizes = [*val.shape, *val.stride()]
        if not all(type(s) is int for s in sizes):
            return None
        out.append({"shape": list(val.shape), "stride": list(val.stride()), "dtype": str(val.dtype).split(".")[-1],
                    "device": str(val.device)})
    return out


def propagate_metadata(gm: torch.fx.GraphModule, metadata: list[dict], like: list) -> None:
    """Fill ``node.meta['val']`` of every node of ``gm`` (a graph rebuilt from the cache, which
    keeps no metadata) from placeholders described by :func:`static_tensor_metadata`, in the
    fake mode of the tensors ``like`` (AOTAutograd reads these values after its partitioner)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = fake_mode_of(like)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty_strided(m["shape"], m["stride"], dtype=getattr(torch, m["dtype"]),
                                     device=torch.device(m["device"])) for m in metadata]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)


def size_hint(value: Any) -> Any:
    """A concrete int for a (possibly symbolic) size: the value Dynamo saw for a symbol."""
    if isinstance(value, torch.SymInt):
        hint = getattr(value.node, "hint", None)
        return int(hint) if hint is not None else None
    return value


def _guards_entry(name: str) -> Callable | None:
    """A private C++ entry point of Dynamo's guards module (the ones Inductor's generated code
    calls), or None when this torch lacks it."""
    return getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), name, None)


def reinterpret_tensor() -> Callable | None:
    """``f(base, sizes, strides, offset_increment)``: an alias of ``base``'s storage with that layout,
    storage offset ``base.storage_offset() + offset_increment``, without the view bookkeeping of
    ``as_strided`` (no ``_base``, no autograd view tracking; about half its cost per call). The
    private C++ entry point Inductor's generated code also uses; None when this torch lacks it."""
    return _guards_entry("_reinterpret_tensor")


def _fast_empty(device: str) -> Callable:
    """``f(sizes, strides, dtype)``: an uninitialized tensor of that layout on ``device`` ("cpu", or
    "cuda": the current device), through torch's private C++ fast path when present, the public
    call otherwise."""
    fast_empty = _guards_entry(f"_empty_strided_{device}")
    if fast_empty is None:
        def fast_empty(size, stride, dtype):
            return torch.empty_strided(size, stride, dtype=dtype, device=device)
    return fast_empty


def cuda_launch_helpers() -> tuple[Callable, Callable]:
    """(current CUDA device index, allocate an uninitialized CUDA tensor on the current device
    from sizes, strides and dtype): the cheapest entry points this torch has for a generated
    launcher's hot path (torch's private C++ fast paths when present, public calls otherwise)."""
    get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    return get_device, _fast_empty("cuda")


def empty_strided_cpu() -> Callable:
    """``f(sizes, strides, dtype)``: an uninitialized CPU tensor of that layout, through torch's
    private C++ fast path when present (cheaper per call than ``torch.empty_strided``; what
    Inductor's generated CPU code allocates with), the public call otherwise."""
    return _fast_empty("cpu")


def storage_use_count() -> Callable | None:
    """``f(storage)``: how many references the C++ storage behind ``storage`` (an
    ``UntypedStorage``) has: tensors, views and storage objects alike, whether or not Python
    still sees them (a tensor autograd saved for a backward counts). None when this torch lacks
    the private entry point (CUDA-graph trees use the same one)."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return None
    return lambda storage: counter(storage._cdata)


class StorageHandout:
    """Storages that alias another storage's memory without owning it, handed to callers and later
    made unreadable (what CUDA-graph trees do with the outputs of a replay the next one overwrites):
    reading through an invalidated storage, or any view of it, raises with the given message.
    Through torch's private entry points; :func:`storage_handout` is None where they are missing."""

    def __init__(self, construct: Callable, invalidate: Callable):
        from torch.multiprocessing.reductions import StorageWeakRef
        self._construct, self._invalidate, self._weak_ref = construct, invalidate, StorageWeakRef

    def alias(self, storage: torch.UntypedStorage) -> tuple[torch.UntypedStorage, Any]:
        """A new storage on ``storage``'s memory, and a weak reference to it for :meth:`invalidate`."""
        alias = self._construct(storage.data_ptr(), storage.device, storage.nbytes())
        return alias, self._weak_ref(alias)

    def invalidate(self, ref: Any, message: str) -> bool:
        """Make the storage behind ``ref`` unreadable if something still holds it (True then)."""
        if ref.expired():
            return False
        self._invalidate(ref.cdata, message)
        return True


def storage_handout() -> StorageHandout | None:
    """A :class:`StorageHandout`, or None when this torch lacks the entry points (CPU-only builds
    lack the invalidation)."""
    construct = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    invalidate = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
    if construct is None or invalidate is None:
        return None
    return StorageHandout(construct, invalidate)
