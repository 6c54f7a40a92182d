"""What a pass is. Built-in and third-party passes subclass :class:`Pass` (graph to graph) or
:class:`CapturePass` (the frontend that turns a model into graphs) and are registered through the
``pipeline_register_passes`` hook.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, ClassVar

import attrs
import torch.fx

from pipeline.logs import get_logger
from pipeline.options import NoOptions

# A compiled graph's entry point: takes the graph's flat inputs, returns its outputs.
GraphCompiler = Callable[[torch.fx.GraphModule, list], Callable]


class Pass:
    """A graph-to-graph pass.

    Class attributes a pass declares:
    - ``name``: unique kebab-case name, the one name used in YAML, logs, reports and errors;
    - ``Options``: a frozen attrs class of typed, documented options (``pipeline.option``);
    - ``version``: bump it whenever the pass's output changes; it feeds the compile cache key;
    - ``requires`` / ``provides`` / ``invalidates``: invariant tags (``functional``, ``core-aten``,
      ``fused``, ...). A plan is rejected at load time if a pass requires a tag no earlier pass
      provides (tags the capture pass establishes count as provided);
    - ``uses_fuel``: whether ``run`` asks ``context.use_fuel()`` before each rewrite (optional).

    An instance is bound to one compile of one plan, with its parsed options in ``self.options``;
    passes never share state through globals.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    version: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    invalidates: ClassVar[frozenset[str]] = frozenset()
    stage: ClassVar[str] = "graph"
    #: True when ``run`` asks :meth:`PassContext.use_fuel` before every rewrite, so ``pipeline
    #: bisect`` can find the first rewrite of this pass that changes the result.
    uses_fuel: ClassVar[bool] = False

    def __init__(self, options: Any = None):
        self.options = options if options is not None else self.Options()

    @classmethod
    def provided(cls, options: Any) -> frozenset[str]:
        """Tags this pass establishes with these options (override when options change them)."""
        return frozenset(cls.provides)

    def cache_material(self) -> Any:
        """What this pass's output depends on beyond its code, version and options (for example a
        table plugins extend), as JSON-ready data; it feeds the compile cache key. None: nothing."""
        return None

    def run(self, graph: torch.fx.GraphModule, context: "PassContext") -> torch.fx.GraphModule:
        """Return a graph computing the same outputs (and input mutations) as ``graph``.

        It may edit ``graph`` in place and return it, or return a new module; either way the
        placeholders (the calling convention) and the output structure stay the same."""
        raise NotImplementedError(f"pass '{self.name}' does not implement run()")

    def __repr__(self) -> str:
        return f"<pass {self.name} {self.options!r}>"


class CapturePass(Pass):
    """The frontend: the first pass of every plan. It turns a model or function into graphs and
    hands each captured graph to ``compile_graph`` (which runs the rest of the plan), returning the
    callable that replaces the model's forward."""

    stage: ClassVar[str] = "capture"

    def capture(self, fn: Callable, compile_graph: GraphCompiler, context: "CaptureContext") -> Callable:
        """Return a callable with ``fn``'s signature that runs compiled graphs."""
        raise NotImplementedError(f"capture pass '{self.name}' does not implement capture()")

    def run(self, graph: torch.fx.GraphModule, context: "PassContext") -> torch.fx.GraphModule:
        return graph


@attrs.define(eq=False)
class JointGraph:
    """A training graph before it is split: forward and backward in one ATen graph.

    ``module`` takes its inputs flat: ``num_primals`` primals (the forward's inputs, placeholders
    named ``primals_N``), then the tangents (``tangents_N``, the gradients of the forward's
    outputs). It returns the forward's ``num_forward_outputs`` outputs followed by one gradient
    (or None) per primal. Writes into primals (batch-norm running statistics) are ``copy_`` nodes
    the forward must keep. ``example_inputs`` are fake tensors, primals then tangents."""

    module: torch.fx.GraphModule
    example_inputs: list
    num_primals: int
    num_forward_outputs: int


class SplitPass(Pass):
    """A pass that splits a training graph in two (``stage = "split"``).

    In a plan, the passes before a split pass run on the joint forward+backward graph (role
    ``joint``); the split pass turns it into a forward and a backward graph; the passes after it
    run on each half (roles ``forward`` and ``backward``). Inference graphs (no gradient needed)
    run every other pass and skip the split. At most one split pass per plan."""

    stage: ClassVar[str] = "split"

    def split(self, joint: JointGraph, context: "PassContext") -> tuple[torch.fx.GraphModule,
                                                                        torch.fx.GraphModule]:
        """Return (forward, backward) graphs following AOTAutograd's contract: the forward takes
        the primals and returns its outputs, then the tensors it saves for the backward, then
        saved SymInts; the backward takes the saved SymInts, then the saved tensors, then every
        tangent, and returns the joint's gradients."""
        raise NotImplementedError(f"split pass '{self.name}' does not implement split()")

    def run(self, graph: torch.fx.GraphModule, context: "PassContext") -> torch.fx.GraphModule:
        return graph


class Fuel:
    """How many rewrites each pass may still make in one compile (``pipeline bisect`` sets it).

    ``limits`` maps a pass name to the number of rewrites it may apply (None: unlimited, only
    counted); ``used`` counts the rewrites each pass asked for and ``spent`` describes them."""

    def __init__(self, limits: dict[str, int | None]):
        self.limits = dict(limits)
        self.used: dict[str, int] = {}
        self.spent: dict[str, list[str]] = {}

    def take(self, pass_name: str | None, what: str) -> bool:
        """True when ``pass_name`` may apply one more rewrite (described by ``what``)."""
        if pass_name not in self.limits:
            return True
        used = self.used.get(pass_name, 0)
        limit = self.limits[pass_name]
        if limit is not None and used >= limit:
            return False
        self.used[pass_name] = used + 1
        self.spent.setdefault(pass_name, []).append(what)
        return True


@attrs.define(eq=False)
class PassContext:
    """What a graph pass may know about the graph it transforms, and where it records decisions."""

    graph_id: str
    target: str
    example_inputs: list
    cache: Any = None       # the plan's cache settings (CacheSettings; None: the default cache)
    role: str = "inference"
    tags: set = attrs.field(factory=set)
    notes: list = attrs.field(factory=list)
    current_pass: str | None = None
    fuel: Fuel | None = None
    record: Any = None      # the GraphRecord of this graph (see set_metric)
    #: A training forward split by the plan's split pass: how many outputs are the step's results (the
    #: backward reads the rest: saved tensors, then SymInts). None otherwise (torch's partitioner too).
    forward_outputs: int | None = None
    store_again: Any = None     # writes the graph's stored cache entry again (kernels made at run time)

    def note(self, message: str, *, topic: str = "passes") -> None:
        """Record a decision (a rewrite chosen or skipped, a cache hit...) for the compile report,
        and log it on the ``pipeline.<topic>`` logger (topics: see :mod:`pipeline.logs`; the
        report files ``cache`` notes, and notes a registered metric reads, in their own sections)."""
        self.notes.append({"pass": self.current_pass, "topic": topic, "message": message})
        logger = get_logger(topic)
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s [%s] %s", self.graph_id, self.current_pass, message)

    def set_metric(self, name: str, value: Any) -> None:
        """Change a registered metric's value for this graph after the compile (an object the pass
        left in the graph decides at run time, for example that a CUDA graph cannot be recorded)."""
        if self.record is not None:
            self.record.metrics[name] = value

    def use_fuel(self, what: str = "") -> bool:
        """Ask before applying one rewrite: False means skip it (and, usually, the rest).

        Always True in a normal compile; ``pipeline bisect`` limits it to find the first rewrite
        that changes the result. ``what`` describes the rewrite (shown by bisect). A pass that
        calls this sets ``uses_fuel = True``."""
        if self.fuel is None:
            return True
        return self.fuel.take(self.current_pass, what)


@attrs.define(eq=False)
class CaptureContext:
    """Given to a capture pass: the plan and the compilation's event log."""

    plan: Any
    compilation: Any
    #: Compiled variants the plan's declared shape buckets account for (warm-up compiles one per
    #: bucket combination); a capture pass allows them on top of its own recompile limit.
    planned_variants: int = 0

    def record_graph_break(self, reason: str) -> None:
        """Record that capture had to split the program (with Dynamo's reason text)."""
        self.compilation.graph_breaks.append(reason)
        self.compilation.broken_grad_modes.add(torch.is_grad_enabled())

    def without_graph_breaks(self) -> bool:
        """Whether no graph break has been recorded so far in calls of the current grad mode
        (cheap: read on every call). Dynamo guards every cache entry on the grad mode, so a model
        called once with grad enabled, whose backward breaks the graph, keeps running its whole
        no-grad graph directly."""
        return torch.is_grad_enabled() not in self.compilation.broken_grad_modes

    def expose(self, name: str, item: Any) -> None:
        """Make a live runtime object of the capture pass (for example its call counters) readable
        as ``compilation_of(model).runtime[name]``; one with a ``counts()`` method also appears,
        as those counts, under ``calls`` in the compile report."""
        self.compilation.runtime[name] = item

    def record_fallback(self, reason: str) -> bool:
        """Record that some calls run eagerly for a reason that is no single graph's (a hit
        recompile limit); False when that reason was recorded already."""
        fallbacks = self.compilation.fallbacks
        if any(f["reason"] == reason for f in fallbacks):
            return False
        fallbacks.append({"graph": None, "reason": reason})
        get_logger("recompiles").warning("plan '%s': %s", self.plan.name, reason)
        return True

    def record_recompile(self, reason: str) -> None:
        """Record that a guard failed and a new variant was captured (``reason`` names the guard)."""
        self.compilation.recompiles.append(reason)
        get_logger("recompiles").info("recompile %d of plan '%s': %s", len(self.compilation.recompiles),
                                      self.plan.name, reason)
