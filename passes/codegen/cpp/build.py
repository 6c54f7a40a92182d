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
import time
import warnings
from functools import lru_cache
from pathlib import Path

from pipeline.cache import cache_root, cpu_isa
from pipeline.errors import PipelineError
from pipeline.logs import get_logger

FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno",
         "-ffp-contract=off"]
LIBS = ["-lmvec", "-lm"]
_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class CompileError(PipelineError):
    """The system compiler rejected generated C++ (names the source file to look at)."""


class CacheFolderError(CompileError):
    """The kernel cache folder cannot be created or written (read-only, full, a file in the way,
    removed while a kernel was building): builds go to a private temporary folder instead."""


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
    """``<root>/cpp`` under the configured cache root, created if needed (again, if it vanished).
    A root that cannot be created (read-only, full, a file in the way) is a
    :class:`CacheFolderError` saying what to do."""
    path = cache_root(configured) / "cpp"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheFolderError(f"cannot create the kernel cache folder {path}: {exc.strerror or exc}. "
                               f"{_CACHE_ADVICE}") from None
    clean_stale(path)
    return path


STALE_SECONDS = 3600.0
_cleaned: set[str] = set()


def clean_stale(folder: Path) -> None:
    """Once per process and folder: remove temporary files a build left there more than
    :data:`STALE_SECONDS` ago (a compiler or process killed with ``kill -9`` cannot remove its
    own; no build runs that long)."""
    if str(folder) in _cleaned:
        return
    _cleaned.add(str(folder))
    now = time.time()
    for pattern in ("tmp*.so", "tmp*.tmp", "*.tmp"):
        for path in folder.glob(pattern):
            try:
                if now - path.stat().st_mtime > STALE_SECONDS:
                    path.unlink()
            except OSError:
                pass


_CACHE_ADVICE = ("Point the plan's cache.dir (or PIPELINE_CACHE_DIR) at a writable folder with free "
                 "space, or set cache.enabled: false to build in a private temporary folder.")

_private: list[Path] = []
_warned: set[str] = set()


def private_dir() -> Path:
    """This process's private build folder (made once; no other process reads it)."""
    if not _private:
        try:
            _private.append(Path(tempfile.mkdtemp(prefix="plan-pipeline-")))
        except OSError as exc:
            raise CompileError(f"cannot create a temporary build folder: {exc.strerror or exc}") from None
    return _private[0]


def warn_private(problem: BaseException, folder: Path) -> None:
    """One warning per cache problem: kernels are built in ``folder`` instead, and not kept."""
    text = str(problem).split(". Point the plan", 1)[0]
    if text not in _warned:
        _warned.add(text)
        warnings.warn(f"pipeline: {text}; building kernels in the private temporary folder {folder} "
                      f"instead (not kept after this process). {_CACHE_ADVICE}", stacklevel=4)


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
    files. Next to each library lies the SHA-256 of the bytes the compiler wrote
    (:func:`digest_path`); a library is loaded only when its bytes still have that digest, so a
    damaged file (a flipped bit, a truncated copy) is never loaded: it is removed and rebuilt,
    with a warning. A cache folder that cannot be written (read-only, full, a file or folder in
    the way) degrades to the private folder with one warning naming the folder and the reason; a
    folder removed while the compiler ran is made again and the build retried. Failures are
    :class:`CompileError` naming the file or folder; an interrupt propagates."""
    key = cache_key(source)
    with _lock:
        if persistent:
            try:
                return _build_in(cache_dir(directory), key, source)
            except CacheFolderError as exc:
                try:                    # removed while the compiler ran: make it again, once
                    return _build_in(cache_dir(directory), key, source)
                except CacheFolderError:
                    warn_private(exc, private_dir())
        return _build_in(private_dir(), key, source)


def _build_in(folder: Path, key: str, source: str) -> tuple[ctypes.CDLL, Path, bool]:
    lib_path = folder / f"k_{key}.so"
    src_path = folder / f"k_{key}.cpp"
    if str(lib_path) in _loaded:
        return _loaded[str(lib_path)], src_path, True
    hit = lib_path.exists()
    if hit:
        problem = _damage(lib_path)
        library = _load(lib_path) if problem is None else None
        if library is not None:
            _loaded[str(lib_path)] = library
            return library, src_path, True
        if lib_path.is_dir():
            raise CacheFolderError(f"cannot store the compiled kernel {lib_path}: a folder is in the way")
        if digest_path(lib_path).exists() or problem is None:
            warnings.warn(f"pipeline: kernel library {lib_path} {problem or 'does not load'}: removed and "
                          f"rebuilt from its source", stacklevel=4)
        else:    # built before libraries had digests (or the digest was deleted): rebuilt quietly
            get_logger("cache").info("kernel library %s has no digest: rebuilt from its source", lib_path)
        _remove(lib_path)
        _remove(digest_path(lib_path))
        hit = False
    _write_source(src_path, source)
    _compile(src_path, lib_path, folder)
    library = _load(lib_path)
    if library is None:
        _remove(lib_path)
        raise CompileError(f"the library built from {src_path} does not load")
    _loaded[str(lib_path)] = library
    return library, src_path, hit


def digest_path(lib_path: Path | str) -> Path:
    """Where the SHA-256 of a built library's bytes is kept (``k_<key>.so.sha256``)."""
    return Path(f"{lib_path}.sha256")


def _sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _damage(lib_path: Path) -> str | None:
    """Why the library on disk is not the one that was built (None when it is)."""
    try:
        recorded = digest_path(lib_path).read_text().strip()
        actual = _sha256(lib_path)
    except OSError as exc:
        return f"has no readable digest ({exc.strerror or exc})"
    if recorded != actual:
        return "does not match the SHA-256 recorded when it was built"
    return None


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


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a renamed temporary file (OSError on failure, and then
    no file is left behind)."""
    tmp_name = None
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(text)
        os.replace(tmp_name, path)
        tmp_name = None
    finally:
        if tmp_name is not None:
            _remove(tmp_name)


def _write_source(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; on any failure no file is left behind."""
    try:
        _write_atomically(path, text)
    except OSError as exc:
        raise CacheFolderError(f"cannot write generated source {path}: {exc.strerror or exc}. "
                               f"{_CACHE_ADVICE}") from None


def _compile(src_path: Path, lib_path: Path, folder: Path) -> None:
    """Run the compiler into a temporary file and rename it to ``lib_path`` only on success."""
    tmp_name = None
    try:
        try:
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as tmp:
                tmp_name = tmp.name
        except OSError as exc:
            raise CacheFolderError(f"cannot write into the kernel cache folder {folder}: "
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
            if not folder.is_dir() or not src_path.exists():
                raise CacheFolderError(f"the kernel cache folder {folder} was removed while the compiler "
                                       f"ran. {_CACHE_ADVICE}")
            raise CompileError(f"g++ failed on generated source {src_path}:\n{result.stderr[-4000:]}")
        try:
            _write_atomically(digest_path(lib_path), _sha256(tmp_name))
            os.replace(tmp_name, lib_path)
        except OSError as exc:
            raise CacheFolderError(f"cannot store the compiled kernel {lib_path}: {exc.strerror or exc}. "
                                   f"{_CACHE_ADVICE}") from None
        tmp_name = None
    finally:
        if tmp_name is not None:
            _remove(tmp_name)
