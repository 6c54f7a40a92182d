"""``codegen``: turn every fused group into a generated kernel.

Backend ``cpp``: C++ with OpenMP, compiled by the system compiler into one shared library per
graph (cached on disk by content hash, compiler, flags and CPU ISA) and called through ctypes from
the graph's straight-line Python code.

Backend ``triton``: one ``@triton.jit`` kernel per group (triton/source.py), written to a file
named by its content hash and launched by a :class:`~.triton_runtime.TritonKernel` on CUDA
tensors. On CPU targets the kernels run only under ``TRITON_INTERPRET=1`` (how CI tests them);
otherwise CPU groups stay eager with a note. Triton is imported only when this backend runs.

Backend ``auto``: ``cpp`` for CPU targets, ``triton`` for CUDA targets. Both backends read the
same :class:`passes.kernel_ir.loops.LoopNest`. Groups with symbolic sizes get kernels that take the
sizes as arguments (passes/codegen/specialize.py). Groups a backend cannot compile (groups on
another device, unsupported ops) keep running eagerly through their FusedGroup, with the reason in
the report.
"""
from __future__ import annotations

import copy
import ctypes
import operator
from typing import Literal

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, compat, device_types, non_negative, option
from passes.kernel_ir.groups import CompiledKernel, FusedGroup, fill_padding, meta_of, output_buffers, output_fills
from pipeline.cache.graph_io import Codec, UnsupportedGraph
from passes.kernel_ir.loops import UnsupportedGroup, analyze
from passes.kernel_ir.symbolic import SizeClass, binding
from passes.kernel_ir import rules

from .cpp.build import build, digest_path
from .cpp.launch import launcher as cpp_launcher
from .cpp.source import kernel_source, module_source
from .buffers import reuse_buffers
from passes.kernel_ir.extern_layouts import align_extern_inputs
from .host import fold_views, lower_linear, to_host_module
from .specialize import METRIC as SIZES_METRIC, SizeRuntime, specialize_graph


@attrs.frozen
class CodegenOptions:
    backend: Literal["cpp", "triton", "auto"] = option(
        "cpp", "cpp: C++/OpenMP kernels for CPU tensors; triton: Triton kernels for CUDA tensors (CPU "
               "tensors only under TRITON_INTERPRET=1); auto: cpp for CPU targets, triton for CUDA targets.")
    emulate_precision_casts: bool = option(
        True, "Round fp16/bf16 intermediates after every op, as eager does (off: keep fp32 between ops).")
    autotune: bool = option(
        False, "triton: time candidate launch shapes (block sizes, rows per program, warps) of every CUDA "
               "kernel once and keep the fastest; the choice is cached on disk beside the kernels.", tune=(False, True))
    fold_views: bool = option(
        True, "Replace each chain of view operators on a computed tensor (view, permute, split...) by one "
              "as_strided call with the chain's layout (symbolic sizes computed from the graph's size inputs).",
        tune=(True, False))
    lower_linear: bool = option(
        True, "Call aten.linear for addmm/mm of a transposed 2-D weight (the same ATen kernel, one call "
              "instead of two).", tune=(True, False))
    reuse_buffers: list[str] = option(
        ["cuda"], "Devices where a generated kernel writes an output into the buffer of a tensor that died "
                  "before the call with the same layout, instead of allocating one (fewer allocator calls "
                  "per run; on the CPU malloc's recently freed blocks are warmer in cache, so not by default).",
        check=device_types)
    host_code: bool = option(
        True, "Run the graph through our generated host source, which calls ATen entry points and kernel "
              "launchers directly (off: FX's generated code).")
    pitch_rows: bool = option(
        True, "triton: run rows stored with a padded pitch (pad-mm's 50257-wide logits in 50264-wide rows) "
              "over the padded extent, so their loads and stores vectorize, and write output pads' padding "
              "in the kernel; each call checks that such inputs' storage holds the padding, else the exact "
              "kernel runs (see passes/codegen/triton/pitch.py).", tune=(True, False))
    eager_norm_statistics: bool = option(
        True, "triton: compute the mean and variance of a row of at most eager_norm_max_row elements (layer "
              "norm's) in the order of ATen's CUDA layer-norm kernel (Welford in 128 threads, its shuffle "
              "tree), so layer-norm outputs have eager's bits and a model's outputs stay close to eager's "
              "(benchmarks/results/gpu-2026-11-30-f.md; passes/codegen/triton/welford.py).")
    eager_norm_max_row: int = option(
        1024, "triton: the longest row eager_norm_statistics applies to; longer rows take two sums. The exact "
              "statistics cost nothing measurable on GPT-2's rows of 768 but slow down an issue-bound kernel "
              "on rows of 4096 (benchmarks/results/gpu-2026-11-30-f.md).", check=non_negative)
    eager_norm_min_row: int = option(
        256, "triton: the shortest row eager_norm_statistics applies to; shorter rows take two sums in a "
             "persistent kernel of several rows per program. ATen's order needs 128 threads of 4 lanes per "
             "row, so on a short row most lanes idle (a ConvNeXt layer norm over 96 channels took 131 us per "
             "call where Inductor's kernel took 46 us on an H100: "
             "benchmarks/results/zoo-kernels-2026-12-06-h100-convnet-diffusion.txt).", check=non_negative)
    split_reductions: bool = option(
        True, "triton: run a reduction that would launch few programs for its rows (a backward's bias and "
              "norm-weight column sums, a batch norm's per-channel sums) as two kernels: partial results "
              "over chunks of rows, then their combination with the group's epilogue "
              "(passes/codegen/triton/split.py); such a group with several passes or full-level outputs "
              "runs as one such pair per pass and a pointwise kernel (passes/codegen/triton/stages.py).",
        tune=(True, False))
    compile_workers: int = option(
        8, "triton: threads compiling a graph's distinct CUDA kernels in parallel when it is generated, "
           "before their first launch (0: each kernel compiles at its first launch, one after another).",
        check=non_negative)
    size_specializations: int = option(
        64, "Groups with symbolic sizes (a graph Dynamo captured with dynamic sizes) get kernels that take the "
            "sizes as arguments, each valid for a size class (the sizes that agree with every decision its "
            "generation took: a block size, a parallel threshold); this is the most times per graph that kernels "
            "are generated for sizes outside every class so far (the compile-time sizes count as the first); "
            "later such sizes run those groups eagerly. 0: they always run eagerly (see "
            "passes/codegen/specialize.py).", check=non_negative)


class CppKernel(CompiledKernel):
    """A compiled C++ kernel: allocates the outputs with the strides eager would give them and
    calls the function with raw pointers. Inputs with unexpected strides or dtypes (a shape function
    that disagreed with the real kernel), or not on the CPU, run the group eagerly.

    It describes itself for the compile cache (``to_data``/``from_data``): its group, its source and
    the whole library's source; rebuilding it loads the library from the kernel cache (compiling it
    again only when the library is gone)."""

    backend = "cpp"

    def __init__(self, group: FusedGroup, source: str, function, inputs: list, outputs: list,
                 library_source: str = "", library_path: str = "", size_class: SizeClass | None = None):
        super().__init__(group, source)
        self.size_class = size_class
        self.function = function
        self.in_dtypes = tuple(v.dtype for v in inputs)
        self.library_source = library_source
        self.library_path = library_path
        if self.size_class is None:
            self._layouts(tuple(tuple(v.stride()) for v in inputs),
                          [(tuple(v.shape), tuple(v.stride()), v.dtype) for v in outputs])
        else:
            self.out_dtypes = [v.dtype for v in outputs]

    def _layouts(self, in_strides: tuple, outputs: list) -> None:
        self.in_strides = in_strides
        self.outputs = outputs
        self.fills = output_fills(self.group, [shape for shape, _, _ in outputs])   # output pads' padding

    in_place_capable = True     # a pointwise loop loads in[i] before it stores out[i]
    accepts_reuse = True

    def __call__(self, *inputs: torch.Tensor, donors: tuple = (), reuse: tuple = ()) -> tuple:
        if tuple(map(_stride, inputs)) != self.in_strides or tuple(map(_dtype, inputs)) != self.in_dtypes \
                or not all(map(_is_cpu, inputs)):
            return self.group(*inputs)
        outs = output_buffers(self.outputs, inputs, donors, reuse, _empty_cpu)
        if self.fills:
            fill_padding(outs, self.fills)
        self.function(*[t.data_ptr() for t in inputs], *[o.data_ptr() for o in outs], *self.size_args)
        return outs

    def launcher(self, kwargs: dict):
        """A launch function for one call site of the host code (see passes/codegen/cpp/launch.py):
        for a kernel of static layouts, or a size-class kernel called at particular sizes
        (:meth:`at`), without output pads, where the site passes at most ``donors=``."""
        if not hasattr(self, "in_strides") or self.fills or set(kwargs) - {"donors"}:
            return None     # a size-class kernel itself has no layouts until called at sizes
        donors = tuple(kwargs.get("donors", ()))
        made = self.__dict__.setdefault("_launchers", {})    # written once per kernel and donors
        if donors not in made:
            made[donors] = cpp_launcher(self, donors)
        return made[donors]

    def at(self, binding: dict) -> "CppKernel":
        """This size-class kernel (one generated for symbolic sizes) called at ``binding``
        (``{symbol: value}``): the same library function, with those sizes as its arguments."""
        kernel = copy.copy(self)
        kernel._launchers = {}
        kernel.size_args = self.size_class.values(binding)
        in_strides, outputs, _ = self.size_class.layouts(kernel.size_args)
        kernel._layouts(in_strides, [(shape, stride, dtype) for (shape, stride), dtype in zip(outputs, self.out_dtypes)])
        return kernel

    def to_data(self, codec: Codec) -> dict:
        """Plain data for the compile cache (see :class:`pipeline.cache.graph_io.Describable`)."""
        if not self.library_source:
            raise UnsupportedGraph(f"cpp kernel {self.group.name} does not know its library's source")
        codec.need_file(self.library_path)
        codec.need_file(digest_path(self.library_path))
        data = {"group": self.group.to_data(codec), "source": codec.put_text(self.source),
                "library": codec.put_text(self.library_source),
                "in_dtypes": [_dtype_name(d) for d in self.in_dtypes]}
        if self.size_class is not None:     # a size-class kernel: layouts are expressions of its sizes
            return {**data, "size_class": self.size_class.to_data(),
                    "out_dtypes": [_dtype_name(d) for d in self.out_dtypes]}
        return {**data, "in_strides": [list(s) for s in self.in_strides],
                "outputs": [[list(shape), list(stride), _dtype_name(dtype)] for shape, stride, dtype in self.outputs]}

    @classmethod
    def from_data(cls, data: dict, codec: Codec) -> "CppKernel":
        """The kernel :meth:`to_data` described, its library loaded from the kernel cache."""
        group = FusedGroup.from_data(data["group"], codec)
        library_source = codec.text(data["library"])
        library, path, _ = build(library_source, directory=codec.cache_dir)
        kernel = cls.__new__(cls)
        CompiledKernel.__init__(kernel, group, codec.text(data["source"]))
        kernel.in_dtypes = tuple(getattr(torch, d) for d in data["in_dtypes"])
        if "size_class" in data:
            kernel.size_class = SizeClass.from_data(data["size_class"])
            kernel.out_dtypes = [getattr(torch, d) for d in data["out_dtypes"]]
            kernel.function = _bind_function(library, group.name, len(kernel.in_dtypes) + len(kernel.out_dtypes),
                                             len(kernel.size_class.symbols))
        else:
            kernel.function = _bind_function(library, group.name, len(data["in_strides"]) + len(data["outputs"]))
            kernel._layouts(tuple(tuple(s) for s in data["in_strides"]),
                            [(tuple(shape), tuple(stride), getattr(torch, d)) for shape, stride, d in data["outputs"]])
        kernel.library_source = library_source
        kernel.library_path = str(path.with_suffix(".so"))
        return kernel


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bind_function(library: ctypes.CDLL, name: str, arguments: int, sizes: int = 0):
    """The library's function ``name`` taking ``arguments`` raw pointers, then ``sizes`` int64
    size arguments."""
    function = getattr(library, name)
    function.argtypes = [ctypes.c_void_p] * arguments + [ctypes.c_int64] * sizes
    function.restype = None
    return function


_stride = torch.Tensor.stride
_is_cpu = operator.attrgetter("is_cpu")
_dtype = operator.attrgetter("dtype")


_empty_cpu = compat.empty_strided_cpu()


class Codegen(Pass):
    """Generate a kernel for every fused group (C++/OpenMP on CPU, Triton on CUDA)."""

    name = "codegen"
    Options = CodegenOptions
    version = "32"
    cache_material = rules.cache_material   # rules a plugin adds or replaces change the output
    requires = frozenset({"fused"})
    provides = frozenset({"codegen"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        build = self.backend(context.target)
        specialize_graph(graph, SizeRuntime(build, context.target, context.cache, self.options.size_specializations,
                                            context, self), context)
        graph = build(graph, context)
        return self.host(graph, context)

    def backend(self, target: str):
        """``build(graph, context)``: the backend generating kernels for the FusedGroup nodes of a
        graph compiled for ``target``, with this pass's options."""
        backend = self.options.backend
        if backend == "auto":
            backend = "triton" if target == "cuda" else "cpp"
        if backend != "triton":
            return self.generate_cpp
        options = self.options

        def triton(graph: torch.fx.GraphModule, context) -> torch.fx.GraphModule:
            from .triton.generate import generate   # imports triton lazily
            return generate(graph, context, emulate_precision=options.emulate_precision_casts,
                            autotune=options.autotune, compile_workers=options.compile_workers,
                            pitch_rows=options.pitch_rows, split_reductions=options.split_reductions,
                            eager_norm_statistics=options.eager_norm_statistics,
                            eager_norm_max_row=options.eager_norm_max_row,
                            eager_norm_min_row=options.eager_norm_min_row)
        return triton

    def host(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        """The host-side rewrites and generated host source (see host.py)."""
        copied = align_extern_inputs(graph)
        if copied:
            context.note(f"host: {copied} attention bias(es) copied into the aligned layout the fused kernels need")
        if self.options.fold_views:
            folded = fold_views(graph)
            if folded:
                context.note(f"host: {folded} view chain(s) folded into as_strided calls")
        if self.options.lower_linear:
            lowered = lower_linear(graph)
            if lowered:
                context.note(f"host: {lowered} addmm/mm of a transposed weight call aten.linear")
        if self.options.reuse_buffers:
            reused = reuse_buffers(graph, self.options.reuse_buffers)
            if reused:
                context.note(f"host: {reused} kernel output(s) written into buffers of tensors that died earlier")
        if self.options.host_code:
            graph = to_host_module(graph)
        return graph

    def generate_cpp(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        """The ``cpp`` backend: one shared library with a function per fused group."""
        planned = []
        for node in graph.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, FusedGroup):
                continue
            group = node.target
            if context.target != "cpu":
                context.note(f"{group.name}: runs eagerly: the cpp backend compiles CPU kernels only")
                continue
            try:
                with binding(group.decisions):      # a size class of a symbolic group, or nothing
                    nest = analyze(group)
                    source = kernel_source(nest, group.name, emulate_precision=self.options.emulate_precision_casts)
            except (UnsupportedGroup, NotImplementedError, *((TypeError,) if group.decisions is not None else ())) as exc:
                context.note(f"{group.name}: runs eagerly: {exc}")
                continue
            planned.append((node, group, nest, source))
        if not planned:
            return graph
        cache = context.cache
        library_source = module_source([source for *_, source in planned])
        library, path, hit = build(library_source, directory=cache.dir if cache is not None else None,
                                   persistent=cache.enabled if cache is not None else True)
        context.note(f"{len(planned)} C++ kernel(s) in {path} ({'cache hit' if hit else 'compiled'})")
        for node, group, nest, source in planned:
            placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
            inputs, outputs = [meta_of(p) for p in placeholders], [meta_of(n) for n, _ in nest.outputs]
            size_class = SizeClass.of(nest.decisions, inputs, outputs) if nest.decisions is not None else None
            function = _bind_function(library, group.name, len(placeholders) + len(nest.outputs),
                                      len(size_class.symbols) if size_class else 0)
            node.target = CppKernel(group, source, function, inputs, outputs, library_source=library_source,
                                    library_path=str(path.with_suffix(".so")), size_class=size_class)
        graph.recompile()
        return graph
