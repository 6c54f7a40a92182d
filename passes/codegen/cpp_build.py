"""Compile generated C++ with the system compiler and load it with ctypes, through an on-disk
cache keyed on the source, the compiler and its flags, and the CPU's instruction set."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from pipeline.cache import cache_root, cpu_isa
from pipeline.errors import PipelineError

FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
         "-ffp-contract=off"]
LIBS = ["-lmvec", "-lm"]
_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class CompileError(PipelineError):
    """The system compiler rejected generated C++ (names the source file to look at)."""


def compiler() -> str:
    found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not found:
        raise CompileError("no C++ compiler found (install g++ or set CXX)")
    return found


@lru_cache(maxsize=None)
def _compiler_version(cxx: str) -> str:
    try:
        result = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    except OSError as exc:
        raise CompileError(f"cannot run the C++ compiler {cxx!r}: {exc.strerror or exc}") from None
    lines = result.stdout.splitlines()
    if result.returncode != 0 or not lines:
        raise CompileError(f"the C++ compiler {cxx!r} does not answer --version: {result.stderr.strip()[-500:]}")
    return lines[0]


def cache_dir(configured: str | None) -> Path:
    """``<root>/cpp`` under the configured cache root, created if needed. A root that cannot be
    created (read-only, full, a file in the way) is a :class:`CompileError` saying what to do."""
    path = cache_root(configured) / "cpp"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CompileError(f"cannot create the kernel cache folder {path}: {exc.strerror or exc}. "
                           f"{_CACHE_ADVICE}") from None
    return path


_CACHE_ADVICE = ("Point the plan's cache.dir (or PIPELINE_CACHE_DIR) at a writable folder with free "
                 "space, or set cache.enabled: false to build in a private temporary folder.")


def cache_key(source: str) -> str:
    cxx = compiler()
    material = "\n".join([source, cxx, _compiler_version(cxx), " ".join(FLAGS + LIBS), cpu_isa()])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def build(source: str, *, directory: str | None = None,
          persistent: bool = True) -> tuple[ctypes.CDLL, Path, bool]:
    """Compiled library for ``source`` (from the cache when present); returns (library, path of
    the source file, whether it was a cache hit). ``persistent=False`` (plan ``cache.enabled:
    false``) builds in a private temporary folder that no later process reads.

    A cache entry is only ever complete: the source and the library are written under temporary
    names and renamed into place, and whatever fails or interrupts a build (the compiler
    rejecting the source or being killed, a read-only or full disk, Ctrl-C) removes the temporary
    files. A library in the cache that does not load (truncated by an older crash) is rebuilt.
    Failures are :class:`CompileError` naming the file or folder; an interrupt propagates."""
    if persistent:
        folder = cache_dir(directory)
    else:
        try:
            folder = Path(tempfile.mkdtemp(prefix="plan-pipeline-"))
        except OSError as exc:
            raise CompileError(f"cannot create a temporary build folder: {exc.strerror or exc}") from None
    key = cache_key(source)
    lib_path = folder / f"k_{key}.so"
    src_path = folder / f"k_{key}.cpp"
    with _lock:
        if str(lib_path) in _loaded:
            return _loaded[str(lib_path)], src_path, True
        hit = lib_path.exists()
        if hit:
            library = _load(lib_path)
            if library is not None:
                _loaded[str(lib_path)] = library
                return library, src_path, True
            _remove(lib_path)           # a damaged entry: build it again
            hit = False
        _write_source(src_path, source)
        _compile(src_path, lib_path, folder)
        library = _load(lib_path)
        if library is None:
            _remove(lib_path)
            raise CompileError(f"the library built from {src_path} does not load")
        _loaded[str(lib_path)] = library
        return library, src_path, hit


def _load(path: Path) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        return None


def _remove(path: Path | str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_source(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; on any failure no file is left behind."""
    tmp_name = None
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(text)
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError as exc:
        raise CompileError(f"cannot write generated source {path}: {exc.strerror or exc}. "
                           f"{_CACHE_ADVICE}") from None
    finally:
        if tmp_name is not None:
            _remove(tmp_name)


def _compile(src_path: Path, lib_path: Path, folder: Path) -> None:
    """Run the compiler into a temporary file and rename it to ``lib_path`` only on success."""
    tmp_name = None
    try:
        try:
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as tmp:
                tmp_name = tmp.name
        except OSError as exc:
            raise CompileError(f"cannot write into the kernel cache folder {folder}: "
                               f"{exc.strerror or exc}. {_CACHE_ADVICE}") from None
        cmd = [compiler(), *FLAGS, str(src_path), "-o", tmp_name, *LIBS]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise CompileError(f"cannot run the C++ compiler {cmd[0]!r}: {exc.strerror or exc}") from None
        if result.returncode < 0:
            raise CompileError(f"the C++ compiler was killed by signal {-result.returncode} while "
                               f"compiling {src_path}")
        if result.returncode != 0:
            raise CompileError(f"g++ failed on generated source {src_path}:\n{result.stderr[-4000:]}")
        try:
            os.replace(tmp_name, lib_path)
        except OSError as exc:
            raise CompileError(f"cannot store the compiled kernel {lib_path}: {exc.strerror or exc}. "
                               f"{_CACHE_ADVICE}") from None
        tmp_name = None
    finally:
        if tmp_name is not None:
            _remove(tmp_name)
