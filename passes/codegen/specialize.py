"""Kernels for fused groups with symbolic sizes: one kernel per size class.

A graph Dynamo captured with symbolic sizes (``s0`` for the batch) keeps them through ``fuse``;
its groups iterate symbolic domains. ``codegen`` puts a :class:`SizeSpecializedKernel` in place
of each such group. Called with real tensors, it reads the symbols' values from its inputs' sizes
(every symbol must be some input's size, exactly) and runs the kernel for those values, which the
graph's :class:`Specializer` provides:

- a *size-class* kernel (passes/kernel_ir/symbolic.py) generated earlier whose facts hold for the
  values: the same compiled function, called with the sizes as arguments (no generation at all);
- else the group is generated again as a size class of these values (with every other group of
  the graph the values determine, together: one C++ library, or the Triton kernels compiled in
  parallel), with the backend and options the graph was compiled with;
- a group whose generation cannot keep its sizes symbolic (a split reduction, a size taken as a
  plain number) is generated for the concrete values instead, as a static group, once per size.

The compile-time sizes (the values Dynamo saw) are generated when the graph is compiled, so its
record counts their kernels. The graph stays one graph for every size (no recompile). After the
plan's ``size_specializations`` builds, groups needing a new one run eagerly at those sizes.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import attrs
import sympy
import torch
import torch.fx

from passes.kernel_ir.groups import CompiledKernel, FusedGroup, meta_of
from passes.kernel_ir.loops import UnsupportedGroup
from passes.kernel_ir.symbolic import Decisions, parse, size_data
from pipeline import Metric, PassContext, compat
from pipeline.cache.graph_io import Codec, UnsupportedGraph
from pipeline.errors import PipelineError
from pipeline.options import unstructure


SIZES_KEPT = 64         # bindings listed in the size_specializations metric
INSTANCES_KEPT = 4096   # size-class kernels kept made for particular sizes, per graph


def _values(group: FusedGroup) -> list:
    """The example values of a group's placeholders, then of its outputs."""
    nodes = group.subgraph.graph.nodes
    output = next(n for n in nodes if n.op == "output")
    return [meta_of(n) for n in nodes if n.op == "placeholder"] + [meta_of(n) for n in output.args[0]]


def _sizes(value: Any) -> list:
    return [*value.shape, *value.stride()] if isinstance(value, torch.Tensor) else [value]


def is_symbolic(group: FusedGroup) -> bool:
    """True when the group's domain or a size or stride of its inputs or outputs is symbolic."""
    return any(isinstance(s, torch.SymInt) for v in [*_values(group), *group.domain] for s in _sizes(v))


def free_symbols(group: FusedGroup) -> frozenset:
    """The sympy symbols of the group's sizes and strides."""
    out: set = set()
    for value in [*_values(group), *group.domain]:
        for size in _sizes(value):
            if isinstance(size, torch.SymInt):
                out |= size.node.expr.free_symbols
    return frozenset(out)


def binders(group: FusedGroup) -> tuple[tuple[sympy.Symbol, int, int], ...] | None:
    """``(symbol, input index, dim)`` for each free symbol: an input dimension whose size is
    exactly that symbol, from which a call reads its value; None when some symbol is no input's
    size (a group whose inputs are all ``2 * s0`` long, say)."""
    found: dict = {}
    placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        value = meta_of(node)
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                found.setdefault(size.node.expr, (index, dim))
    if not free_symbols(group) <= set(found):
        return None
    return tuple(sorted(((s, i, d) for s, (i, d) in found.items()), key=lambda b: str(b[0])))


def _concrete(size: Any, binding: dict) -> int:
    """A size (int, SymInt, or the sympy expression of a group rebuilt from the cache) at ``binding``
    (symbols matched by name)."""
    if isinstance(size, int):
        return int(size)
    expr = sympy.sympify(size.node.expr if isinstance(size, torch.SymInt) else size)
    named = {str(s): v for s, v in binding.items()}
    value = expr.xreplace({s: sympy.Integer(named[s.name]) for s in expr.free_symbols if s.name in named})
    if not value.is_number:
        raise UnsupportedGroup(f"size {size} is not determined by the bound sizes")
    return int(value)


def _placeholder_data(group: FusedGroup) -> list:
    """The group's placeholders' example values as data (sizes as ints or expression texts), what
    :func:`pipeline.compat.rebuild_symbolic_metadata` rebuilds them from."""
    out = []
    for node in group.subgraph.graph.find_nodes(op="placeholder"):
        value = meta_of(node)
        if not isinstance(value, torch.Tensor):
            raise UnsupportedGraph(f"group {group.name}: input {node.name} is not a tensor")
        out.append({"shape": [size_data(v) for v in value.shape], "stride": [size_data(v) for v in value.stride()],
                    "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)})
    return out


def concrete_group(group: FusedGroup, binding: dict) -> FusedGroup:
    """A copy of ``group`` for concrete sizes: ``binding`` maps each free symbol to its value; the
    subgraph's example values are propagated again from inputs of the bound shapes and strides."""
    placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
    metadata = []
    for node in placeholders:
        value = meta_of(node)
        if not isinstance(value, torch.Tensor):
            raise UnsupportedGroup(f"input {node.name} is not a tensor")
        metadata.append({"shape": [_concrete(s, binding) for s in value.shape],
                         "stride": [_concrete(s, binding) for s in value.stride()],
                         "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)})
    graph = torch.fx.Graph()
    env: dict = {}
    for node in group.subgraph.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    module = torch.fx.GraphModule(group.subgraph, graph)
    compat.propagate_metadata(module, metadata, like=[])
    return FusedGroup(group.name, module, tuple(_concrete(s, binding) for s in group.domain), group.reduced,
                      list(group.reasons))


@attrs.define(eq=False)
class SizeRuntime:
    """What a specialization at run time needs of the compile that made the graph: the backend's
    ``build(graph, context)`` (the graph holds FusedGroup nodes; it replaces those it can generate
    by kernels) and the settings of a :class:`~pipeline.PassContext` it writes notes into."""

    build: Callable[[torch.fx.GraphModule, Any], torch.fx.GraphModule]
    target: str
    cache: Any
    limit: int
    context: Any = None     # the compile's PassContext: set_metric("size_specializations", ...)
    # The pass that made ``build`` (its ``backend(target)`` method) and its options: what the
    # compile cache keeps to make ``build`` again.
    maker: Any = None

    def to_data(self) -> dict:
        return {"target": self.target, "limit": self.limit, "pass": Codec.class_name(type(self.maker)),
                "options": unstructure(self.maker.options)}

    @classmethod
    def from_data(cls, data: dict, codec: Codec) -> "SizeRuntime":
        """The runtime :meth:`to_data` described, in the compile of ``codec`` (a cache hit's): the
        pass class is imported by name, as every described class is."""
        kind = codec.import_class(data["pass"])
        maker = kind(kind.Options(**data["options"]))
        context = codec.context
        return cls(maker.backend(data["target"]), data["target"], context.cache, data["limit"], context, maker)


class Specializer:
    """The symbolic groups of one graph and the kernels made for their sizes.

    A group's kernels are *size-class* kernels where its sizes can stay symbolic: generated once
    with the sizes as arguments, for every binding that satisfies the facts its generation relied
    on (:class:`~passes.kernel_ir.symbolic.SizeClass`); a binding outside every class of the group
    generates one more. A group whose generation cannot keep its sizes symbolic (an operator or
    kernel kind that needs them as numbers) gets a kernel per binding instead, as a static group.
    """

    def __init__(self, groups: list[FusedGroup], runtime: SizeRuntime, graph_id: str):
        self.groups = groups
        self.runtime = runtime
        self.graph_id = graph_id
        self.symbols = {g.name: free_symbols(g) for g in groups}
        self.kernels: dict[tuple, Any] = {}      # (group name, values of its symbols) -> kernel or group
        # The same for size-class kernels called at those sizes: made again from their class when
        # dropped, so only the most recent INSTANCES_KEPT stay (a server sees many sizes).
        self.instances: dict[tuple, Any] = {}
        self.classes: dict[str, list] = {g.name: [] for g in groups}   # size-class kernels per group
        self.per_size: set[str] = set()          # groups generated per binding (sizes cannot stay symbolic)
        self.sizes: list[dict] = []              # each binding seen, in order (the first SIZES_KEPT)
        self.seen = 0                            # bindings seen
        self.builds = 0                          # times kernels were generated
        self.generated = 0                       # kernels generated (size-class and per-binding)
        self.notes: list[str] = []               # what the builds said (groups left eager, libraries)
        # Groups rebuilt from the compile cache without example values: their placeholders'
        # descriptions, made into example values when the group is generated again.
        self.described: dict[str, list] = {}

    @classmethod
    def shared(cls, data: dict, codec: Any) -> "Specializer":
        """The specializer of a graph rebuilt from the compile cache: one for all its kernels."""
        key = ("specializer", data["id"])
        found = codec.shared.get(key)
        if found is None:
            if codec.context is None:
                raise UnsupportedGraph("kernels for symbolic sizes are rebuilt only inside a compile")
            found = codec.shared[key] = cls([], SizeRuntime.from_data(data["runtime"], codec), codec.context.graph_id)
        return found

    def to_data(self) -> dict:
        return {"id": str(id(self)), "runtime": self.runtime.to_data()}

    def add(self, group: FusedGroup, symbols: frozenset, classes: list, per_size: bool, described: list) -> None:
        """A group rebuilt from the compile cache, with its size-class kernels."""
        self.groups.append(group)
        self.symbols[group.name] = symbols
        self.classes[group.name] = list(classes)
        if per_size:
            self.per_size.add(group.name)
        self.described[group.name] = described

    def group_data(self, group: FusedGroup, codec: Any) -> dict:
        """What :meth:`add` takes back: the group's kernels and its placeholders' descriptions."""
        described = self.described.get(group.name)
        return {"classes": [codec.describe(k) for k in self.classes[group.name]],
                "per_size": group.name in self.per_size, "symbols": sorted(str(s) for s in self.symbols[group.name]),
                "placeholders": described if described is not None else _placeholder_data(group)}

    def _with_values(self, group: FusedGroup) -> None:
        """Give a group rebuilt from the cache its example values (symbolic sizes in the shape
        environment of the compile it was rebuilt in) before it is generated again."""
        described = self.described.get(group.name)
        if described is not None:       # ValueError without a compile's shapes (a stored capture's graph)
            compat.rebuild_symbolic_metadata(group.subgraph, described, self.runtime.context.example_inputs)
            del self.described[group.name]

    def key(self, group: FusedGroup, binding: dict) -> tuple:
        return (group.name, tuple(binding[s] for s in sorted(self.symbols[group.name], key=str)))

    def kernel(self, group: FusedGroup, binding: dict) -> Any:
        """The kernel of ``group`` at ``binding``: a size-class kernel's call at those sizes, or one
        made for them (with every other group whose sizes the binding determines); the group itself
        once the limit of builds is reached."""
        key = self.key(group, binding)
        found = self.instances.get(key) or self.kernels.get(key)
        if found is not None:
            return found
        # Dynamo's compile lock: fake-tensor propagation and code generation are not thread-safe
        # against a compile running in another thread (it also serializes this graph's builds).
        with compat.compile_lock():
            if key not in self.kernels and key not in self.instances:
                self._provide(binding)
            return self.instances.get(key) or self.kernels[key]

    def _instance(self, key: tuple, kernel: Any) -> None:
        self.instances[key] = kernel
        if len(self.instances) > INSTANCES_KEPT:
            del self.instances[next(iter(self.instances))]

    def _provide(self, binding: dict) -> None:
        pending = [g for g in self.groups if self.symbols[g.name] <= set(binding)
                   and self.key(g, binding) not in self.kernels and self.key(g, binding) not in self.instances]
        self.seen += 1
        if len(self.sizes) < SIZES_KEPT:
            self.sizes.append({str(s): v for s, v in binding.items()})
        missing = []
        for group in pending:
            kernel = next((k.at(binding) for k in self.classes[group.name]
                           if k.size_class.fits(k.size_class.values(binding))), None)
            if kernel is None:
                missing.append(group)
            else:
                self._instance(self.key(group, binding), kernel)
        if missing:
            self._build(binding, missing)
        if self.runtime.context is not None:
            self.runtime.context.set_metric("size_specializations", self.summary())

    def _build(self, binding: dict, groups: list[FusedGroup]) -> None:
        if self.builds >= self.runtime.limit:
            for group in groups:
                self.kernels[self.key(group, binding)] = group
            return
        self.builds += 1
        symbolic = [g for g in groups if g.name not in self.per_size]
        left = [g for g in groups if g.name in self.per_size]
        if symbolic:
            made = self.generated
            left += self._generate(binding, symbolic, per_binding=False)
            store_again = getattr(self.runtime.context, "store_again", None)
            if store_again is not None and self.generated > made:   # the stored entry gets the new classes too
                store_again()
        if left:
            self._generate(binding, left, per_binding=True)

    def _generate(self, binding: dict, groups: list[FusedGroup], *, per_binding: bool) -> list[FusedGroup]:
        """Generate ``groups`` for ``binding``: as size classes, or (``per_binding``) for these
        concrete sizes. Returns the groups whose size-class generation failed."""
        graph = torch.fx.Graph()
        nodes = []
        for group in groups:
            try:
                self._with_values(group)
            except ValueError as exc:
                self.kernels[self.key(group, binding)] = group
                self.notes.append(f"{group.name}: runs eagerly at {_spelled(binding)}: {exc}")
                continue
            if per_binding:
                try:
                    made = concrete_group(group, binding)
                except (UnsupportedGroup, RuntimeError) as exc:
                    self.kernels[self.key(group, binding)] = group
                    self.notes.append(f"{group.name}: runs eagerly at {_spelled(binding)}: {exc}")
                    continue
            else:
                own = {s: binding[s] for s in self.symbols[group.name]}
                made = attrs.evolve(group, decisions=Decisions(own))
            count = len(made.subgraph.graph.find_nodes(op="placeholder"))
            inputs = tuple(graph.placeholder(f"{group.name}_in{k}") for k in range(count))
            nodes.append((group, graph.call_function(made, inputs)))
        graph.output(tuple(n for _, n in nodes))
        module = torch.fx.GraphModule(torch.nn.Module(), graph)
        notes = PassContext(self.graph_id, self.runtime.target, [], cache=self.runtime.cache, current_pass="codegen")
        try:
            self.runtime.build(module, notes)
        except Exception as exc:
            names = ", ".join(g.name for g, _ in nodes)
            raise PipelineError(f"codegen: generating the kernels of {self.graph_id} ({names}) for the sizes "
                                f"{_spelled(binding)} failed: {type(exc).__name__}: {exc}") from exc
        failed = []
        for group, node in nodes:
            made = node.target
            compiled = isinstance(made, CompiledKernel)
            if per_binding:
                self.kernels[self.key(group, binding)] = made if compiled else group
            elif compiled and made.size_class is not None:
                self.classes[group.name].append(made)
                self._instance(self.key(group, binding), made.at(binding))
                if made.size_class.exact:
                    self.notes.append(f"{group.name}: its kernel holds for one size only: "
                                      + "; ".join(made.size_class.exact))
            else:
                failed.append(group)
                self.per_size.add(group.name)
                continue
            self.generated += compiled
        messages = [n["message"] for n in notes.notes]
        if not per_binding:     # why a group's sizes could not stay symbolic (it is then made per size)
            messages = [m.replace(": runs eagerly: ", ": kernels per size (sizes cannot stay symbolic): ", 1)
                        for m in messages]
        self.notes.extend(messages)
        return failed

    def summary(self) -> dict:
        """Sizes seen, builds, and the kernels made: size-class kernels per group and the groups
        made per size; ``eager``: why groups ran eagerly at sizes seen after the compile."""
        return {"groups": len(self.groups), "sizes": list(self.sizes), "seen": self.seen, "builds": self.builds,
                "limit": self.runtime.limit, "kernels": self.generated,
                "classes": sum(len(k) for k in self.classes.values()),
                "per_size_groups": sorted(self.per_size),
                "eager": [n for n in self.notes if "runs eagerly" in n][-SIZES_KEPT:],
                "facts": {name: [list(k.size_class.facts) for k in kernels]
                          for name, kernels in self.classes.items() if kernels}}


def _with_options(kernel: CompiledKernel, options: dict) -> Callable:
    def launch(*inputs: torch.Tensor) -> tuple:
        return kernel(*inputs, **options)
    return launch


def _spelled(binding: dict) -> str:
    return ", ".join(f"{s}={v}" for s, v in sorted(binding.items(), key=lambda b: str(b[0])))


class SizeSpecializedKernel(CompiledKernel):
    """Stands for a symbolic group's kernels: reads the symbols' values from the inputs' sizes and
    calls the kernel made for them (see :class:`Specializer`)."""

    def __init__(self, group: FusedGroup, specializer: Specializer, bind: tuple, example: Any):
        super().__init__(group, getattr(example, "source", ""))
        self.backend = getattr(example, "backend", "?")
        self.specializer = specializer
        self.bind = bind
        self._single = bind[0][1:] if len(bind) == 1 else None
        # (values of the symbols, their kernel or group, whether it takes donors=, reuse=, its
        # launch function for the call's donors= or None, those donors) of the last call: a call
        # at the same sizes from the same call site only compares the values.
        self.last: tuple = (None, None, False, False, None, None)
        # The generated host code passes donors= and reuse= where the compile-time kernel takes
        # them (planned on layouts of symbolic sizes, which hold at every size).
        self.in_place_capable = getattr(example, "in_place_capable", False)
        self.accepts_reuse = getattr(example, "accepts_reuse", False)

    def __call__(self, *inputs: torch.Tensor, donors: tuple = (), reuse: tuple = ()) -> tuple:
        if self._single is not None:        # one symbol (the common case): no tuple to build
            values = inputs[self._single[0]].shape[self._single[1]]
        else:
            values = tuple([inputs[i].shape[d] for _, i, d in self.bind])
        last_values, kernel, takes_donors, takes_reuse, launch, launch_donors = self.last
        if values != last_values or donors is not launch_donors:
            kernel = self._kernel_at((values,) if self._single is not None else values)
            compiled = isinstance(kernel, CompiledKernel)
            takes_donors, takes_reuse = compiled and kernel.writes_inputs_safely(), compiled and kernel.accepts_reuse
            # The call site passes the same keywords every call: its launch function at these sizes.
            launch = kernel.launcher(self._options(donors, reuse, takes_donors, takes_reuse)) if compiled else None
            self.last = (values, kernel, takes_donors, takes_reuse, launch, donors)
        if launch is not None and not reuse:
            return launch(*inputs)
        if not (donors and takes_donors or reuse and takes_reuse):
            return kernel(*inputs)
        return kernel(*inputs, **self._options(donors, reuse, takes_donors, takes_reuse))

    def launcher(self, kwargs: dict) -> Callable | None:
        """A function for one call site passing at most ``donors=``: it reads the symbols' values
        from its inputs and, while they repeat, calls the launch function of the kernel at those
        sizes directly (no keywords, no tuple of values where one symbol binds)."""
        if set(kwargs) - {"donors"}:
            return None
        donors = tuple(kwargs.get("donors", ()))
        count = sum(1 for n in self.group.subgraph.graph.nodes if n.op == "placeholder")
        arguments = ", ".join(f"a{i}" for i in range(count))
        values = ", ".join(f"a{i}.shape[{d}]" for _, i, d in self.bind)
        if len(self.bind) > 1:
            values = f"({values})"
        site: list = [None, None]       # the values the site last ran at and their call

        def bind(*inputs: torch.Tensor) -> tuple:
            sizes = tuple(inputs[i].shape[d] for _, i, d in self.bind)
            kernel = self._kernel_at(sizes)
            launch = None
            if isinstance(kernel, CompiledKernel):
                takes_donors = bool(donors) and kernel.writes_inputs_safely()
                options = {"donors": donors} if takes_donors else {}
                launch = kernel.launcher(options)
                if launch is None and options:
                    launch = _with_options(kernel, options)
            site[0], site[1] = (sizes if len(self.bind) > 1 else sizes[0]), launch or kernel
            return site[1](*inputs)

        name = re.sub(r"\W", "_", self.__name__)     # an identifier (a backend may be unknown: "?")
        source = (f"def {name}({arguments}):\n"
                  f"    if {values} == site[0]:\n"
                  f"        return site[1]({arguments})\n"
                  f"    return bind({arguments})\n")
        namespace = {"site": site, "bind": bind}
        exec(compile(source, f"<launch {name}>", "exec"), namespace)  # noqa: S102 - our own source
        return namespace[name]

    def _kernel_at(self, sizes: tuple) -> Any:
        """The kernel (or the group, run eagerly) for the symbols' values ``sizes``."""
        return self.specializer.kernel(self.group, {symbol: value for (symbol, _, _), value in zip(self.bind, sizes)})

    @staticmethod
    def _options(donors: tuple, reuse: tuple, takes_donors: bool, takes_reuse: bool) -> dict:
        """The keywords a call passes on to the kernel at its sizes: those it takes."""
        options = {}
        if donors and takes_donors:
            options["donors"] = donors
        if reuse and takes_reuse:
            options["reuse"] = reuse
        return options

    @property
    def __name__(self) -> str:
        return f"{self.backend}_{self.group.name}_sized"

    def to_data(self, codec: Any) -> dict:
        """Plain data for the compile cache: the symbolic group (its placeholders described with
        their size expressions), where its sizes are read from, its size-class kernels and the
        codegen settings that generate more (shared with the graph's other such kernels)."""
        return {"specializer": self.specializer.to_data(), "group": self.group.to_data(codec),
                "bind": [[str(s), i, d] for s, i, d in self.bind],
                **self.specializer.group_data(self.group, codec),
                "example": {"backend": self.backend, "source": codec.put_text(self.source),
                            "in_place_capable": self.in_place_capable, "accepts_reuse": self.accepts_reuse}}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "SizeSpecializedKernel":
        """The kernel :meth:`to_data` described, joined to its graph's rebuilt specializer. Sizes
        in its stored classes call those kernels; others generate again, in this compile's shapes."""
        specializer = Specializer.shared(data["specializer"], codec)
        group = FusedGroup.from_data(data["group"], codec)
        specializer.add(group, frozenset(parse(s) for s in data["symbols"]),
                        [codec.rebuild(k) for k in data["classes"]], data["per_size"], data["placeholders"])
        example = data["example"]
        kernel = cls(group, specializer, tuple((parse(s), i, d) for s, i, d in data["bind"]), None)
        kernel.backend, kernel.source = example["backend"], codec.text(example["source"])
        kernel.in_place_capable, kernel.accepts_reuse = example["in_place_capable"], example["accepts_reuse"]
        return kernel


def specialize_graph(graph: torch.fx.GraphModule, runtime: SizeRuntime, context: Any) -> int:
    """Put a :class:`SizeSpecializedKernel` in place of each symbolic FusedGroup node of ``graph``
    whose symbols its inputs' sizes determine, making the kernels for the compile-time sizes now.
    Returns how many groups it took; the others keep running eagerly, with the reason noted."""
    taken = []
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, FusedGroup) or not is_symbolic(node.target):
            continue
        bind = binders(node.target)
        if bind is None:
            context.note(f"{node.target.name}: runs eagerly: its symbolic sizes are not all sizes of its inputs")
            continue
        if runtime.limit <= 0:
            context.note(f"{node.target.name}: runs eagerly: symbolic sizes (size_specializations is 0)")
            continue
        taken.append((node, bind))
    if not taken:
        return 0
    specializer = Specializer([n.target for n, _ in taken], runtime, context.graph_id)
    hints = {}
    for node, bind in taken:
        placeholders = node.target.subgraph.graph.find_nodes(op="placeholder")
        for symbol, index, dim in bind:
            hint = compat.size_hint(meta_of(placeholders[index]).shape[dim])
            if hint is not None:
                hints[symbol] = hint
    for node, bind in taken:
        group = node.target
        example = None
        if all(symbol in hints for symbol, _, _ in bind):
            example = specializer.kernel(group, {s: hints[s] for s, _, _ in bind})
        node.target = SizeSpecializedKernel(group, specializer, bind, example)
    for message in specializer.notes:
        context.note(message)
    context.note(f"{len(taken)} group(s) with symbolic sizes get kernels per size seen (at most "
                 f"{runtime.limit} sizes); made for {_spelled(hints)}")
    graph.recompile()
    return len(taken)


def _measure(gm: torch.fx.GraphModule, context: Any) -> dict | None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, SizeSpecializedKernel):
            return node.target.specializer.summary()
    return None


METRIC = Metric(name="size_specializations",
                doc="Groups with symbolic sizes, the sizes their kernels were made for so far, and those kernels.",
                measure=_measure, default=None)
