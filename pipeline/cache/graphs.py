"""Compiled graphs on disk: look a captured graph up before the graph passes run, and store the
final graph after they ran, so that a later process (or a later compile in this one) rebuilds it
without running any pass.

A final graph is stored as plain data (:mod:`pipeline.cache.graph_io`): ATen operators by name, fused
groups with their subgraphs, and the generated kernels through their ``to_data`` (the
:class:`~pipeline.cache.graph_io.Describable` protocol). Rebuilding a kernel reloads it from the kernel
cache (a compiled C++ library, a Triton module file), whose files the entry lists with their
SHA-256: a kernel file that changed is removed and rebuilt from the source the entry holds. A
final graph holding anything that cannot be described is not stored, and the graph's record
says why. Every outcome is one :class:`Probe`, kept in ``GraphRecord.cache`` for the compile
report and ``explain``, and logged on the ``cache`` topic."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import torch.fx

from pipeline import compat
from pipeline.cache import (CorruptEntry, cache_root, digest, entry_path, environment, file_digest, graphs_enabled,
                    dump_key_material, key_material, read_entry, relocate_cuda, write_entry)
from pipeline.cache.captures import CaptureStore
from pipeline.cache.graph_io import Codec, UnsupportedGraph, data_to_graph, graph_to_data
from pipeline.logs import get_logger


@attrs.define
class Probe:
    """What the compile cache did for one graph.

    ``status``: ``hit`` (rebuilt from an entry, no pass ran), ``miss`` (compiled; ``stored`` says
    whether an entry was written), ``uncacheable`` (no key: ``reason`` says why), ``bypassed``
    (a debugging mode needs the passes to run) or ``off`` (plan ``cache.enabled: false`` or
    ``PIPELINE_CACHE_GRAPHS=0``)."""

    status: str
    key: str | None = None
    reason: str = ""
    seconds: float = 0.0
    stored: bool = False

    def summary(self) -> dict:
        """Plain data for the graph's record."""
        return {"status": self.status, "key": self.key[:16] if self.key else None, "reason": self.reason,
                "seconds": round(self.seconds, 4), "stored": self.stored}


class GraphCache:
    """The compiled-graph cache of one compilation (one plan): its folder and the entries it
    used or wrote (what :func:`pipeline.save_artifacts` bundles)."""

    def __init__(self, plan: Any):
        self.configured_dir = plan.cache.dir
        self.root = cache_root(plan.cache.dir)
        self.enabled = bool(plan.cache.enabled) and graphs_enabled()
        self.keys: list[str] = []
        self._code: dict[str, dict] = {}     # key -> source fingerprints it was made with
        self._cuda_index: dict[str, int | None] = {}   # key -> the GPU its graph was keyed on
        self._log = get_logger("cache")
        self.captures = CaptureStore(plan.cache.dir)    # stored captures (a capture pass's own bytes)

    def lookup(self, gm: torch.fx.GraphModule, example_inputs: list, *, plan: Any, passes: list, role: str,
               target: str, graph_id: str, bypass: str | None = None,
               context: Any = None) -> tuple[Probe, torch.fx.GraphModule | None, dict]:
        """(probe, rebuilt final graph or None, what the entry recorded about the compile).
        ``context`` is the compile's PassContext, handed to objects rebuilt from the entry.

        Runs outside the compile's fake-tensor mode: constants are hashed and loaded as real tensors."""
        with compat.real_tensors():
            return self._lookup(gm, example_inputs, plan=plan, passes=passes, role=role, target=target,
                                graph_id=graph_id, bypass=bypass, context=context)

    def _lookup(self, gm: torch.fx.GraphModule, example_inputs: list, *, plan: Any, passes: list, role: str,
                target: str, graph_id: str, bypass: str | None, context: Any) -> tuple[Probe, torch.fx.GraphModule | None, dict]:
        start = time.perf_counter()
        if not self.enabled:
            return Probe("off", reason="plan cache.enabled is false or PIPELINE_CACHE_GRAPHS=0"), None, {}
        try:
            material, reason = key_material(gm, example_inputs, plan=plan, passes=passes, role=role, target=target)
        except Exception as exc:  # noqa: BLE001 - a graph we cannot key is compiled, never a failure
            material, reason = None, f"no key: {type(exc).__name__}: {exc}"
        if material is None:
            self._log.warning("%s: not cached: %s", graph_id, reason)
            return Probe("uncacheable", reason=reason or "", seconds=time.perf_counter() - start), None, {}
        key = digest(material)
        dump_key_material(key, material, graph_id)
        self._code[key] = material["code"]
        index = self._cuda_index[key] = material.get("cuda_index")
        if bypass:
            return Probe("bypassed", key, reason=bypass, seconds=time.perf_counter() - start), None, {}
        return self._read(key, index, graph_id, context, example_inputs, start)

    def load(self, key: str, *, graph_id: str, context: Any = None) -> tuple[Probe, torch.fx.GraphModule | None, dict]:
        """The entry of ``key`` rebuilt (a graph found without its captured graph, by a stored
        capture): (probe, final graph or None, what the entry recorded about the compile)."""
        if not self.enabled:
            return Probe("off", reason="plan cache.enabled is false or PIPELINE_CACHE_GRAPHS=0"), None, {}
        with compat.real_tensors():
            return self._read(key, None, graph_id, context, None, time.perf_counter())

    def _read(self, key: str, index: int | None, graph_id: str, context: Any, example_inputs: list | None,
              start: float) -> tuple[Probe, torch.fx.GraphModule | None, dict]:
        path = entry_path(self.root, key)
        if not path.exists():
            probe = Probe("miss", key, reason="no entry", seconds=time.perf_counter() - start)
            self._log.info("%s: cache miss (%s)", graph_id, key[:16])
            return probe, None, {}
        try:
            _, meta, constants = read_entry(path, key)
            stored = meta.get("cuda_index")
            if index is not None and stored is not None and stored != index:   # compiled on another GPU
                meta["graph"], meta["record"] = relocate_cuda([meta["graph"], meta.get("record", {})], stored, index)
                constants = {k: v.to(f"cuda:{index}") if v.is_cuda else v for k, v in constants.items()}
            self._check_files(meta.get("files", {}))
            codec = Codec(constants, dict(meta["texts"]), cache_dir=self.configured_dir, context=context)
            graph = data_to_graph(meta["graph"], constants, codec)
        except CorruptEntry as exc:
            _remove(path)
            self._log.warning("%s: corrupt cache entry %s removed, compiling again: %s", graph_id, path, exc)
            return Probe("miss", key, reason=f"corrupt entry removed and rebuilt: {exc}",
                         seconds=time.perf_counter() - start), None, {}
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot be rebuilt here: compile instead
            self._log.warning("%s: cache entry %s could not be rebuilt, compiling again: %s: %s", graph_id,
                              path, type(exc).__name__, exc)
            return Probe("miss", key, reason=f"entry could not be rebuilt: {type(exc).__name__}: {exc}",
                         seconds=time.perf_counter() - start), None, {}
        if example_inputs is not None:
            broken = compat.replay_shape_guards(example_inputs, meta.get("record", {}).get("shape_guards", []))
            if broken is not None:
                self._log.info("%s: cache entry %s assumes %s, which these sizes break: compiling", graph_id,
                               key[:16], broken)
                return Probe("miss", key, reason=f"the entry assumes {broken}, which these sizes break",
                             seconds=time.perf_counter() - start), None, {}
        self.keys.append(key)
        probe = Probe("hit", key, reason=str(path), seconds=time.perf_counter() - start)
        self._log.info("%s: cache hit (%s), rebuilt in %.1f ms without running passes", graph_id, key[:16],
                       probe.seconds * 1e3)
        return probe, graph, meta.get("record", {})

    def _check_files(self, files: dict) -> None:
        """Kernel files the entry needs: one whose bytes changed is removed (its backend rebuilds it
        from the source the entry holds); a missing one is rebuilt the same way."""
        for relative, expected in files.items():
            path = self.root / relative
            if path.exists() and file_digest(path) != expected:
                self._log.warning("kernel file %s does not match its recorded hash: removed, rebuilding", path)
                _remove(path)

    def store(self, probe: Probe, final: torch.fx.GraphModule, *, target: str, record: dict) -> None:
        """Write the entry of a graph compiled on a miss; a graph that cannot be described is not
        stored and ``probe.reason`` says why. Never raises for a cache problem."""
        if probe.status != "miss" or probe.key is None:
            return
        try:
            with compat.real_tensors():
                self._store(probe, final, target=target, record=record)
        except Exception as exc:  # noqa: BLE001 - a cache problem never fails a compile that worked
            probe.reason = f"not stored: {type(exc).__name__}: {exc}"
            self._log.warning("compiled graph not stored in the cache: %s", probe.reason)

    def _store(self, probe: Probe, final: torch.fx.GraphModule, *, target: str, record: dict) -> None:
        codec = Codec({}, cache_dir=self.configured_dir)
        try:
            data, constants = graph_to_data(final, codec)
            files = self._files(codec.files)
        except UnsupportedGraph as exc:
            probe.reason = f"not stored: {exc}"
            self._log.info("compiled graph not stored in the cache: %s", exc)
            return
        meta = {"graph": data, "texts": codec.texts, "files": files, "record": record,
                "cuda_index": self._cuda_index.get(probe.key)}
        path = entry_path(self.root, probe.key)
        try:
            write_entry(path, probe.key, meta, constants, {"environment": environment(target), "target": target,
                                                           "code": self._code.get(probe.key, {})})
        except OSError as exc:
            probe.reason = f"not stored: cannot write {path}: {exc.strerror or exc}"
            self._log.warning("compiled graph not stored in the cache: %s", probe.reason)
            return
        probe.stored = True
        self.keys.append(probe.key)

    def _files(self, paths: list[str]) -> dict[str, str]:
        out = {}
        root = self.root.resolve()
        for name in paths:
            path = Path(name).resolve()
            try:
                relative = path.relative_to(root)
            except ValueError:
                raise UnsupportedGraph(f"kernel file {path} is outside the cache folder {root}") from None
            if not path.exists():
                raise UnsupportedGraph(f"kernel file {path} does not exist")
            out[str(relative)] = file_digest(path)
        return out


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


__all__ = ["GraphCache", "Probe"]
