"""``matmul-template``: one Triton kernel for a matmul and its pointwise epilogue, where it is faster.

After ``codegen``, a 2-D ``mm``/``addmm``/``linear`` whose result feeds exactly one pointwise group
(bias add, activation, scale, residual...), directly or through a reshape of the contiguous result
to ``[..., N]`` (a 3-D input's ``linear``), is an extern ATen call followed by the group's kernel.
This pass writes, for each such pair, a tiled Triton matmul whose epilogue computes the group's
operators on the fp32 accumulator tile before the store (matmul_template/source.py), so the
matmul's result never goes through memory. Whether the template replaces the pair is the plan's
``choose``:

- ``autotune`` (the plan's setting in ``max-autotune``): on a CUDA GPU the template's candidate
  configurations and the extern pair are timed on random inputs of the real shapes; the template
  is used only when its fastest configuration beats the pair. Both times and the decision are a
  note of the compile report, and the decision is cached on disk beside the kernels
  (``<cache>/triton/mmtemplate_<key>.json``, keyed like the launch-shape autotuner: the kernel
  source without its name, the candidates, the extern pair, the GPU model, the Triton and torch
  versions). Without a CUDA device nothing can be timed: the extern pair stays, with that reason.
- ``always``: the first candidate is used without timing (how the CPU tests run it, under
  ``TRITON_INTERPRET=1``).
- ``never``: nothing changes (a plan can keep the pass and switch it off).

The replaced node calls a :class:`MatmulTemplateKernel`, whose group is the *combined* group (the
matmul node followed by the epilogue's nodes): called with inputs of other strides than it was
built for, it runs that group eagerly, as every generated kernel does, so the graph stays
executable and verifiable.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Literal

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, non_negative, option, positive
from passes.kernel_ir.groups import CompiledKernel, FusedGroup, meta_of, output_fills, packet_name
from passes.kernel_ir.loops import UnsupportedGroup
from passes.kernel_ir import rules

from passes.codegen.buffers import drop_reuse, reuse_buffers
from passes.codegen.host import FAST_BINDINGS
from .source import MATMULS, RESHAPES, TemplateConfig, TemplatePlan, candidate_configs, template_plan, \
    template_source
from passes.codegen.triton.runtime import TritonKernel, interpreter_problem, interpreting, kernel_dir, load_module, \
    triton_missing, write_source
from passes.codegen.triton.source import TritonSource


@attrs.frozen
class MatmulTemplateOptions:
    choose: Literal["autotune", "always", "never"] = option(
        "autotune", "autotune: time the template's candidates against the extern matmul plus its epilogue "
                    "kernel on the GPU and use the template only where it is faster (no GPU: extern kept); "
                    "always: use the first candidate without timing (tests, the Triton interpreter); "
                    "never: leave every matmul extern.", tune=("autotune", "never"))
    min_flops: int = option(
        100_000_000, "Matmuls of fewer floating-point operations (2*M*N*K) keep the extern call without "
                     "timing anything (launch costs dominate there).", check=non_negative)
    candidates: int = option(
        10, "Most template configurations (tile sizes, warps, pipeline stages) timed per matmul; each costs "
           "a Triton compile.", check=positive)
    dtypes: list[Literal["float16", "bfloat16", "float32"]] = option(
        ["float16", "bfloat16", "float32"], "Matmul dtypes the template is considered for.")
    emulate_precision_casts: bool = option(
        True, "Round the accumulator to the matmul's dtype before the epilogue and every fp16/bf16 "
              "intermediate after each op, as the extern call and eager do (off: fp32 throughout).")


class MatmulTemplateKernel(TritonKernel):
    """The template kernel a graph calls in place of the epilogue's kernel: a
    :class:`~.triton_runtime.TritonKernel` (same allocation, launch and eager fallback through its
    combined group) launched with the configuration's pipeline stages as well as its warps."""

    in_place_capable = False    # its programs read whole rows and columns of the operands

    def _setup(self, generated: TritonSource, module: ModuleType, path: Path, **kwargs: Any) -> None:
        super()._setup(generated, module, path, **kwargs)
        self.kwargs["num_stages"] = getattr(module, "NUM_STAGES", 3)


@attrs.define(eq=False)
class Site:
    """One matmul node of the graph and the call of the epilogue kernel (or group) it feeds."""

    matmul: torch.fx.Node
    view: torch.fx.Node | None        # a reshape of the matmul's result the epilogue reads instead
    epilogue: torch.fx.Node
    inputs: list                      # graph values the combined group takes, in placeholder order
    group: FusedGroup                 # the combined group: the matmul, then the epilogue's nodes
    plan: TemplatePlan


def epilogue_group(node: torch.fx.Node) -> FusedGroup | None:
    """The fused group a node calls, directly or through its generated kernel."""
    target = node.target
    if isinstance(target, FusedGroup):
        return target
    if isinstance(target, CompiledKernel):
        return target.group
    return None


def find_site(node: torch.fx.Node) -> tuple[Site | None, str]:
    """The template site at matmul ``node``, or (None, why not)."""
    users = list(node.users)
    view = None
    if len(users) == 1 and users[0].op == "call_function" and packet_name(users[0].target) in RESHAPES:
        view, users = users[0], list(users[0].users)         # checked by template_plan
    if len(users) != 1 or users[0].op != "call_function" or epilogue_group(users[0]) is None:
        return None, "its result does not feed exactly one fused group"
    epilogue = users[0]
    group = epilogue_group(epilogue)
    if group.reduced:
        return None, f"its consumer {group.name} is a reduction, not a pointwise epilogue"
    if output_fills(group, [tuple(meta_of(v).shape) for v in _group_outputs(group)]):
        return None, f"its consumer {group.name} writes a padded output (the template stores unpadded tiles)"
    if isinstance(epilogue.target, CompiledKernel) and epilogue.target.backend != "triton":
        return None, f"its epilogue is a {epilogue.target.backend} kernel (the template is Triton)"
    product = view if view is not None else node
    # ``donors`` is the host code's note of which dying input an output may take (buffers.py); the
    # combined kernel gets its own.
    if sum(a is product for a in epilogue.args) != 1 or set(epilogue.kwargs) - {"donors"}:
        return None, "its epilogue takes it more than once"
    combined, inputs = combine(node, view, epilogue, group)
    try:
        plan = template_plan(combined)
    except UnsupportedGroup as exc:
        return None, str(exc)
    if view is not None and plan.view is None:
        return None, f"{view.name} is not a plain reshape of its contiguous result"
    return Site(node, view, epilogue, inputs, combined, plan), ""


def _group_outputs(group: FusedGroup) -> list:
    """The nodes ``group``'s subgraph returns, in output order."""
    return list(next(n for n in group.subgraph.graph.nodes if n.op == "output").args[0])


def combine(matmul: torch.fx.Node, view: torch.fx.Node | None, epilogue: torch.fx.Node,
            group: FusedGroup) -> tuple[FusedGroup, list]:
    """The combined group (the matmul node, the reshape of its result if any, then the epilogue
    group's nodes reading it) and the graph values it takes: the matmul's operands, then the
    epilogue's other inputs."""
    inner = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
    result = view if view is not None else matmul
    inputs: list = []
    for value in list(matmul.all_input_nodes) + [a for a in epilogue.args if a is not result]:
        if value not in inputs:
            inputs.append(value)
    graph = torch.fx.Graph()
    outer: dict = {}
    for i, value in enumerate(inputs):
        placeholder = graph.placeholder(f"in{i}")
        placeholder.meta = dict(value.meta)
        outer[value] = placeholder
    product = graph.node_copy(matmul, lambda n: outer[n])
    if view is not None:
        product = graph.node_copy(view, lambda n: product if n is matmul else outer[n])
    env = {p: (product if arg is result else outer[arg]) for p, arg in zip(inner, epilogue.args)}
    results = None
    for node in group.subgraph.graph.nodes:
        if node.op == "call_function":
            env[node] = graph.node_copy(node, lambda n: env[n])
        elif node.op == "output":
            results = tuple(env[n] for n in node.args[0])
    graph.output(results)
    combined = FusedGroup(name=f"mm_{group.name}", subgraph=torch.fx.GraphModule(torch.nn.Module(), graph),
                          domain=tuple(group.domain), reduced=())
    return combined, inputs


def device_of(site: Site) -> torch.device:
    """The device of the matmul's operands."""
    return meta_of(site.plan.a).device


class MatmulTemplate(Pass):
    """Replace extern matmul + epilogue kernel pairs by one Triton matmul kernel with the epilogue
    fused in, where the plan's ``choose`` says (by timing, under ``autotune``)."""

    name = "matmul-template"
    Options = MatmulTemplateOptions
    version = "6"
    cache_material = rules.cache_material   # rules a plugin adds or replaces change the output
    requires = frozenset({"codegen"})
    provides = frozenset({"matmul-template"})
    uses_fuel = True

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        options = self.options
        if options.choose == "never":
            return graph
        # codegen's buffer reuse ties dead matmul results to later kernels: plan it again afterwards
        replan = drop_reuse(graph)
        try:
            return self._rewrite(graph, context)
        finally:
            if replan and not reuse_buffers(graph, replan):
                graph.recompile()

    def _rewrite(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        options = self.options
        sites = []
        for node in list(graph.graph.nodes):
            if node.op != "call_function" or packet_name(node.target) not in MATMULS:
                continue
            site, why = find_site(node)
            if site is None:
                context.note(f"{node.name}: extern kept: {why}")
                continue
            if str(site.plan.dtype).removeprefix("torch.") not in options.dtypes:
                context.note(f"{node.name}: extern kept: dtype {site.plan.dtype} is not in dtypes {options.dtypes}")
                continue
            if site.plan.flops < options.min_flops:
                context.note(f"{node.name}: extern kept: {site.plan.flops} flops is under min_flops {options.min_flops}")
                continue
            sites.append(site)
        if not sites:
            return graph
        blocked = triton_missing() or (interpreter_problem() if interpreting() else None)
        cache = context.cache
        directory, persistent = (cache.dir, cache.enabled) if cache is not None else (None, True)
        rewritten: set = set()
        for site in sites:
            label = f"{site.matmul.name} + {site.group.name.removeprefix('mm_')}"
            device = device_of(site)
            reason = blocked
            if site.epilogue in rewritten:      # e.g. relu(x @ w1 + y @ w2): one matmul per epilogue
                reason = "its epilogue already fuses another matmul"
            if reason is None and device.type != "cuda" and not interpreting():
                reason = f"Triton runs {device.type} tensors only under TRITON_INTERPRET=1"
            if reason is None and options.choose == "autotune" and (device.type != "cuda" or interpreting()):
                reason = (f"choose: autotune times the template against the extern call on a CUDA GPU, and "
                          f"this graph runs on {device.type}" + (" (Triton interpreter)" if interpreting() else ""))
            if reason:
                context.note(f"{label}: extern kept: {reason}")
                continue
            configs = candidate_configs(site.plan.m, site.plan.n, site.plan.k, site.plan.dtype, options.candidates)
            name = f"triton_{site.group.name}"
            tf32 = site.plan.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
            sources = [template_source(site.plan, name, c, emulate_precision=options.emulate_precision_casts,
                                       allow_tf32=tf32) for c in configs]
            if options.choose == "always":
                chosen, message = sources[0], f"{label}: matmul template {configs[0].describe()} (choose: always)"
            else:
                chosen, message = decide(site, configs, sources, device, kernel_dir(directory, persistent=persistent),
                                         lambda s: load_module(write_source(s.source, directory, persistent=persistent)[0],
                                                               interpret=False))
                message = f"{label}: {message}"
            context.note(message)
            if chosen is None or not context.use_fuel(f"matmul template for {label}"):
                continue
            install(graph, site, chosen, directory, persistent)
            rewritten.add(site.epilogue)
        if rewritten:
            graph.graph.eliminate_dead_code()
            graph.recompile()
        return graph


def install(graph: torch.fx.GraphModule, site: Site, chosen: TritonSource, directory: str | None,
            persistent: bool) -> None:
    """Point the epilogue's node at the template kernel (taking the combined group's inputs) and
    drop the matmul node."""
    path, _ = write_source(chosen.source, directory, persistent=persistent)
    outputs = _group_outputs(site.group)
    kernel = MatmulTemplateKernel(site.group, chosen, load_module(path), path,
                                  [meta_of(v) for v in site.inputs], [meta_of(n) for n in outputs])
    site.epilogue.target = kernel
    site.epilogue.args = tuple(site.inputs)
    site.epilogue.kwargs = {}      # a donors note was about the epilogue kernel's own inputs
    site.epilogue.meta["fused_group"] = site.group
    if site.view is not None:
        graph.graph.erase_node(site.view)
    graph.graph.erase_node(site.matmul)


# -- the autotune decision ------------------------------------------------------------------------
def extern_call(site: Site) -> Callable[..., Any]:
    """The pair the template competes with, as one callable over the combined group's inputs:
    the ATen matmul (and reshape), then the epilogue's kernel (or group) on its result."""
    matmul, view, epilogue = site.matmul, site.view, site.epilogue
    result = view if view is not None else matmul
    position = {value: i for i, value in enumerate(site.inputs)}
    matmul_args = [(position[a], None) if isinstance(a, torch.fx.Node) else (None, a) for a in matmul.args]
    epilogue_args = [None if a is result else position[a] for a in epilogue.args]
    run_matmul, run_epilogue = FAST_BINDINGS.get(matmul.target, matmul.target), epilogue.target
    reshape = (view.target, tuple(view.args[1:])) if view is not None else None

    def call(*tensors: torch.Tensor) -> Any:
        product = run_matmul(*[tensors[i] if i is not None else v for i, v in matmul_args])
        if reshape is not None:
            product = reshape[0](product, *reshape[1])
        return run_epilogue(*[product if i is None else tensors[i] for i in epilogue_args])

    return call


def _key(site: Site, configs: list[TemplateConfig], sources: list[TritonSource], device: torch.device) -> str:
    """Independent of kernel and node names, so the same layer shape is timed once per machine."""
    import triton
    epilogue = site.epilogue.target
    extern = [packet_name(site.matmul.target), getattr(epilogue, "source", repr(epilogue)).replace(
        getattr(epilogue, "__name__", ""), "<epilogue>")]
    material = "\n".join([sources[0].source.replace(sources[0].name, "<kernel>"), repr(configs), *extern,
                          torch.cuda.get_device_name(device), triton.__version__, torch.__version__])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _read_decision(path: Path, configs: list[TemplateConfig]) -> dict | None:
    try:
        data = json.loads(path.read_text())
        config = TemplateConfig(**data["config"]) if data["config"] is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None                      # absent or unreadable: time again, then overwrite it
    if data.get("use") not in ("template", "extern") or (data["use"] == "template" and config not in configs):
        return None
    return dict(data, config=config)


def _write_decision(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        json.dump(payload, tmp, indent=1)
    os.replace(tmp.name, path)


def _progress(text: str) -> None:
    sys.stderr.write(f"\r[pipeline matmul-template] {text}\x1b[K" if sys.stderr.isatty()
                     else f"[pipeline matmul-template] {text}\n")
    sys.stderr.flush()


def decide(site: Site, configs: list[TemplateConfig], sources: list[TritonSource], device: torch.device,
           folder: Path, load: Callable[[TritonSource], ModuleType]) -> tuple[TritonSource | None, str]:
    """Time the template's candidates and the extern pair on ``device`` (or read the cached
    decision): the fastest template's source when it beats the pair, else None; and the note
    recording both times and the decision."""
    path = folder / f"mmtemplate_{_key(site, configs, sources, device)}.json"
    cached = _read_decision(path, configs)
    if cached is not None:
        times = f"template {cached['template_ms']:.4f} ms, extern {cached['extern_ms']:.4f} ms"
        if cached["use"] == "template":
            return sources[configs.index(cached["config"])], \
                f"matmul template {cached['config'].describe()} ({times}; cached decision)"
        return None, f"extern kept ({times}; cached decision)"
    from triton.testing import do_bench

    from passes.timing import random_like
    start = time.perf_counter()
    outputs = _group_outputs(site.group)
    timings: list[dict] = []
    with torch.cuda.device(device):
        tensors = [random_like(meta_of(v), device) for v in site.inputs]
        outs = [random_like(meta_of(n), device) for n in outputs]
        extern = extern_call(site)
        extern_ms = do_bench(lambda: extern(*tensors), warmup=10, rep=50)
        for i, (config, generated) in enumerate(zip(configs, sources)):
            _progress(f"{site.group.name}: candidate {i + 1}/{len(configs)} {config.describe()}")
            try:
                launch = load(generated).KERNEL[generated.grid]
                kwargs = dict(generated.constexprs, num_warps=config.num_warps, num_stages=config.num_stages)
                ms = do_bench(lambda: launch(*tensors, *outs, **kwargs), warmup=10, rep=50)
            except Exception as exc:  # noqa: BLE001 - a configuration Triton cannot build (shared memory) loses
                timings.append({"config": config.describe(), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            timings.append({"config": config.describe(), "ms": ms})
        if sys.stderr.isatty():
            sys.stderr.write("\n")
    timed = [(t["ms"], i) for i, t in enumerate(timings) if "ms" in t]
    seconds = time.perf_counter() - start
    if not timed:
        return None, f"extern kept: no template candidate runs ({len(configs)} tried, {seconds:.1f} s)"
    best_ms, best = min(timed)
    use = "template" if best_ms < extern_ms else "extern"
    _write_decision(path, {"use": use, "config": attrs.asdict(configs[best]) if use == "template" else None,
                           "template_ms": best_ms, "extern_ms": extern_ms, "best": configs[best].describe(),
                           "timings": timings})
    times = (f"template {best_ms:.4f} ms ({configs[best].describe()}), extern {extern_ms:.4f} ms; "
             f"{len(configs)} candidates, {seconds:.1f} s")
    if use == "template":
        return sources[best], f"matmul template {configs[best].describe()} ({times})"
    return None, f"extern kept ({times})"
