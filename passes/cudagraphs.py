"""``cudagraphs``: run a whole compiled graph as one CUDA-graph replay.

The graph becomes one node calling a :class:`CudaGraphRunner`. On the first call the runner runs
the graph eagerly (its result is that call's result; lazy initialisation such as cuBLAS
workspaces happens here, outside any graph), then records it into a ``torch.cuda.CUDAGraph``
drawing on one memory pool shared by every graph of the process (per device). Later calls
replay it: one launch for the whole graph, instead of one per kernel and extern call.

Inputs:
- parameters and buffers (the tensors Dynamo marks as static inputs) are used in place: the
  graph reads and writes their memory directly, nothing is copied; if one is replaced by a tensor
  at another address, the graph is recorded again (noted in the report);
- every other input is copied into a static buffer the graph reads (skipped when the caller
  passes that buffer itself), and an input the graph writes to is copied back after the replay.

Outputs are cloned by default. With ``clone_outputs: false`` (torch's reduce-overhead contract) the
caller receives aliases of the graph's own output buffers, valid until the graph replays again;
then what the caller still holds of them raises on access, naming the graph
(:mod:`passes.cudagraph_outputs`). Such a graph records into a memory pool of its own.

A graph with symbolic sizes is recorded once per size it is called at: a :class:`SizedCudaGraphs`
keeps one runner per set of values of the symbolic sizes, up to ``max_sizes`` (calls at further
sizes run the graph without CUDA graphs, noted once); each recording is noted with its sizes.

A graph is not recorded, with the reason in the report (``cudagraphs`` topic), when an input or an
operation is on the CPU, when its role is not in ``roles`` (training
graphs, ``forward`` and ``backward``, only when the plan lists them), or when recording fails;
``required: true`` turns each of these into an error.

Static buffers span the input's storage from its offset to the storage's end when that is at most
twice the tensor's own span: a slice of a padded matmul result keeps its row padding, which the
pitched kernels (:mod:`passes.codegen.triton.pitch`) read past each row.

Training graphs (``roles: [inference, forward, backward]``): AOTAutograd calls the compiled forward
inside its autograd function and the backward from the autograd engine; both are recorded on
their first call like any graph. Parameters are used in place. The backward *lends* the
gradients it returns (aliases of its recorded output buffers, which the autograd engine moves
into ``.grad`` without a copy); a backward called while last step's gradients are still
referenced (accumulated over several steps, or cleared with ``zero_grad(set_to_none=False)``)
runs without replaying, into new memory. The tensors the forward saves for the backward are
*lent* too, not cloned: the
forward hands out aliases of its recorded output buffers, and a graph recorded with such a buffer
as an input (the backward) reads it in place, with no copy on either side. Before each replay the
forward checks that nothing still references the buffers it lent last time (the storages'
reference counts are back to the recording's own); when something does (a second forward before
the first one's backward, or a graph kept with ``retain_graph``), that call runs the graph without
replaying it, into new memory, and so does a backward handed those new tensors. Both are noted in
the report. This needs the split pass to say which outputs are saved
(:attr:`~pipeline.graph_pass.PassContext.forward_outputs`); without it they are cloned.
"""
from __future__ import annotations

import threading
import weakref
from html import escape
from typing import Any, Literal

import attrs
import torch
import torch.fx

from pipeline import Metric, Outcome, Pass, PassContext, compat, get_logger, option, positive
from pipeline.errors import PipelineError
from passes.cudagraph_outputs import HandOuts, supported as handouts_supported
from passes.kernel_ir.groups import meta_of
from pipeline.ir import is_static_input
from pipeline.options import unstructure
from pipeline.tools.report_html import none, table

aten = torch.ops.aten

# Operations that synchronize with the host or have data-dependent output shapes: not recordable.
UNRECORDABLE = {"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select",
                "aten.unique", "aten._unique2", "aten.repeat_interleave"}


class CudaGraphsError(PipelineError):
    """A graph could not run under CUDA graphs and the plan says ``cudagraphs: {required: true}``."""


def _roles_known(values: list[str]) -> str | None:
    bad = [v for v in values if v not in ("inference", "forward", "backward")]
    return f"unknown role(s) {bad}; use inference, forward or backward" if bad else None


@attrs.frozen
class CudaGraphsOptions:
    clone_outputs: bool = option(
        True, "Return copies of the graph's outputs. Off (torch's reduce-overhead contract): return aliases "
              "of the recorded output buffers, valid until the same graph replays again; reading one "
              "after that raises, naming the graph. Not for training graphs (gradients are kept).")
    required: bool = option(
        False, "A graph that cannot be recorded is an error (naming the reason) instead of running "
               "without CUDA graphs.")
    warmup_runs: int = option(1, "Eager runs of the graph before it is recorded (all but the last on copies "
                                 "of the inputs the graph writes to).", check=positive)
    roles: list[str] = option(
        ["inference"], "Graph roles recorded: inference, and for training steps forward and backward "
                       "(the backward reads the activations the forward saves in the forward's recorded "
                       "memory; the step's results and the gradients are cloned).",
        check=_roles_known)
    max_sizes: int = option(8, "Graphs with symbolic sizes: recordings kept per graph, one per size seen; "
                               "calls at further sizes run without CUDA graphs.", check=positive)


def _packet(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}"
    return ""


def static_skip_reason(graph: torch.fx.GraphModule, context: PassContext,
                       roles: tuple = ("inference",)) -> str | None:
    """Why this graph cannot be recorded, judged from its role, example inputs and nodes (None: it
    can)."""
    if context.role not in roles:
        return (f"{context.role} graphs are not recorded (cudagraphs.roles is {list(roles)}; add "
                f"{context.role} to record them)")
    for i, value in enumerate(context.example_inputs):
        if isinstance(value, torch.Tensor) and value.device.type != "cuda":
            return f"input {i} is a {value.device.type} tensor"
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        name = _packet(node.target)
        if name in UNRECORDABLE:
            return f"{node.name} ({name}) synchronizes with the host or has a data-dependent shape"
        value = meta_of(node)
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor) and v.device.type != "cuda":
                return f"{node.name} ({name or node.target}) produces a {v.device.type} tensor"
    return None


def mutated_inputs(graph: torch.fx.GraphModule) -> list[int]:
    """Indices of placeholders an operation writes to (copy_, index_copy_, slice assignment...)."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    written = set()
    for node in graph.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            schema = node.target._schema
            for arg, value in zip(schema.arguments, node.args):
                if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node):
                    while compat.is_view_op(getattr(value, "target", None)):   # a write into a view of an input
                        value = value.args[0]
                    written.add(value)
    return [i for i, p in enumerate(placeholders) if p in written]


def clone_output(value: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes and strides. A strided output that nearly fills its memory span (a
    matmul result sliced back from padded columns) is copied as that whole span, one dense and
    vectorized copy, instead of element by element."""
    if value.is_contiguous() or value.numel() == 0 or any(s < 0 for s in value.stride()):
        return value.clone()
    reach = 1
    for stride, size in sorted((s, n) for s, n in zip(value.stride(), value.shape) if n > 1):
        if stride < reach:                  # overlapping or interleaved dimensions
            return value.clone()
        reach = stride * size
    span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride()))
    if span > value.numel() * 1.25:
        return value.clone()
    flat = value.as_strided((span,), (1,)).clone()
    return flat.as_strided(value.shape, value.stride())


def static_buffer(value: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` with its sizes and strides, in memory that also spans what the value's
    storage holds past it (up to twice the value's own span): a pitched kernel reading a padded
    row's padding finds memory there, as it does in the input (the padding's values are never
    used, so it is left uninitialized)."""
    shape, stride = tuple(value.shape), tuple(value.stride())
    if value.numel() and all(s >= 0 for s in stride):
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        tail = value.untyped_storage().nbytes() // value.element_size() - value.storage_offset()
        if span < tail <= 2 * span:
            flat = torch.empty(tail, dtype=value.dtype, device=value.device)
            return flat.as_strided(shape, stride).copy_(value)
    return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device).copy_(value)


_use_count = compat.storage_use_count()
# data_ptr of each output buffer a forward lends -> that forward's runner (see the module docstring).
_lent: dict[int, Any] = {}
_pools: dict[int, Any] = {}
_pool_lock = threading.Lock()


def shared_pool(device: int) -> Any:
    """The memory pool every recorded graph of this process on ``device`` draws from."""
    with _pool_lock:
        if device not in _pools:
            _pools[device] = torch.cuda.graph_pool_handle()
        return _pools[device]


class CudaGraphRunner:
    """Runs one graph by replaying its CUDA-graph recording (see the module docstring)."""

    def __init__(self, graph: torch.fx.GraphModule, options: CudaGraphsOptions, context: PassContext,
                 mutated: list[int], handouts: HandOuts | None = None):
        self.graph = graph
        self.options = options
        self.context = context
        self.mutated = mutated
        self.recording: torch.cuda.CUDAGraph | None = None
        self.disabled: str | None = None
        self.static: dict[int, int] = {}        # input index -> data_ptr used in place
        self.borrowed: dict[int, int] = {}      # input index -> data_ptr of a buffer another graph lends
        self.buffers: dict[int, torch.Tensor] = {}   # input index -> static copy the graph reads
        self.outputs: tuple = ()
        self.returns: tuple = ()                # per output: "clone", "lend" or "as is"
        self.lent: list[tuple[Any, int]] = []   # (storage, its reference count when nothing is lent)
        self.replays = 0
        self.unreplayed = 0
        self._noted: set[str] = set()
        # A training forward lends its saved tensors, a backward its gradients (from output 0).
        lends = options.clone_outputs and _use_count is not None and (
            context.role == "backward" or context.role == "forward" and context.forward_outputs is not None)
        self.lend_from = (0 if context.role == "backward" else context.forward_outputs) if lends else None
        hands_out = not options.clone_outputs and handouts_supported()
        self.handouts = (handouts or HandOuts(context.graph_id)) if hands_out else None

    @property
    def __name__(self) -> str:
        return "cudagraph_replay"

    def to_data(self, codec: Any) -> dict:
        """What the compile cache and artifacts keep: the graph and the recording policy. The CUDA
        graph itself is recorded again on the rebuilt runner's first call."""
        return {"graph": codec.subgraph_to_data(self.graph, "cudagraph"), "options": unstructure(self.options),
                "mutated": list(self.mutated)}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "CudaGraphRunner":
        """A runner for the stored graph, not recorded yet, noting into the compile's context."""
        if codec.context is None:
            from pipeline.cache.graph_io import UnsupportedGraph
            raise UnsupportedGraph("a CUDA-graph runner is rebuilt only inside a compile (it notes into its context)")
        options = CudaGraphsOptions(**data["options"])
        return cls(codec.subgraph_from_data(data["graph"]), options, codec.context, list(data["mutated"]))

    @property
    def wrapped_graph(self) -> torch.fx.GraphModule:
        """The graph this runner records and replays (what reports and kernel counts look into)."""
        return self.graph

    def __repr__(self) -> str:
        return f"<CUDA-graph runner ({'disabled: ' + self.disabled if self.disabled else 'recorded' if self.recording else 'not recorded yet'})>"

    def __call__(self, *args: Any) -> Any:
        if self.recording is None or self.disabled:
            if self.disabled:
                return self.graph(*args)
            return self._record(args)
        for index, pointer in self.static.items():
            if args[index].data_ptr() != pointer:
                self.context.note(f"input {index} (a parameter or buffer) moved to another address: "
                                  "recording the graph again", topic="cudagraphs")
                return self._record(args)
        for index, pointer in self.borrowed.items():
            if args[index].data_ptr() != pointer:
                if _lender(args[index]) is not None:
                    self.context.note(f"input {index} is now another recording's buffer: recording the "
                                      "graph again", topic="cudagraphs")
                    return self._record(args)
                return self._unreplayed(args, f"input {index} is not the buffer it was recorded with (its "
                                              "forward ran without replaying)")
        for storage, count in self.lent:
            if _use_count(storage) > count:
                return self._unreplayed(args, _STILL_REFERENCED[self.context.role])
        if self.handouts is not None:
            self.handouts.invalidate()
        for index, buffer in self.buffers.items():
            source = args[index]
            if source.data_ptr() != buffer.data_ptr():
                buffer.copy_(source)
        self.recording.replay()
        for index in self.mutated:
            if index in self.buffers and args[index].data_ptr() != self.buffers[index].data_ptr():
                args[index].copy_(self.buffers[index])
        self.replays += 1
        if self.handouts is not None:
            return self.handouts.hand_out(self.outputs, self.returns)
        if not self.options.clone_outputs:
            return self.outputs
        return tuple(clone_output(o) if how == "clone" else o.detach() if how == "lend" else o
                     for o, how in zip(self.outputs, self.returns))

    def _unreplayed(self, args: tuple, reason: str) -> Any:
        """Run the graph without its recording (into new memory) for this call."""
        if reason not in self._noted:
            self._noted.add(reason)
            self.context.note(f"a call ran without replaying the graph: {reason}", topic="cudagraphs")
        self.unreplayed += 1
        return self.graph(*args)

    def _skip(self, reason: str, args: tuple) -> Any:
        self.disabled = reason
        self.context.tags.discard("cudagraphs")
        self.context.set_metric("cudagraphs", False)
        self.context.note(f"not recorded: {reason}", topic="cudagraphs")
        if self.options.required:
            raise CudaGraphsError(f"graph {self.context.graph_id}: cudagraphs is required but {reason}")
        return self.graph(*args)

    def _record(self, args: tuple) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or any(t.device.type != "cuda" for t in tensors):
            return self._skip("an input is not a CUDA tensor at run time", args)
        device = tensors[0].device
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                # Only the last warm-up run writes the inputs the graph mutates: the earlier ones get
                # copies, so a call applies its writes (running statistics, cache entries) once.
                for _ in range(self.options.warmup_runs - 1):
                    self.graph(*[a.clone() if i in self.mutated else a for i, a in enumerate(args)])
                result = self.graph(*args)
            torch.cuda.current_stream().wait_stream(side)
            self.static = {i: a.data_ptr() for i, a in enumerate(args) if is_static_input(a)}
            self.borrowed = {i: a.data_ptr() for i, a in enumerate(args)
                             if isinstance(a, torch.Tensor) and i not in self.static and _lender(a) is not None}
            self.buffers = {i: static_buffer(a) for i, a in enumerate(args)
                            if isinstance(a, torch.Tensor) and i not in self.static and i not in self.borrowed}
            replay_args = [self.buffers.get(i, a) for i, a in enumerate(args)]
            recording = torch.cuda.CUDAGraph()
            try:
                pool = self.handouts.pool() if self.handouts is not None else shared_pool(device.index or 0)
                with torch.cuda.graph(recording, pool=pool):
                    outputs = self.graph(*replay_args)
            except Exception as exc:  # noqa: BLE001 - any failure to record is a recorded reason
                torch.cuda.synchronize(device)
                return self._skip(f"recording failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", args)
        self.recording, self.outputs = recording, tuple(outputs)
        self._plan_returns(args)
        self.context.note(f"recorded: {len(self.buffers)} input(s) copied into static buffers per call, "
                          f"{len(self.static)} parameter/buffer input(s) used in place"
                          + (f", {len(self.borrowed)} lent buffer(s) read in place" if self.borrowed else "")
                          + (f", {self.returns.count('lend')} {'gradient' if self.context.role == 'backward' else 'saved'}"
                             f" output(s) lent" if self.lent else "")
                          + ("" if self.options.clone_outputs else
                             "; outputs are aliases of the recorded buffers, overwritten by the next call"
                             + (" (then unreadable)" if self.handouts is not None else "")), topic="cudagraphs")
        if not self.lent:
            return result
        # This call's result comes from the warm-up run; the saved tensors go out in the lent buffers
        # already, so that the backward records reading those.
        for output, value, how in zip(self.outputs, result, self.returns):
            if how == "lend":
                output.copy_(value)
        return tuple(o.detach() if how == "lend" else r for o, r, how in zip(self.outputs, result, self.returns))

    def _plan_returns(self, args: tuple) -> None:
        """How each output is returned: saved tensors of a lending forward are lent (those in the
        graph's own memory are checked before each replay); with hand-outs, tensors in the graph's
        memory are handed out and those in a parameter's are returned as they are; other tensors
        are cloned."""
        for pointer in [p for p, owner in _lent.items() if owner() in (None, self)]:
            del _lent[pointer]
        static = {args[i].untyped_storage().data_ptr() for i in self.static}
        # A gradient in an input's memory (a tangent passed through) is cloned: only buffers the
        # recording itself allocates are lent from a backward.
        inputs = {a.untyped_storage().data_ptr() for a in (*args, *self.buffers.values())
                  if isinstance(a, torch.Tensor)} if self.context.role == "backward" else set()
        returns, storages = [], {}
        for index, value in enumerate(self.outputs):
            if not isinstance(value, torch.Tensor):
                returns.append("as is")
            elif self.handouts is not None:
                returns.append("as is" if value.untyped_storage().data_ptr() in static else "hand out")
            elif self.lend_from is None or index < self.lend_from or value.untyped_storage().data_ptr() in inputs:
                returns.append("clone")
            else:
                returns.append("lend")
                _lent[value.data_ptr()] = weakref.ref(self)
                # One storage object kept per storage, and no other alive when the counts are taken:
                # a count that included a reference which later goes away would miss one lent alias.
                key = value.untyped_storage().data_ptr()
                if key not in static and key not in storages:   # a parameter's storage is not the graph's
                    storages[key] = value.untyped_storage()
        self.returns = tuple(returns)
        self.lent = [(storage, _use_count(storage)) for storage in storages.values()]


_STILL_REFERENCED = {
    "forward": "the saved tensors this graph lent on its previous call are still referenced (a second "
               "forward before the first one's backward, or retain_graph)",
    "backward": "the gradients this graph lent on its previous call are still referenced (gradients kept "
                "across steps: accumulation, or zero_grad(set_to_none=False))"}


def _lender(value: torch.Tensor) -> CudaGraphRunner | None:
    """The live runner whose recording writes the buffer ``value`` starts at, if one lends it."""
    owner = _lent.get(value.data_ptr())
    return owner() if owner is not None else None


class CudaGraphs(Pass):
    """Replay each compiled CUDA graph as one CUDA-graph launch (reduce-overhead)."""

    name = "cudagraphs"
    Options = CudaGraphsOptions
    version = "6"

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        reason = static_skip_reason(graph, context, tuple(self.options.roles))
        if reason is not None:
            if self.options.required:
                raise CudaGraphsError(f"graph {context.graph_id}: cudagraphs is required but {reason}")
            context.note(f"not recorded: {reason}", topic="cudagraphs")
            return graph
        sized = symbolic_inputs(context.example_inputs)
        if sized:
            runner = SizedCudaGraphs(graph, self.options, context, mutated_inputs(graph), sized)
        else:
            runner = CudaGraphRunner(graph, self.options, context, mutated_inputs(graph))
        wrapper = torch.fx.Graph()
        placeholders = [wrapper.placeholder(n.name) for n in graph.graph.nodes if n.op == "placeholder"]
        for new, old in zip(placeholders, (n for n in graph.graph.nodes if n.op == "placeholder")):
            new.meta = dict(old.meta)
        call = wrapper.call_function(runner, tuple(placeholders))
        output = next(n for n in graph.graph.nodes if n.op == "output")
        results = output.args[0]
        count = len(results) if isinstance(results, (tuple, list)) else 1
        items = [wrapper.call_function(_getitem, (call, i)) for i in range(count)]
        wrapper.output(tuple(items) if isinstance(results, (tuple, list)) else items[0])
        context.tags.add("cudagraphs")
        context.note("graph will be recorded on its first call" + (
            "" if self.options.clone_outputs else " (outputs not cloned: the next call overwrites them)"),
            topic="cudagraphs")
        return torch.fx.GraphModule(graph, wrapper)


def symbolic_inputs(example_inputs: list) -> tuple[int, ...]:
    """Indices of the inputs whose sizes are symbolic: SymInt values and tensors of symbolic shape."""
    return tuple(i for i, value in enumerate(example_inputs)
                 if isinstance(value, torch.SymInt)
                 or isinstance(value, torch.Tensor) and not all(type(s) is int for s in value.shape))


class SizedCudaGraphs:
    """A graph with symbolic sizes, recorded per size: one :class:`CudaGraphRunner` for each set of
    values of its symbolic inputs (SymInt values, shapes of tensors of symbolic shape) seen, up to
    ``max_sizes``; calls at further sizes run the graph without CUDA graphs."""

    def __init__(self, graph: torch.fx.GraphModule, options: CudaGraphsOptions, context: PassContext,
                 mutated: list[int], sized: tuple[int, ...]):
        self.graph = graph
        self.options = options
        self.context = context
        self.mutated = mutated
        self.sized = sized
        self.runners: dict[tuple, CudaGraphRunner] = {}
        # What the sizes' runners hand out, shared (one pool; a replay at any size invalidates all).
        self.handouts = None if options.clone_outputs else HandOuts(context.graph_id)
        self.over_limit = 0
        self._lock = threading.Lock()

    @property
    def __name__(self) -> str:
        return "cudagraph_replay_per_size"

    @property
    def wrapped_graph(self) -> torch.fx.GraphModule:
        return self.graph

    def to_data(self, codec: Any) -> dict:
        """What the compile cache and artifacts keep: the graph, the recording policy and which
        inputs carry the sizes; each size is recorded again on its first call after a rebuild."""
        return {"graph": codec.subgraph_to_data(self.graph, "cudagraph"), "options": unstructure(self.options),
                "mutated": list(self.mutated), "sized": list(self.sized)}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "SizedCudaGraphs":
        """Runners for the stored graph, none recorded yet, noting into the compile's context."""
        if codec.context is None:
            from pipeline.cache.graph_io import UnsupportedGraph
            raise UnsupportedGraph("CUDA-graph runners are rebuilt only inside a compile (they note into its context)")
        return cls(codec.subgraph_from_data(data["graph"]), CudaGraphsOptions(**data["options"]), codec.context,
                   list(data["mutated"]), tuple(data["sized"]))

    def __repr__(self) -> str:
        return f"<CUDA-graph runners for {len(self.runners)} size(s)>"

    def __call__(self, *args: Any) -> Any:
        key = tuple(args[i] if not isinstance(args[i], torch.Tensor) else args[i].shape for i in self.sized)
        runner = self.runners.get(key)
        if runner is None:
            with self._lock:
                runner = self.runners.get(key)
                if runner is None:
                    if len(self.runners) >= self.options.max_sizes:
                        if not self.over_limit:
                            self.context.note(f"called at more than cudagraphs.max_sizes {self.options.max_sizes} "
                                              f"sizes: further sizes run without CUDA graphs", topic="cudagraphs")
                        self.over_limit += 1
                        return self.graph(*args)
                    runner = CudaGraphRunner(self.graph, self.options, self.context, self.mutated, self.handouts)
                    self.runners[key] = runner
                    self.context.note(f"size {len(self.runners)} of at most {self.options.max_sizes} recorded: "
                                      f"{_spelled_key(key)}", topic="cudagraphs")
        return runner(*args)


def _spelled_key(key: tuple) -> str:
    return ", ".join(str(list(k)) if isinstance(k, torch.Size) else str(k) for k in key)


def _getitem(values: tuple, index: int) -> Any:
    return values[index]


@attrs.frozen
class CudaGraphLimits:
    cudagraphs: Literal["full", "any"] | None = option(
        None, "full: every graph must run under a CUDA graph; any: at least one (null: no check).")


def _check_wrapped(limits: CudaGraphLimits, wrapped: list) -> list:
    if limits.cudagraphs is None or not wrapped:
        return []
    ok = all(wrapped) if limits.cudagraphs == "full" else any(wrapped)
    measured = f"{sum(wrapped)} of {len(wrapped)} graphs"
    return [Outcome("cudagraphs", limits.cudagraphs, measured, ok,
                    text=f"expect.cudagraphs is '{limits.cudagraphs}' but {measured} run under CUDA graphs")]


def _reasons(notes: list) -> list[str]:
    return [n["message"] for n in notes if n.get("topic") == "cudagraphs"]


def _log_wrapped(graph_id: str, wrapped: bool, notes: list) -> None:
    logger = get_logger("cudagraphs")
    if wrapped:
        logger.info("%s runs under CUDA graphs", graph_id)
    else:
        logger.info("%s does not run under CUDA graphs: %s", graph_id,
                    "; ".join(_reasons(notes)) or "no pass in the plan wrapped it")


def _section(report: dict) -> str:
    rows = [(escape(g["id"]), '<span class="ok">yes</span>' if g["cudagraphs"]["wrapped"] else "no",
             escape("; ".join(g["cudagraphs"]["reasons"]) or ("" if g["cudagraphs"]["wrapped"]
                                                              else "no pass in the plan wrapped it")))
            for g in report["graphs"] if "cudagraphs" in g]
    return table(["graph", "under CUDA graphs", "skip reasons"], rows) if rows else none("No graph was compiled.")


#: Whether each graph runs under a CUDA graph (the pass's ``cudagraphs`` tag; a graph that turns
#: out not recordable on its first call is set back to False), checked by ``expect.cudagraphs``.
METRIC = Metric(name="cudagraphs", doc="Whether the graph runs under a CUDA graph.",
                measure=lambda gm, context: "cudagraphs" in context.tags, limits=CudaGraphLimits,
                check=_check_wrapped, log=_log_wrapped,
                report=lambda wrapped, notes: {"cudagraphs": {"wrapped": wrapped, "reasons": _reasons(notes)}},
                sections={"cudagraphs": ("CUDA graphs", _section)}, default=False)
