"""Compile generated C++ with the system compiler and load it with ctypes, through an on-disk
cache keyed on the source, the compiler and its flags, and the CPU's instruction set."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

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
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


@lru_cache(maxsize=None)
def cpu_isa() -> str:
    """A fingerprint of this CPU's instruction set (``-march=native`` output depends on it)."""
    text = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name")):
                    text += line
                if line.startswith("flags"):
                    break
    except OSError:
        text = platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir(configured: str | None) -> Path:
    root = configured or os.environ.get("PIPELINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "plan-pipeline")
    path = Path(root) / "cpp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_key(source: str) -> str:
    cxx = compiler()
    material = "\n".join([source, cxx, _compiler_version(cxx), " ".join(FLAGS + LIBS), cpu_isa()])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def build(source: str, *, directory: str | None = None,
          persistent: bool = True) -> tuple[ctypes.CDLL, Path, bool]:
    """Compiled library for ``source`` (from the cache when present); returns (library, path of
    the source file, whether it was a cache hit). Writes are atomic. ``persistent=False`` (plan
    ``cache.enabled: false``) builds in a private temporary folder that no later process reads."""
    folder = cache_dir(directory) if persistent else Path(tempfile.mkdtemp(prefix="plan-pipeline-"))
    key = cache_key(source)
    lib_path = folder / f"k_{key}.so"
    src_path = folder / f"k_{key}.cpp"
    with _lock:
        if str(lib_path) in _loaded:
            return _loaded[str(lib_path)], src_path, True
        hit = lib_path.exists()
        if not hit:
            _atomic_write(src_path, source)
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as tmp:
                tmp_path = tmp.name
            cmd = [compiler(), *FLAGS, str(src_path), "-o", tmp_path, *LIBS]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                os.unlink(tmp_path)
                raise CompileError(f"g++ failed on generated source {src_path}:\n{result.stderr[-4000:]}")
            os.replace(tmp_path, lib_path)
        library = ctypes.CDLL(str(lib_path))
        _loaded[str(lib_path)] = library
        return library, src_path, hit


def _atomic_write(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(text)
        name = tmp.name
    os.replace(name, path)
