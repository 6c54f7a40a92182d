"""Runtime of the Triton backend: kernel modules on disk, the :class:`TritonKernel` a graph calls,
the ``codegen`` pass's Triton branch, and :func:`compile_for_sm90` (prove a kernel builds for the
H200 on a machine without a GPU).

Each generated module is written to ``<cache>/triton/t_<sha256 of the source>.py`` (the cache root
is the C++ backend's, see ``cpp_build.cache_dir``) and imported from there, because ``@triton.jit``
reads its function's source file; a source already on disk is reused (a cache hit), and a module
already imported in this process is imported once. Triton is imported lazily, only here and only
when a kernel is loaded or compiled, so the core import path never needs it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.fx

from pipeline.errors import PipelineError
from pipeline.fused import CompiledKernel, FusedGroup, meta_of
from pipeline.loops import UnsupportedGroup, analyze

from .cpp_build import cache_dir as _cache_dir
from .triton_source import TritonSource, kernel_source

_modules: dict[tuple[str, bool], ModuleType] = {}
_lock = threading.Lock()


class TritonCompileError(PipelineError):
    """Triton rejected a generated kernel (names the kernel and its source file)."""


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to run kernels on the CPU (numpy)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on", "y")


def triton_missing() -> str | None:
    """Why Triton cannot be used here (None when it can be imported)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'plan-pipeline[gpu]')"
    return None


def kernel_dir(configured: str | None = None) -> Path:
    path = _cache_dir(configured).parent / "triton"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_source(text: str, directory: str | None = None) -> tuple[Path, bool]:
    """Path of the module file holding ``text`` (named by its content hash) and whether it was
    already there. Writes are atomic."""
    folder = kernel_dir(directory)
    path = folder / f"t_{hashlib.sha256(text.encode()).hexdigest()[:32]}.py"
    if path.exists():
        return path, True
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    return path, False


def load_module(path: Path, *, interpret: bool | None = None) -> ModuleType:
    """Import a generated module; its kernels are interpreted (numpy) or jitted for the GPU as
    ``interpret`` says (default: as ``TRITON_INTERPRET`` says)."""
    interpret = interpreting() if interpret is None else interpret
    key = (str(path), interpret)
    with _lock:
        if key in _modules:
            return _modules[key]
        import triton
        name = f"pp_triton_{path.stem}" + ("_interpreted" if interpret else "")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = interpret   # read by @triton.jit when the module runs
            spec.loader.exec_module(module)
        sys.modules[name] = module
        _modules[key] = module
        return module


class TritonKernel(CompiledKernel):
    """A generated Triton kernel: allocates the outputs with the strides eager would give them on
    the inputs' device and launches the jitted function on its precomputed grid. Inputs with
    unexpected strides or on another kind of device run the group eagerly."""

    backend = "triton"

    def __init__(self, group: FusedGroup, generated: TritonSource, module: ModuleType, path: Path,
                 inputs: list, outputs: list):
        super().__init__(group, generated.source)
        self.generated = generated
        self.module = module
        self.path = path
        self.function = module.KERNEL
        self.launch = self.function[generated.grid]
        self.kwargs = dict(generated.constexprs, num_warps=generated.num_warps)
        self.empty = generated.grid[0] == 0
        self.in_strides = [tuple(v.stride()) for v in inputs]
        self.device = (inputs or outputs)[0].device
        self.outputs = [(tuple(v.shape), tuple(v.stride()), v.dtype) for v in outputs]

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        for tensor, strides in zip(inputs, self.in_strides):
            if tensor.stride() != strides or tensor.device.type != self.device.type:
                return self.group(*inputs)
        device = inputs[0].device if inputs else self.device
        outs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=device)
                     for shape, stride, dtype in self.outputs)
        if not self.empty:
            if device.type == "cuda" and device.index != torch.cuda.current_device():
                with torch.cuda.device(device):
                    self.launch(*inputs, *outs, **self.kwargs)
            else:
                self.launch(*inputs, *outs, **self.kwargs)
        return outs


def generate(graph: torch.fx.GraphModule, context: Any, *, emulate_precision: bool) -> torch.fx.GraphModule:
    """The ``codegen`` pass with ``backend: triton``: a TritonKernel for every fused group it can
    generate; the others keep running eagerly, with the reason in the report."""
    interpret = interpreting()
    blocked = triton_missing()
    directory = context.plan.cache.dir if context.plan is not None else None
    made, hits = 0, 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, FusedGroup):
            continue
        group = node.target
        placeholders = [n for n in group.subgraph.graph.nodes if n.op == "placeholder"]
        outputs = [meta_of(n) for n in next(n for n in group.subgraph.graph.nodes if n.op == "output").args[0]]
        device = (placeholders and meta_of(placeholders[0]).device) or outputs[0].device
        reason = blocked
        if reason is None and device.type != "cuda" and not interpret:
            reason = f"the triton backend runs {device.type} tensors only under TRITON_INTERPRET=1"
        if reason:
            context.note(f"{group.name}: runs eagerly: {reason}")
            continue
        try:
            nest = analyze(group)
            generated = kernel_source(nest, f"triton_{group.name}", emulate_precision=emulate_precision)
        except (UnsupportedGroup, NotImplementedError) as exc:
            context.note(f"{group.name}: runs eagerly: {exc}")
            continue
        path, hit = write_source(generated.source, directory)
        module = load_module(path, interpret=interpret)
        node.target = TritonKernel(group, generated, module, path, [meta_of(p) for p in placeholders],
                                   [meta_of(n) for n, _ in nest.outputs])
        made, hits = made + 1, hits + hit
    if made:
        context.note(f"{made} Triton kernel(s) in {kernel_dir(directory)} ({hits} cache hit(s))"
                     + (" run by the Triton interpreter" if interpret else ""))
        graph.recompile()
    return graph


def compile_for_sm90(subject: TritonKernel | TritonSource | str | os.PathLike, *,
                     arch: int = 90) -> dict:
    """Compile a generated kernel to PTX and a cubin for sm_90 (the H200) without a GPU.

    ``subject`` is a :class:`TritonKernel`, a :class:`TritonSource`, a generated module's source
    text or the path of its file. Returns the kernel name, PTX and cubin sizes in bytes, warps and
    shared memory; raises :class:`TritonCompileError` naming the kernel when Triton rejects it.
    Pointer arguments are assumed 16-byte aligned, as Triton specializes them at a real launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if isinstance(subject, TritonKernel):
        path = subject.path
    elif isinstance(subject, TritonSource):
        path, _ = write_source(subject.source)
    elif isinstance(subject, os.PathLike) or (isinstance(subject, str) and "\n" not in subject):
        path = Path(subject)
    else:
        path, _ = write_source(subject)
    module = load_module(path, interpret=False)     # helpers must be JITFunctions, not interpreted
    function = module.KERNEL
    raw = getattr(function, "fn", function)
    name = raw.__name__
    signature = dict(module.SIGNATURE)
    attrs = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values()) if kind.startswith("*")}
    try:
        jitted = function if isinstance(function, JITFunction) else JITFunction(raw)
        source = ASTSource(fn=jitted, signature=signature, constexprs=dict(module.CONSTEXPRS), attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": module.NUM_WARPS})
    except Exception as exc:  # noqa: BLE001 - Triton raises many types; name the kernel and file
        raise TritonCompileError(f"triton could not compile kernel {name} ({path}) for sm_{arch}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return {"name": name, "path": str(path), "ptx_bytes": len(compiled.asm["ptx"]),
            "cubin_bytes": len(compiled.asm["cubin"]), "num_warps": compiled.metadata.num_warps,
            "shared": compiled.metadata.shared}
