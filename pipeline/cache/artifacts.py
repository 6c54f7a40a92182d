"""Portable artifacts: the compile-cache entries of a model (and the kernel files they need) in one
folder that another process, or another machine with the same versions and device, loads into its
cache so that its first call compiles nothing.

A bundle is a folder::

    manifest.json          format, what made it, each entry's key and SHA-256, each file's SHA-256
    graphs/<key>.entry     compiled graphs, exactly as the cache stores them (checksummed)
    files/cpp/k_*.so ...   kernel files the entries need, at their path under the cache folder
    captures/...           stored captures, only when saved with ``captures=True``

:func:`load_artifacts` checks, before copying anything, that every entry was made with this
process's torch, triton and Python versions, this device (GPU model, or CPU instruction set) and the
same source of the engine and of the pass packages, and that every file matches its hash; a
mismatch is refused with a message naming what differs. Loading only copies files into the cache:
nothing in the bundle is imported or unpickled (entries hold JSON and raw tensor bytes), and the
only code that ever runs from it is the generated kernels the entries describe, loaded from the
cache, after their hashes are checked, when a compile uses them.

Stored captures (``capture.precompile``) are pickles of Dynamo's code and guards: a bundle carries
them only when saved with ``captures=True``, and loading copies them only with
``trust_captures=True`` (for bundles you made: unpickling runs code). Without them, a replica
loaded from the bundle traces its model once and stores its own."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from pipeline.cache import (CorruptEntry, atomic_write, cache_root, code_fingerprint_of, entry_path, environment,
                    file_digest, read_entry, read_header)
from pipeline.compilation import compilation_of
from pipeline.errors import PipelineError
from pipeline.registry import get_registry

FORMAT = "plan-pipeline-artifacts/1"


class ArtifactError(PipelineError):
    """A bundle that cannot be saved or loaded here (version or device mismatch, damaged file)."""


def _entries_of(subject: Any) -> tuple[Path, list[str], list[str]]:
    """(cache root, keys, stored-capture files relative to the root) for a compiled model, a
    Compilation, or a cache folder."""
    if isinstance(subject, (str, os.PathLike)):
        root = Path(subject)
        keys = sorted(p.stem for p in root.glob("graphs/*/*.entry"))
        return root, keys, sorted(str(p.relative_to(root)) for p in root.glob("captures/*/*/*.capture"))
    compilation = subject
    if not hasattr(compilation, "cache"):
        compilation = compilation_of(subject)
    keys = list(dict.fromkeys(compilation.cache.keys))
    if not keys:
        reasons = sorted({f"{g.graph_id}: {g.cache.get('status')} ({g.cache.get('reason')})"
                          for g in compilation.graphs if g.cache})
        raise ArtifactError("nothing to save: no compiled graph of this model is in the compile cache. Call the "
                            "model once before saving" + (f"; what the cache did: {'; '.join(reasons)}" if reasons else "")
                            + ".")
    return compilation.cache.root, keys, list(compilation.cache.captures.used)


def save_artifacts(subject: Any, path: str | os.PathLike, *, captures: bool = False) -> Path:
    """Write a bundle of the compiled graphs behind ``subject`` to the folder ``path``.

    ``subject`` is a model returned by :func:`compile_with_plan` (after a call that compiled it), its
    :class:`~pipeline.compilation.Compilation`, or a cache folder (every entry in it). ``captures``
    also bundles the stored captures it used (module docstring). Returns the path of the manifest."""
    root, keys, capture_files = _entries_of(subject)
    out = Path(path)
    (out / "graphs").mkdir(parents=True, exist_ok=True)
    entries, files = [], {}
    for key in keys:
        source = entry_path(root, key)
        try:
            header, meta, _ = read_entry(source, key)
        except (OSError, CorruptEntry) as exc:
            raise ArtifactError(f"cache entry {source} cannot be bundled: {exc}") from None
        for relative, digest_ in meta.get("files", {}).items():
            kernel_file = root / relative
            if not kernel_file.exists() or file_digest(kernel_file) != digest_:
                raise ArtifactError(f"kernel file {kernel_file} that entry {key[:16]} needs is missing or changed; "
                                    "compile the model again before saving")
            files[relative] = digest_
            target = out / "files" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kernel_file, target)
        shutil.copyfile(source, out / "graphs" / f"{key}.entry")
        entries.append({"key": key, "sha256": file_digest(out / "graphs" / f"{key}.entry"),
                        "target": header.get("target"), "environment": header.get("environment", {}),
                        "code": header.get("code", {})})
    stored = []
    for relative in capture_files if captures else []:
        source = root / relative
        if not source.exists():
            raise ArtifactError(f"stored capture {source} is missing; compile the model again before saving")
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        stored.append({"path": relative, "sha256": file_digest(target)})
    manifest = {"format": FORMAT, "entries": entries,
                "files": [{"path": p, "sha256": d} for p, d in sorted(files.items())], "captures": stored}
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=1).encode())
    return out / "manifest.json"


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a bundle folder (or of the manifest file itself)."""
    folder = Path(path)
    manifest_path = folder / "manifest.json" if folder.is_dir() else folder
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{manifest_path} is not a readable artifacts manifest: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{manifest_path} has format {manifest.get('format')!r}; this version reads {FORMAT}")
    return manifest


def mismatches(entry: dict) -> list[str]:
    """What differs between the process that made a bundle entry and this one."""
    here = environment(entry.get("target") or "cpu")
    out = [f"{name}: bundle has {value!r}, this process has {here.get(name)!r}"
           for name, value in entry.get("environment", {}).items() if here.get(name) != value]
    code = entry.get("code", {})
    modules = [m for m in code if m in sys.modules]
    missing = [m for m in code if m not in sys.modules]
    out.extend(f"package {m}: needed by the bundle but not imported here" for m in missing)
    now = code_fingerprint_of(modules)
    out.extend(f"package {m}: source differs from the one the bundle was compiled with" for m in modules
               if now.get(m) != code[m])
    return out


def load_artifacts(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, *,
                   trust_captures: bool = False) -> dict:
    """Check the bundle at ``path`` against this process and copy it into the compile cache
    (``cache_dir``, else ``$PIPELINE_CACHE_DIR``, else the per-user default: the folder a plan with
    ``cache.dir: null`` uses). Stored captures in the bundle are copied only with
    ``trust_captures`` (module docstring). Returns ``{"entries": n, "files": n, "captures": n,
    "captures_skipped": n, "cache": folder}``.

    Raises :class:`ArtifactError` naming every version, device or source mismatch, and every
    file whose hash does not match, before anything is copied."""
    folder = Path(path)
    manifest = read_manifest(folder)
    get_registry()      # imports the installed pass plugins, whose sources the entries were keyed on
    problems = []
    for entry in manifest["entries"]:
        for problem in mismatches(entry):
            if problem not in problems:
                problems.append(problem)
    if problems:
        raise ArtifactError(f"the artifacts in {folder} were compiled for another setup and are refused:\n  "
                            + "\n  ".join(problems)
                            + "\nCompile the model here (or on a machine with the same versions and device) instead.")
    for entry in manifest["entries"]:
        entry_file = folder / "graphs" / f"{entry['key']}.entry"
        _check(entry_file, entry["sha256"])
        try:
            header, _ = read_header(entry_file)
        except CorruptEntry as exc:
            raise ArtifactError(f"{entry_file} is damaged: {exc}") from None
        if header.get("key") != entry["key"]:
            raise ArtifactError(f"{entry_file} holds another key than its name says")
    for item in manifest["files"]:
        _check(folder / "files" / item["path"], item["sha256"])
    captures = manifest.get("captures", []) if trust_captures else []
    for item in captures:
        if not item["path"].startswith("captures/") or ".." in Path(item["path"]).parts:
            raise ArtifactError(f"stored capture path {item['path']!r} is outside the bundle's captures folder")
        _check(folder / item["path"], item["sha256"])
    root = cache_root(cache_dir)
    for item in manifest["files"]:
        target = root / item["path"]
        if target.exists() and file_digest(target) == item["sha256"]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, (folder / "files" / item["path"]).read_bytes())
    for entry in manifest["entries"]:
        target = entry_path(root, entry["key"])
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, (folder / "graphs" / f"{entry['key']}.entry").read_bytes())
    for item in captures:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, (folder / item["path"]).read_bytes())
    return {"entries": len(manifest["entries"]), "files": len(manifest["files"]), "captures": len(captures),
            "captures_skipped": len(manifest.get("captures", [])) - len(captures), "cache": str(root)}


def _check(path: Path, expected: str) -> None:
    if not path.exists():
        raise ArtifactError(f"{path} is missing from the bundle")
    if file_digest(path) != expected:
        raise ArtifactError(f"{path} does not match its hash in the manifest (damaged or edited); refused")


def describe_artifacts(path: str | os.PathLike) -> str:
    """A readable summary of a bundle: its entries, what made them, and whether this process can
    load it."""
    manifest = read_manifest(path)
    get_registry()
    lines = [f"{path}: {len(manifest['entries'])} compiled graph(s), {len(manifest['files'])} kernel file(s), "
             f"{len(manifest.get('captures', []))} stored capture(s)"]
    for entry in manifest["entries"]:
        env = entry.get("environment", {})
        lines.append(f"  {entry['key'][:16]}  target {entry.get('target')}  torch {env.get('torch')}  "
                     f"triton {env.get('triton')}  python {env.get('python')}  {env.get('device')}")
    problems = sorted({p for entry in manifest["entries"] for p in mismatches(entry)})
    lines.append("loads here: yes" if not problems else "loads here: no\n  " + "\n  ".join(problems))
    return "\n".join(lines)


__all__ = ["save_artifacts", "load_artifacts", "describe_artifacts", "read_manifest", "ArtifactError"]
