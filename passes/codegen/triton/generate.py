"""The ``codegen`` pass's Triton branch: a :class:`~.runtime.TritonKernel` for every fused group
the backend can generate (with the special kernels: pitched rows, split reductions, ATen-ordered
row statistics, staged reductions), the others left to run eagerly with the reason noted."""
from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import torch
import torch.fx

from passes.kernel_ir.groups import FusedGroup, meta_of
from passes.kernel_ir.loops import UnsupportedGroup, analyze
from passes.kernel_ir.symbolic import SizeClass, binding

from .autotune import candidate_blocks
from .pitch import pitch_nest
from .precompile import precompile
from .runtime import TritonKernel, interpreter_problem, interpreting, kernel_dir, load_module, triton_missing, write_source
from .nest import TritonNest
from .source import TritonSource, kernel_source
from .split import build_split_kernel, split_plan, wants_stages
from .stages import build_staged_kernel


def generate(graph: torch.fx.GraphModule, context: Any, *, emulate_precision: bool,
             autotune: bool = False, compile_workers: int = 0, pitch_rows: bool = True,
             split_reductions: bool = True, eager_norm_statistics: bool = False,
             eager_norm_max_row: int = 0, eager_norm_min_row: int = 0) -> torch.fx.GraphModule:
    """The ``codegen`` pass with ``backend: triton``: a TritonKernel for every fused group it can
    generate; the others keep running eagerly, with the reason in the report. With ``autotune``
    each CUDA kernel's launch shape is chosen by timing candidates (triton/autotune.py). With
    ``compile_workers`` the CUDA kernels' binaries are compiled in parallel (:func:`precompile`).
    With ``pitch_rows``, nests over padded rows run over the padded extent (triton/pitch.py); with
    ``split_reductions``, strided-axis reductions with few programs run in two kernels
    (triton/split.py); with ``eager_norm_statistics``, the variances of rows of
    ``eager_norm_min_row`` to ``eager_norm_max_row`` elements are computed in the order of ATen's
    CUDA layer norm (triton/welford.py)."""

    interpret = interpreting()
    blocked = triton_missing()
    if blocked is None and interpret:
        blocked = interpreter_problem()
    cache = context.cache
    directory, persistent = (cache.dir, cache.enabled) if cache is not None else (None, True)
    maker = _KernelMaker(context, emulate_precision=emulate_precision, autotune=autotune, pitch_rows=pitch_rows,
                         split_reductions=split_reductions, eager_norm_statistics=eager_norm_statistics,
                         eager_norm_max_row=eager_norm_max_row, eager_norm_min_row=eager_norm_min_row,
                         directory=directory, persistent=persistent, interpret=interpret)
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, FusedGroup):
            continue
        group = node.target
        placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
        values = [meta_of(n) for n in placeholders] + list(
            meta_of(n) for n in next(n for n in group.subgraph.graph.nodes if n.op == "output").args[0])
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        reason = blocked
        if reason is None and device.type != "cuda" and not interpret:
            reason = f"the triton backend runs {device.type} tensors only under TRITON_INTERPRET=1"
        if reason:
            context.note(f"{group.name}: runs eagerly: {reason}")
            continue
        symbolic = group.decisions is not None      # generated for a size class (passes/codegen/specialize.py)
        try:
            node.target = maker.kernel(group, device)
        except (UnsupportedGroup, NotImplementedError, *((TypeError,) if symbolic else ())) as exc:
            context.note(f"{group.name}: runs eagerly: {exc}")
    if maker.made:
        context.note(f"{maker.made} Triton kernel(s) in {kernel_dir(directory, persistent=persistent)} "
                     f"({maker.hits} cache hit(s))" + (" run by the Triton interpreter" if interpret else ""))
        graph.recompile()
    if maker.cuda_kernels and compile_workers:
        compiled, seconds = precompile(maker.cuda_kernels, compile_workers)
        if compiled:
            context.note(f"{compiled} distinct Triton kernel binaries compiled by {compile_workers} thread(s) "
                         f"in {seconds:.2f} s before the first launch")
    return graph


@attrs.define
class _KernelMaker:
    """Makes the kernel of one group with :func:`generate`'s settings, counting what it made."""

    context: Any
    emulate_precision: bool
    autotune: bool
    pitch_rows: bool
    split_reductions: bool
    eager_norm_statistics: bool
    eager_norm_max_row: int
    eager_norm_min_row: int
    directory: Any
    persistent: bool
    interpret: bool
    made: int = 0
    hits: int = 0
    cuda_kernels: list = attrs.field(factory=list)      # (kernel, argument dtypes) for precompile

    def kernel(self, group: FusedGroup, device: torch.device) -> Any:
        """The kernel of ``group`` (raises UnsupportedGroup, NotImplementedError, or TypeError for
        a size class, when there is none)."""
        context, directory, persistent, interpret = self.context, self.directory, self.persistent, self.interpret
        emulate_precision = self.emulate_precision
        placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
        on_gpu = device.type == "cuda" and not interpret
        symbolic = group.decisions is not None
        with binding(group.decisions):
            nest = TritonNest.of(analyze(group))
            # Pitched rows serve pad-mm's static padding; a size class runs the exact kernel.
            exact = pitch_nest(nest) if self.pitch_rows and not symbolic else None
            if exact is not None:
                nest, exact = exact, nest
            row = math.prod(nest.sizes[a] for a in nest.reduced)
            nest.aten_statistics = (self.eager_norm_statistics and bool(nest.reduced)
                                    and self.eager_norm_min_row <= row <= self.eager_norm_max_row)
            if self.split_reductions and wants_stages(nest):
                try:
                    staged = build_staged_kernel(group, nest, lambda stage: self.kernel(stage, device))
                except (UnsupportedGroup, NotImplementedError) as exc:
                    context.note(f"{group.name}: stays one kernel: its stages cannot be generated: {exc}")
                else:
                    context.note(f"{group.name}: staged reduction, {len(staged.kernels)} kernels")
                    return staged
            split = split_plan(nest) if self.split_reductions else None
            if split is None:
                generated = kernel_source(nest, emulate_precision=emulate_precision)
            elif symbolic:
                raise UnsupportedGroup(f"a split reduction ({split.count} chunks) is made for static sizes")
        if split is not None:
            kernel, stages = build_split_kernel(group, nest, split, emulate_precision=emulate_precision,
                                                directory=directory, persistent=persistent, interpret=interpret)
            self.made += 1
            context.note(f"{group.name}: split reduction, {split.count} chunks of {split.chunk} rows")
            if on_gpu:
                self.cuda_kernels.extend(stages)
            return kernel
        if self.autotune and on_gpu and not symbolic:
            from .autotune import tune

            def jitted(source: TritonSource):
                return load_module(write_source(source.source, directory, persistent=persistent)[0],
                                   interpret=False).KERNEL

            generated, message = tune(nest, generated.name, emulate_precision=emulate_precision,
                                      inputs=[meta_of(p) for p in placeholders],
                                      outputs=[meta_of(n) for n, _ in nest.outputs], device=device,
                                      folder=kernel_dir(directory, persistent=persistent), load=jitted)
            context.note(message)
        path, hit = write_source(generated.source, directory, persistent=persistent)
        module = load_module(path, interpret=interpret)
        arguments = [meta_of(p) for p in placeholders], [meta_of(n) for n, _ in nest.outputs]
        pitched = {}
        if exact is not None:
            exact_source = kernel_source(exact, emulate_precision=emulate_precision)
            exact_path, _ = write_source(exact_source.source, directory, persistent=persistent)
            outputs = [n for n, _ in nest.outputs]
            pitched = {"exact": TritonKernel(group, exact_source, load_module(exact_path, interpret=interpret),
                                             exact_path, *arguments),
                       "covers": nest.pitch.spans,
                       "padded_outputs": tuple(outputs.index(n) for n in nest.pitch.outputs)}
            context.note(f"{group.name}: rows run over their padded extent {nest.pitch.extent} "
                         f"(of {nest.pitch.size})")
        if symbolic:    # a size-class kernel: the Specializer calls it through at(binding)
            size_class = SizeClass.of(nest.decisions, *arguments, launch=generated.grid)
            kernel = TritonKernel(group, generated, module, path, *arguments, size_class=size_class)
        else:
            kernel = TritonKernel(group, generated, module, path, *arguments, **pitched)
            kernel.alternatives = _other_launch_shapes(nest, generated, emulate_precision, directory, persistent)
        self.made, self.hits = self.made + 1, self.hits + hit
        if on_gpu:
            self.cuda_kernels.append((kernel.at(group.decisions.binding) if symbolic else kernel,
                                      [v.dtype for v in arguments[0] + arguments[1]]))
        return kernel


def _other_launch_shapes(nest: Any, generated: TritonSource, emulate_precision: bool, directory: Any,
                         persistent: bool) -> Callable[[], list]:
    """The nest's other candidate launch shapes as (source, path, module), made only when asked:
    what a kernel tries when Triton cannot compile the shape it was generated with."""
    def make() -> list:
        out = []
        for blocks in candidate_blocks(nest):
            source = kernel_source(nest, generated.name, emulate_precision=emulate_precision, blocks=blocks)
            if source.source != generated.source:
                path, _ = write_source(source.source, directory, persistent=persistent)
                out.append((source, path, load_module(path, interpret=False)))
        return out
    return make


