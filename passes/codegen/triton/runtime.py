"""Runtime of the Triton backend: kernel modules on disk, the :class:`TritonKernel` a graph calls,
and :func:`compile_for_sm90` (prove a kernel builds for the
H200 on a machine without a GPU).

Each generated module is written to ``<cache>/triton/t_<sha256 of the source>.py`` (the cache root
is the C++ backend's, see ``cpp_build.cache_dir``) and imported from there, because ``@triton.jit``
reads its function's source file; a source already on disk is reused (a cache hit), and a module
already imported in this process is imported once. Triton is imported lazily, only here and only
when a kernel is loaded or compiled, so the core import path never needs it.

The Triton interpreter (``TRITON_INTERPRET=1``, how CI runs kernels on CPU tensors) has to be on
when triton itself is first imported (its ``tl.sum``... are decorated then), and a process that
interpreted kernels cannot compile for a GPU any more (the interpreter patches
``triton.language``); :func:`interpreter_problem` and :func:`compile_all_for_sm90` deal with both.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import torch.fx

from pipeline import compat
from pipeline.cache import cache_root
from pipeline.errors import PipelineError
from passes.kernel_ir.groups import CompiledKernel, FusedGroup, fill_padding, output_buffers, output_fills
from passes.kernel_ir.symbolic import SizeClass

from ..cpp.build import CacheFolderError, clean_stale, warn_private
from .pitch import storage_covers
from .source import TritonSource

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


_private: list[Path] = []


def kernel_dir(configured: str | None = None, *, persistent: bool = True) -> Path:
    """``<cache root>/triton``, or with ``persistent=False`` (plan ``cache: {enabled: false}``) a
    private temporary folder of this process. A cache folder that cannot be made degrades to the
    private folder, with one warning."""
    if persistent:
        path = cache_root(configured) / "triton"
        try:
            path.mkdir(parents=True, exist_ok=True)
            clean_stale(path)
            return path
        except OSError as exc:
            warn_private(CacheFolderError(f"cannot create the kernel cache folder {path}: {exc.strerror or exc}"),
                         kernel_dir(persistent=False))
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="plan-pipeline-triton-")))
    return _private[0]


def write_source(text: str, directory: str | None = None, *, persistent: bool = True) -> tuple[Path, bool]:
    """Path of the module file holding ``text`` (named by its content hash) and whether it was
    already there. Writes are atomic. A file already there is used only when it still holds
    exactly ``text``: a damaged one is replaced, with a warning. A cache folder that cannot be
    written degrades to this process's private folder, with one warning."""
    folder = kernel_dir(directory, persistent=persistent)
    try:
        return _write_source_in(folder, text)
    except OSError as exc:
        if folder == kernel_dir(persistent=False):
            raise
        warn_private(CacheFolderError(f"cannot write into the kernel cache folder {folder}: {exc.strerror or exc}"),
                     kernel_dir(persistent=False))
    return _write_source_in(kernel_dir(persistent=False), text)


def _write_source_in(folder: Path, text: str) -> tuple[Path, bool]:
    path = folder / f"t_{hashlib.sha256(text.encode()).hexdigest()[:32]}.py"
    if path.exists():
        try:
            intact = path.read_bytes() == text.encode()
        except OSError:
            intact = False
        if intact:
            return path, True
        warnings.warn(f"pipeline: Triton kernel module {path} does not hold the source its name is the "
                      f"SHA-256 of: replaced", stacklevel=3)
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
        try:
            tmp.write(text)
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)     # never leave a half-written file behind (disk full, Ctrl-C)
            raise
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
    unexpected strides or on another kind of device run the group eagerly.

    The first launch goes through Triton's ``JITFunction`` (which compiles, or finds the binary in
    Triton's cache); later launches on the same device call the compiled kernel's launcher
    directly, skipping the argument binding and cache lookup Triton repeats on every
    ``kernel[grid](...)`` call (≈ 10 µs of host time per launch). Triton's launch hooks
    (``knobs.runtime.launch_enter_hook``, used by profilers) are called as Triton calls them."""

    backend = "triton"

    def __init__(self, group: FusedGroup, generated: TritonSource, module: ModuleType, path: Path,
                 inputs: list, outputs: list, *, exact: "TritonKernel | None" = None, covers: tuple = (),
                 padded_outputs: tuple = (), size_class: Any = None):
        super().__init__(group, generated.source)
        self.size_class = size_class
        self._pitched(exact, covers, padded_outputs)
        device = (inputs or outputs)[0].device
        if size_class is None:
            self._setup(generated, module, path, in_strides=tuple(tuple(v.stride()) for v in inputs), device=device,
                        outputs=[(tuple(v.shape), tuple(v.stride()), v.dtype) for v in outputs])
        else:       # layouts and grid come with a binding: see at()
            self.out_dtypes = [v.dtype for v in outputs]
            self._setup(generated, module, path, in_strides=(), device=device, outputs=[], grid=(0,))

    def at(self, binding: dict) -> "TritonKernel":
        """This size-class kernel (generated for symbolic sizes) at ``binding`` (``{symbol:
        value}``): the same jitted function, launched with those sizes as its size arguments on the
        grid they give. Triton compiles one binary per specialization of the size arguments (a
        value of 1, a multiple of 16, other) at the first launch that needs it."""
        kernel = copy.copy(self)
        kernel.size_args = self.size_class.values(binding)
        in_strides, outputs, grid = self.size_class.layouts(kernel.size_args)
        kernel._setup(self.generated, self.module, self.path, in_strides=in_strides, device=self.device,
                      outputs=[(shape, stride, dtype) for (shape, stride), dtype in zip(outputs, self.out_dtypes)],
                      grid=tuple(grid))
        return kernel

    def _setup(self, generated: TritonSource, module: ModuleType, path: Path, *, in_strides: tuple,
               device: torch.device, outputs: list, grid: tuple | None = None) -> None:
        self.generated = generated
        self.module = module
        self.path = path
        self.function = module.KERNEL
        self.grid = generated.grid if grid is None else grid
        self.launch = self.function[self.grid]
        self.kwargs = dict(generated.constexprs, **generated.launch_options())
        self.empty = self.grid[0] == 0 or not outputs    # nothing to compute or nothing to store
        self.in_strides = in_strides
        self.device = device
        self.outputs = outputs
        self.fills = output_fills(self.group, [shape for shape, _, _ in outputs])   # output pads' padding
        if self.padded_outputs:         # a pitched kernel writes these pads' last-dim padding itself
            self.fills = [(k, [r for r in regions if k not in self.padded_outputs or r[0] != len(outputs[k][0]) - 1],
                           value) for k, regions, value in self.fills]
            self.fills = [fill for fill in self.fills if fill[1]]
        self._fast: tuple | None = None     # what a direct launch on one device needs, see below
        self.alternatives: Callable[[], list] | None = getattr(self, "alternatives", None)

    def _pitched(self, exact: "TritonKernel | None", covers: tuple, padded_outputs: tuple) -> None:
        """A pitched kernel (triton/pitch.py): ``covers`` lists (input position, elements) its
        inputs' storage must hold, ``exact`` runs when they do not; ``padded_outputs`` are the
        outputs whose last-dim padding the kernel writes."""
        self.exact = exact
        self.covers = tuple(tuple(c) for c in covers)
        self.padded_outputs = tuple(padded_outputs)
        self.exact_calls = 0        # calls whose inputs' storage did not cover the padding

    def to_data(self, codec: Any) -> dict:
        """Plain data for the compile cache (see :class:`pipeline.cache.graph_io.Describable`): the
        group, the generated module's text and launch parameters, the strides it was built for
        (and a pitched kernel's exact twin)."""
        g = self.generated
        codec.need_file(self.path)
        data = {"group": self.group.to_data(codec), "name": g.name, "source": codec.put_text(g.source),
                "signature": dict(g.signature), "constexprs": dict(g.constexprs), "grid": list(g.grid),
                "num_warps": g.num_warps, "maxnreg": g.maxnreg, "persistent": g.persistent, "sizes": list(g.sizes),
                "device": str(self.device),
                "covers": [list(c) for c in self.covers], "padded_outputs": list(self.padded_outputs),
                "exact": self.exact.to_data(codec) if self.exact is not None else None}
        if self.size_class is not None:     # a size-class kernel: layouts are expressions of its sizes
            return {**data, "size_class": self.size_class.to_data(),
                    "out_dtypes": [str(d).removeprefix("torch.") for d in self.out_dtypes]}
        return {**data, "in_strides": [list(s) for s in self.in_strides],
                "outputs": [[list(shape), list(stride), str(dtype).removeprefix("torch.")]
                            for shape, stride, dtype in self.outputs]}

    @classmethod
    def from_data(cls, data: dict, codec: Any) -> "TritonKernel":
        """The kernel :meth:`to_data` described, its module imported from the kernel cache (written
        there again from the described text when it is gone)."""
        device = torch.device(data["device"])
        if device.type != "cuda" and not interpreting():
            raise TritonCompileError(f"kernel {data['name']} runs {device.type} tensors, which needs "
                                     "TRITON_INTERPRET=1 in this process")
        generated = TritonSource(name=data["name"], source=codec.text(data["source"]),
                                 signature=dict(data["signature"]), constexprs=dict(data["constexprs"]),
                                 grid=tuple(data["grid"]), num_warps=data["num_warps"],
                                 persistent=data["persistent"], maxnreg=data.get("maxnreg"),
                                 sizes=tuple(data.get("sizes", ())))
        path, _ = write_source(generated.source, codec.cache_dir)
        kernel = cls.__new__(cls)
        CompiledKernel.__init__(kernel, FusedGroup.from_data(data["group"], codec), generated.source)
        kernel._pitched(cls.from_data(data["exact"], codec) if data.get("exact") else None,
                        data.get("covers", ()), data.get("padded_outputs", ()))
        if "size_class" in data:
            kernel.size_class = SizeClass.from_data(data["size_class"])
            kernel.out_dtypes = [getattr(torch, d) for d in data["out_dtypes"]]
            kernel._setup(generated, load_module(path), path, in_strides=(), device=device, outputs=[], grid=(0,))
            return kernel
        kernel._setup(generated, load_module(path), path, in_strides=tuple(tuple(s) for s in data["in_strides"]),
                      device=device, outputs=[(tuple(shape), tuple(stride), getattr(torch, d))
                                              for shape, stride, d in data["outputs"]])
        return kernel

    @property
    def __name__(self) -> str:
        """The jitted function's name (content-derived, see triton_source.kernel_source): what a
        profiler shows, so the report and the host code use it too."""
        return self.generated.name

    in_place_capable = True     # a pointwise program loads its block before it stores it
    accepts_reuse = True

    def __call__(self, *inputs: torch.Tensor, donors: tuple = (), reuse: tuple = ()) -> tuple:
        if self.covers and not storage_covers(inputs, self.covers):
            self.exact_calls += 1
            return self.exact(*inputs, donors=donors, reuse=reuse)
        fast = self._fast
        if fast is not None and inputs and tuple(map(_stride, inputs)) == self.in_strides \
                and inputs[0].get_device() == fast[0] == fast[1]():
            pointers = list(map(_data_ptr, inputs))
            bits = 0
            for i in fast[12]:
                bits |= pointers[i]
            if not bits & 15:
                return self._launch_direct(fast, inputs, pointers, donors, reuse)
        return self._call(inputs, donors, reuse)

    def unfit(self, inputs: tuple) -> Any:
        """What a call with inputs the kernel was not built for returns: the group's outputs,
        computed eagerly."""
        return self.group(*inputs)

    def _launch_direct(self, fast: tuple, inputs: tuple, pointers: list, donors: tuple, reuse: tuple) -> tuple:
        """The fast path: allocate the outputs and call the compiled kernel's launcher with raw
        pointers (ints: Triton's launcher then skips its per-pointer ``data_ptr()`` call and
        driver query, which the checks in :meth:`__call__` make unnecessary)."""
        _, current, empty, compiled, run, function, metadata, stream, grid, tail, enter, leave, _, direct = fast
        if donors or reuse:
            outs = output_buffers(self.outputs, inputs, donors, reuse, empty)
        else:
            outs = tuple([empty(shape, stride, dtype) for shape, stride, dtype in self.outputs])
        if self.fills:
            fill_padding(outs, self.fills)
        raw_stream = stream(fast[0])
        if enter.calls or leave.calls:      # launch hooks (profilers): give them what Triton gives
            run(*grid, raw_stream, function, metadata,
                compiled.launch_metadata(grid, raw_stream, *inputs, *outs, *tail), enter, leave,
                *inputs, *outs, *tail)
        else:
            direct[0](*grid, raw_stream, *direct[1], *pointers, *map(_data_ptr, outs), *tail)
        return outs

    def _call(self, inputs: tuple, donors: tuple = (), reuse: tuple = ()) -> tuple:
        """First launches, other devices, unexpected strides (eager), CPU tensors (interpreter)."""
        for tensor, strides in zip(inputs, self.in_strides):
            if tensor.stride() != strides or tensor.device.type != self.device.type:
                return self.unfit(inputs)
        device = inputs[0].device if inputs else self.device
        outs = output_buffers(self.outputs, inputs, donors, reuse,
                              lambda shape, stride, dtype: torch.empty_strided(shape, stride, dtype=dtype, device=device))
        if self.fills:
            fill_padding(outs, self.fills)
        if self.empty:
            return outs
        if device.type != "cuda":
            self.launch(*inputs, *outs, *self.size_args, **self.kwargs)
            return outs
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(index):
            compiled = self._first_launch(index, inputs, outs)
        if inputs:
            self._prepare_fast_launch(index, compiled, inputs)
        return outs

    def _first_launch(self, index: int, inputs: tuple, outs: tuple) -> Any:
        """Launch (Triton compiles here). When Triton cannot compile the generated launch shape
        (its MLIR passes fail on some valid kernels, e.g. a 4096-element pointwise block storing five
        outputs), the nest's other candidate shapes are tried in turn, with a warning naming the
        one taken; when none compiles, the error names the kernel, its file and its inputs."""
        first_error = None
        tried = [(self.generated, self.path, self.module)]
        expanded = False
        while True:
            try:
                compiled = self.launch(*inputs, *outs, *self.size_args, **self.kwargs)
                if first_error is not None:
                    warnings.warn(f"triton could not compile kernel {self.generated.name} with its first launch "
                                  f"shape ({first_error}); it runs with BLOCK/XBLOCK/RBLOCK "
                                  f"{self.generated.constexprs}, {self.generated.num_warps} warps", stacklevel=4)
                return compiled
            except RuntimeError as exc:     # Triton compiles at the first launch
                if "PassManager" not in str(exc) and "compil" not in str(exc).lower():
                    raise
                first_error = first_error or " ".join(str(exc).split())[:200]
            if not expanded and self.alternatives is not None:
                expanded = True
                tried += self.alternatives()
            tried.pop(0)
            if not tried:
                raise TritonCompileError(
                    f"triton could not compile kernel {self.generated.name} ({self.path}) for "
                    f"{torch.cuda.get_device_name(index)} with any candidate launch shape: {first_error}. Inputs: "
                    + ", ".join(f"{tuple(t.shape)} {t.dtype} stride {t.stride()}" for t in inputs))
            generated, path, module = tried[0]
            self.source = generated.source
            self._setup(generated, module, path, in_strides=self.in_strides, device=self.device,
                        outputs=self.outputs)

    def _prepare_fast_launch(self, index: int, compiled: Any, inputs: tuple) -> None:
        """Remember the compiled kernel's launcher for launches on device ``index``."""
        from triton import knobs
        from triton.runtime.driver import driver
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if compiled is None or not (hasattr(enter, "calls") and hasattr(leave, "calls")):
            return                  # a Triton without hook chains: keep its own launch path
        names = list(self.function.arg_names)
        positional = len(self.in_strides) + len(self.outputs) + len(self.size_args)
        defaults = {p.name: p.default for p in self.function.params}
        tail = self.size_args + tuple(self.kwargs.get(name, defaults.get(name)) for name in names[positional:])
        grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
        compiled._init_handles()
        current, empty = compat.cuda_launch_helpers()
        # Triton specialized the binary on which pointers were 16-byte aligned at this launch: later
        # launches take the direct path only while those inputs still are (else Triton's own path
        # compiles the variant they need).
        aligned = tuple(i for i, t in enumerate(inputs) if t.data_ptr() % 16 == 0)
        self._fast = (index, current, empty, compiled, compiled.run, compiled.function, compiled.packed_metadata,
                      driver.active.get_current_stream, grid, tail, enter, leave, aligned,
                      _direct_launch(compiled))


def _direct_launch(compiled: Any) -> tuple:
    """(callable, arguments between the stream and the kernel's own): the launcher's C entry point
    when the kernel needs no scratch memory (Triton's launcher object then only forwards to it),
    else the launcher object itself."""
    run = compiled.run
    raw = getattr(run, "launch", None)
    plain = (raw is not None and getattr(run, "global_scratch_size", None) == 0
             and getattr(run, "profile_scratch_size", None) == 0 and hasattr(run, "launch_pdl"))
    if plain:
        return raw, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                     compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


_stride = torch.Tensor.stride
_data_ptr = torch.Tensor.data_ptr


def _compile_paths(paths: list, arch: int, ttgir: bool = False) -> list:
    """Compile generated module files for ``cuda`` sm_<arch> with Triton's compiler; one result
    dict per file (sizes, or ``error``; the TritonGPU IR too with ``ttgir``). Self-contained
    (stdlib and triton only): it also runs as a script in a fresh process, see
    :func:`compile_all_for_sm90`."""
    import importlib.util
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    results = []
    for path in paths:
        name = path
        try:
            with triton.knobs.runtime.scope():
                triton.knobs.runtime.interpret = False      # helpers must be JITFunctions
                spec = importlib.util.spec_from_file_location("pp_sm90_" + path.rsplit("/", 1)[-1][:-3], path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            function = module.KERNEL
            name = function.fn.__name__
            signature = dict(module.SIGNATURE)
            aligned = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values())
                       if kind.startswith("*")}
            jitted = function if isinstance(function, JITFunction) else JITFunction(function.fn)
            source = ASTSource(fn=jitted, signature=signature, constexprs=dict(module.CONSTEXPRS), attrs=aligned)
            compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": module.NUM_WARPS,
                                               "num_stages": getattr(module, "NUM_STAGES", 3),
                                               "maxnreg": getattr(module, "MAXNREG", None)})
            cap = [line.split()[1] for line in compiled.asm["ptx"].splitlines() if line.startswith(".maxnreg")]
            results.append({"name": name, "path": path, "ptx_bytes": len(compiled.asm["ptx"]),
                            "maxnreg": int(cap[0]) if cap else None,
                            "cubin_bytes": len(compiled.asm["cubin"]),
                            "num_warps": compiled.metadata.num_warps, "shared": compiled.metadata.shared})
            if ttgir:
                results[-1]["ttgir"] = compiled.asm["ttgir"]
        except Exception as exc:  # noqa: BLE001 - Triton raises many types; report them per kernel
            results.append({"name": name, "path": path, "error": f"{type(exc).__name__}: {exc}"})
    return results


def _compiles_in_process() -> bool:
    """Triton can compile for a GPU in this process: its standard library (``tl.sum``...) was not
    imported in interpreter mode (the interpreter also patches ``triton.language`` for good)."""
    if "triton" not in sys.modules and interpreting():
        return False
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    return isinstance(tl.sum, JITFunction)


def interpreter_problem() -> str | None:
    """Why kernels cannot run under the Triton interpreter in this process (None when they can)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if not isinstance(tl.sum, InterpretedFunction):
        return "triton was imported before TRITON_INTERPRET=1 was set (set it before anything imports triton)"
    return None


def _path_of(subject: Any) -> str:
    if isinstance(subject, TritonKernel):
        return str(subject.path)
    if isinstance(subject, TritonSource):
        return str(write_source(subject.source)[0])
    if isinstance(subject, os.PathLike) or (isinstance(subject, str) and "\n" not in subject):
        return str(Path(subject).resolve())
    return str(write_source(subject)[0])


def compile_all_for_sm90(subjects: list, *, arch: int = 90, ttgir: bool = False) -> list[dict]:
    """:func:`compile_for_sm90` for many kernels at once (with ``ttgir``, each result also holds
    the kernel's TritonGPU IR, where Triton's layouts can be read). Runs in this process when
    Triton can compile here, else in one fresh Python process without ``TRITON_INTERPRET`` (a
    process that interpreted kernels cannot compile them). Raises :class:`TritonCompileError`
    naming every kernel that failed."""
    import json
    import subprocess

    paths = [_path_of(s) for s in subjects]
    if _compiles_in_process():
        results = _compile_paths(paths, arch, ttgir)
    else:
        import inspect
        script = (inspect.getsource(_compile_paths) + "\nimport json, sys\n"
                  "print(json.dumps(_compile_paths(sys.argv[3:], int(sys.argv[1]), sys.argv[2] == '1')))\n")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = subprocess.run([sys.executable, "-c", script, str(arch), "1" if ttgir else "0", *paths],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise TritonCompileError(f"the sm_{arch} compile process failed:\n{done.stderr[-4000:]}")
        results = json.loads(done.stdout.strip().splitlines()[-1])
    failures = [f"triton could not compile kernel {r['name']} ({r['path']}) for sm_{arch}: {r['error']}"
                for r in results if "error" in r]
    if failures:
        raise TritonCompileError("\n\n".join(failures))
    return results


def compile_for_sm90(subject: TritonKernel | TritonSource | str | os.PathLike, *, arch: int = 90) -> dict:
    """Compile a generated kernel to PTX and a cubin for sm_90 (the H200) without a GPU.

    ``subject`` is a :class:`TritonKernel`, a :class:`TritonSource`, a generated module's source
    text or the path of its file. Returns the kernel name, PTX and cubin sizes in bytes, warps and
    shared memory; raises :class:`TritonCompileError` naming the kernel when Triton rejects it.
    Pointer arguments are assumed 16-byte aligned, as Triton specializes them at a real launch."""
    return compile_all_for_sm90([subject], arch=arch)[0]
