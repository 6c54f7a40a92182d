"""The compile cache: where cached artefacts live, what a compiled graph's key is made of, and the
on-disk entries that let a later process skip the graph passes.

One folder holds everything (:func:`cache_root`): the plan's ``cache.dir``, else
``$PIPELINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/plan-pipeline`` (``~/.cache/plan-pipeline``).
Backends keep their kernels in subfolders of it (``cpp/``, ``triton/``); whole compiled graphs
are entries under ``graphs/``.

A graph's key (:func:`graph_key`) hashes everything that can change what the passes produce:

- the captured graph as data (operators by name, arguments, tensor constants by content) and the
  metadata of its example inputs (shapes with symbolic sizes by name, strides, dtypes, devices,
  whether Dynamo marked an input static);
- for symbolic sizes, what the shape environment knows about them when the graph is captured:
  every guard, every replacement and each symbol's value range (two graphs of the same
  operators over the same symbol names, captured under different assumptions, never share an
  entry). The guards the passes themselves add are stored in the entry and assumed again when
  it is loaded; an entry whose guards do not hold for the sizes at hand is not used;
- the resolved plan (:meth:`Plan.to_data`, less its ``cache`` section, which says where entries
  live, not what they hold), the graph's role (inference, forward, backward) and target;
- every pass's ``version`` and its plugin's distribution and version, and a hash of the source
  files of every package a pass or the engine comes from (so editing a pass in a source checkout
  without bumping its version never serves a stale graph);
- torch, triton and Python versions, and the device: the GPU model and compute capability for
  CUDA targets, the CPU's instruction set for CPU targets.

Environment variables are not part of the key: they change verbosity and dumps only (``CXX``
feeds the C++ kernel cache's own key). A pass with an empty ``version`` makes the plan
uncacheable: every graph records why and the ``cache`` log says so.

Entries (:func:`write_entry` / :func:`read_entry`) are one file each: a JSON header line with the
payload's length and SHA-256, then the payload: the graph as plain JSON data, then the raw bytes of
its tensor constants (dtype, shape and strides in the JSON). Nothing is unpickled on load (and
``torch.load`` is avoided on purpose: inside a Dynamo backend on torch 2.13 it returns meta
tensors). A truncated or corrupted entry is
detected, reported, removed and rebuilt, never loaded. Writes go to a temporary file renamed into
place, so readers never see half an entry and two processes compiling the same graph both succeed
(the last rename wins; both wrote the same thing)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from pipeline import compat
from pipeline.cache.graph_io import UnsupportedGraph, graph_to_data

ENV_DIR = "PIPELINE_CACHE_DIR"
#: ``0``/``off`` turns the compiled-graph cache off in this process (a kill switch for debugging
#: and for test suites that count pass runs; it never changes what is compiled).
ENV_GRAPHS = "PIPELINE_CACHE_GRAPHS"
ENTRY_FORMAT = 3
MAGIC = "plan-pipeline-graph"


class CorruptEntry(Exception):
    """A cache entry that must not be loaded (truncated, checksum mismatch, wrong key or format)."""


def cache_root(configured: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``configured`` (the plan's ``cache.dir``), else ``$PIPELINE_CACHE_DIR``,
    else the per-user default. Not created here."""
    root = configured or os.environ.get(ENV_DIR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "plan-pipeline")
    return Path(root)


def graphs_enabled() -> bool:
    """False when ``PIPELINE_CACHE_GRAPHS`` turns the compiled-graph cache off."""
    return os.environ.get(ENV_GRAPHS, "1").strip().lower() not in ("0", "off", "false", "no")


@lru_cache(maxsize=None)
def cpu_isa() -> str:
    """A fingerprint of this CPU's model and instruction set (``-march=native`` code depends on it)."""
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


@lru_cache(maxsize=None)
def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device(target: str) -> str:
    if target == "cuda":
        if not torch.cuda.is_available():
            return "cuda (no device visible)"
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda {torch.cuda.get_device_name(index)} sm_{major}{minor}"
    return f"cpu {platform.machine()} isa {cpu_isa()}"


def environment(target: str) -> dict:
    """The versions and device a compiled graph depends on (part of every key, and what portable
    artifacts are checked against)."""
    return {
        "torch": torch.__version__,
        "triton": _distribution_version("triton"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "device": _device(target),
    }


@lru_cache(maxsize=None)
def _tree_hash(folder: str) -> str:
    """SHA-256 of every ``.py`` file under ``folder`` (names and contents), once per process."""
    digest = hashlib.sha256()
    base = Path(folder)
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(base)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def code_fingerprint(objects: list) -> dict[str, str]:
    """For the top-level package (or lone module file) each object's class comes from, and for
    the engine itself: a hash of its source files."""
    return code_fingerprint_of({"pipeline"} | {type(o).__module__.split(".")[0] for o in objects})


def code_fingerprint_of(modules: Any) -> dict[str, str]:
    """:func:`code_fingerprint` for top-level module names (each must be imported already)."""
    out = {}
    for name in sorted(modules):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if not file:
            out[name] = "unknown"
            continue
        path = Path(file)
        out[name] = _tree_hash(str(path.parent)) if path.name == "__init__.py" else _file_hash(str(path))
    return out


@lru_cache(maxsize=None)
def _file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]


# -- keys ----------------------------------------------------------------------------------------
def input_metadata(value: Any) -> Any:
    """What a key records of one example input."""
    if isinstance(value, torch.Tensor):
        return {"shape": [_size(s) for s in value.shape], "stride": [_size(s) for s in value.stride()],
                "dtype": str(value.dtype), "device": str(value.device), "requires_grad": value.requires_grad,
                "static": isinstance(value, torch.nn.Parameter)
                or getattr(value, "_dynamo_static_input_type", None) is not None}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"symbolic": str(value)}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return {"value": value}
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def _backward_input(metadata: Any) -> Any:
    """A backward graph runs without autograd, so whether an example input required gradients is
    not part of its key (it varies with where the input came from: a tangent from autograd, or
    a saved tensor from a forward compiled in this process or rebuilt from the cache)."""
    if isinstance(metadata, dict):
        metadata = {k: v for k, v in metadata.items() if k != "requires_grad"}
    return metadata


def _size(s: Any) -> Any:
    return s if type(s) is int else str(s)


def graph_material(gm: torch.fx.GraphModule) -> tuple[Any, str | None]:
    """(what a key records of a captured graph, a note when it is keyed on its source text).

    The graph as data (operators by name, constants by content hash); a graph that cannot be
    written as data is keyed on its generated source plus the module and name of every callee."""
    try:
        data, constants = graph_to_data(gm, traces=False)
        note = None
    except UnsupportedGraph as exc:
        callees = [f"{getattr(n.target, '__module__', '?')}.{getattr(n.target, '__qualname__', repr(n.target))}"
                   for n in gm.graph.nodes if n.op == "call_function"]
        data, note = {"code": gm.code, "callees": callees}, f"keyed on the graph's source ({exc})"
        constants = {name: t for name, t in gm.named_buffers()}
        constants.update({name: p for name, p in gm.named_parameters()})
    digests = {name: _tensor_digest(t) for name, t in sorted(constants.items())}
    return {"graph": data, "constants": digests}, note


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    head = f"{t.dtype} {list(t.shape)}".encode()
    body = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(head + body).hexdigest()[:32]


def plan_material(plan: Any, passes: list, target: str) -> tuple[dict | None, str | None]:
    """(what a key hashes about the plan, its passes and the machine, None) or (None, why the plan
    cannot be cached). ``passes`` are the plan's bound passes (capture first), with ``instance``
    and ``plugin``."""
    for bound in passes:
        cls = type(bound.instance)
        if not isinstance(cls.version, str) or not cls.version.strip():
            return None, (f"pass '{cls.name}' ({bound.plugin}) has no version, so its output cannot be "
                          "told apart from an older one: the plan is uncacheable")
    plan_data = dict(plan.to_data())
    plan_data.pop("cache", None)
    return {
        "format": ENTRY_FORMAT,
        "target": target,
        "plan": plan_data,
        "passes": [{"name": type(b.instance).name, "version": type(b.instance).version,
                    "plugin": getattr(b.plugin, "distribution", None) or getattr(b.plugin, "module", None),
                    "plugin_version": getattr(b.plugin, "version", None),
                    "material": b.instance.cache_material()} for b in passes],
        "code": code_fingerprint([b.instance for b in passes]),
        "environment": environment(target),
    }, None


def key_material(gm: torch.fx.GraphModule, example_inputs: list, *, plan: Any, passes: list, role: str,
                 target: str) -> tuple[dict | None, str | None]:
    """(everything the key of this graph hashes, None) or (None, why it cannot be cached).

    ``passes`` are the plan's bound passes (capture first), with ``instance`` and ``plugin``."""
    material, reason = plan_material(plan, passes, target)
    if material is None:
        return None, reason
    graph, _ = graph_material(gm)
    material.update({
        "graph": graph,
        "inputs": [_backward_input(input_metadata(v)) if role == "backward" else input_metadata(v)
                   for v in example_inputs],
        "shapes": compat.shape_facts(example_inputs),
        "role": role,
    })
    index = single_cuda_index([material["graph"], material["inputs"]])
    if index is not None:   # one GPU: keyed on "cuda", so every rank of a host finds the entry
        material["graph"], material["inputs"] = relocate_cuda([material["graph"], material["inputs"]], index, None)
        material["cuda_index"] = index   # not hashed: digest() leaves it out
    return material, None


_CUDA = re.compile(r"cuda:(\d+)")


def single_cuda_index(data: Any) -> int | None:
    """The index of the one CUDA device that ``data`` (a graph's material, an entry's graph)
    names as ``"cuda:N"`` strings, or None when it names none or several."""
    found = {int(m.group(1)) for m in _CUDA.finditer(json.dumps(data, default=str))}
    return found.pop() if len(found) == 1 else None


def relocate_cuda(data: Any, old: int | None, new: int | None) -> Any:
    """``data`` with every string ``"cuda:<old>"`` (or ``"cuda"`` when ``old`` is None) replaced by
    ``"cuda:<new>"`` (or ``"cuda"``): a graph compiled for one GPU of a host, rebuilt for another."""
    before = "cuda" if old is None else f"cuda:{old}"
    after = "cuda" if new is None else f"cuda:{new}"
    if isinstance(data, str):
        return after if data == before else data
    if isinstance(data, list):
        return [relocate_cuda(v, old, new) for v in data]
    if isinstance(data, tuple):
        return tuple(relocate_cuda(v, old, new) for v in data)
    if isinstance(data, dict):
        return {k: relocate_cuda(v, old, new) for k, v in data.items()}
    return data


ENV_KEYS = "PIPELINE_CACHE_KEYS_DIR"


def dump_key_material(key: str, material: dict, graph_id: str) -> None:
    """With ``PIPELINE_CACHE_KEYS_DIR`` set, write what a graph's key hashes to
    ``<dir>/<pid>/<graph id>-<role>-<key prefix>.json``: diffing two such files says why two
    processes (two ranks, two machines) missed each other's entries."""
    folder = os.environ.get(ENV_KEYS)
    if not folder:
        return
    path = Path(folder) / str(os.getpid()) / f"{graph_id}-{material.get('role')}-{key[:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(material, sort_keys=True, default=str, indent=1))


def digest(material: dict) -> str:
    """The key: SHA-256 of the material as canonical JSON (the CUDA index it was relocated from is
    not part of it)."""
    material = {k: v for k, v in material.items() if k != "cuda_index"}
    text = json.dumps(material, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# -- entries -------------------------------------------------------------------------------------
def entry_path(root: Path, key: str) -> Path:
    """Where the entry of ``key`` lives under the cache root."""
    return root / "graphs" / key[:2] / f"{key}.entry"


def write_entry(path: Path, key: str, meta: dict, constants: dict[str, torch.Tensor],
                header_extra: dict | None = None) -> None:
    """Write an entry atomically: header line (format, key, payload length and SHA-256), then the
    payload. Raises OSError when the folder cannot be written."""
    blob = io.BytesIO()
    tensors = []
    for name, value in constants.items():
        device = value.device
        value = value.detach().cpu()
        raw = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        tensors.append({"name": name, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                        "stride": list(value.stride()), "offset": blob.tell(), "nbytes": len(raw),
                        "device": device.type})
        blob.write(raw)
    text = json.dumps({**meta, "tensors": tensors}).encode()
    payload = text + blob.getvalue()
    header = {"magic": MAGIC, "format": ENTRY_FORMAT, "key": key, "bytes": len(payload), "meta_bytes": len(text),
              "sha256": hashlib.sha256(payload).hexdigest(), **(header_extra or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(header).encode() + b"\n" + payload)


def atomic_write(path: Path, content: bytes) -> None:
    """Write ``content`` to a temporary file beside ``path`` and rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.replace(tmp, path)
        tmp = ""
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read_header(path: Path) -> tuple[dict, bytes]:
    """(header, payload) of an entry whose length and checksum match; :class:`CorruptEntry` else."""
    raw = path.read_bytes()
    line, sep, payload = raw.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        raise CorruptEntry("the header is not JSON") from None
    if not sep or not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise CorruptEntry("not a cache entry")
    if header.get("format") != ENTRY_FORMAT:
        raise CorruptEntry(f"entry format {header.get('format')!r}, this version reads {ENTRY_FORMAT}")
    if len(payload) != header.get("bytes"):
        raise CorruptEntry(f"truncated: {len(payload)} of {header.get('bytes')} payload bytes")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CorruptEntry("checksum mismatch: the payload changed after it was written")
    return header, payload


def read_entry(path: Path, key: str) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(header, meta, constants) of a verified entry for ``key``; :class:`CorruptEntry` when it is
    damaged or belongs to another key. Tensors are rebuilt from raw bytes (no code runs)."""
    header, payload = read_header(path)
    if header.get("key") != key:
        raise CorruptEntry(f"the entry holds key {str(header.get('key'))[:16]}, not {key[:16]}")
    try:
        split = int(header["meta_bytes"])
        meta = json.loads(payload[:split])
        blob = payload[split:]
        constants = {t["name"]: _tensor_from_bytes(t, blob) for t in meta.pop("tensors")}
    except Exception as exc:  # noqa: BLE001 - any failure to read a checksummed payload is corruption
        raise CorruptEntry(f"unreadable payload: {type(exc).__name__}: {exc}") from None
    return header, meta, constants


def _tensor_from_bytes(spec: dict, blob: bytes) -> torch.Tensor:
    dtype = getattr(torch, spec["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {spec['dtype']!r}")
    out = torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype)
    if spec["nbytes"]:
        raw = bytearray(blob[spec["offset"]:spec["offset"] + spec["nbytes"]])
        out.copy_(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(spec["shape"]))
    device = spec.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}")
    return out if device == "cpu" else out.to(device)   # a graph constant lives where it was compiled


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest_ = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest_.update(chunk)
    return digest_.hexdigest()


__all__ = ["cache_root", "graphs_enabled", "cpu_isa", "environment", "code_fingerprint", "code_fingerprint_of",
           "key_material", "plan_material",
           "digest", "entry_path", "write_entry", "read_entry", "read_header", "atomic_write",
           "file_digest", "CorruptEntry", "ENV_DIR", "ENV_GRAPHS"]
