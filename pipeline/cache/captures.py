"""Stored captures on disk: what a capture pass traced (code and guards), so that a later process
finds it by the function and plan it was made for and checks its guards instead of tracing.

One folder per key (``captures/<k[:2]>/<key>/``), one file per capture in it, named by the
digest of its bytes: a function captured at several shapes has several entries, and the capture
pass checks each entry's guards in turn. The bytes are the capture pass's own; this module only
keeps them. Writing is atomic (a reader never sees half a file)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.cache import atomic_write, cache_root, digest

SUFFIX = ".capture"


class CaptureStore:
    """The stored captures under one cache folder (a plan's ``cache.dir``)."""

    def __init__(self, configured_dir: str | None = None):
        self.root = cache_root(configured_dir) / "captures"
        self.used: list[str] = []     # entries read or written, relative to the cache root (for bundles)

    def key(self, material: dict) -> str:
        """The key of ``material`` (everything that must match for an entry to be tried)."""
        return digest(material)

    def folder(self, key: str) -> Path:
        """The folder of the entries under ``key``."""
        return self.root / key[:2] / key

    def entries(self, key: str) -> list[tuple[str, bytes]]:
        """(file name, bytes) of every capture stored under ``key``, oldest first."""
        folder = self.folder(key)
        if not folder.is_dir():
            return []
        files = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name))
        out = []
        for path in files:
            try:
                out.append((path.name, path.read_bytes()))
            except OSError:
                continue
            self._use(key, path.name)
        return out

    def _use(self, key: str, name: str) -> None:
        relative = f"captures/{key[:2]}/{key}/{name}"
        if relative not in self.used:
            self.used.append(relative)

    def add(self, key: str, data: bytes) -> str:
        """Store one capture under ``key``; returns its file name."""
        name = hashlib.sha256(data).hexdigest()[:32] + SUFFIX
        folder = self.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / name, data)
        self._use(key, name)
        return name

    def remove(self, key: str, name: str) -> None:
        """Drop one entry (it no longer loads: another torch, changed code)."""
        try:
            (self.folder(key) / name).unlink()
        except OSError:
            pass


__all__ = ["CaptureStore"]
