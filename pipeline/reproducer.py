"""Writing reproducers: what ``verify: each`` leaves behind when a pass changes a result or
raises (the folder layout is described in :mod:`pipeline.tools.repro`, which replays them)."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
import torch.fx

from pipeline import compat
from pipeline.cache.graph_io import UnsupportedGraph, graph_to_data
from pipeline.plan.schema import Plan
from pipeline.registry import get_registry
from pipeline.plan.yamlio import dump_yaml



REPRO_DIR_ENV = "PIPELINE_REPRO_DIR"
MAX_SAVED_INPUT_BYTES = 64 << 20


@attrs.frozen
class Failure:
    """How a pass failed: ``mismatch`` (its output differs from its input graph's) or
    ``exception`` (it raised ``exception_type``)."""

    kind: Literal["mismatch", "exception"]
    message: str = ""
    exception_type: str | None = None

    def same_kind(self, other: "Failure | None") -> bool:
        """True when ``other`` is the same kind of failure (same exception type for exceptions)."""
        return other is not None and other.kind == self.kind and other.exception_type == self.exception_type

    def describe(self) -> str:
        """One line: ``mismatch: ...`` or ``exception RuntimeError: ...``."""
        if self.kind == "exception":
            return f"exception {self.exception_type}: {self.message}"
        return f"mismatch: {self.message}"


def repro_root() -> Path:
    """Where reproducers are written: ``$PIPELINE_REPRO_DIR`` or ``./pipeline-repro``."""
    return Path(os.environ.get(REPRO_DIR_ENV, "pipeline-repro"))


def write_reproducer(*, graph_id: str, position: int, plugin: str, received: torch.fx.GraphModule,
                     args: list, plan: Plan, failure: Failure, tags: list[str], target: str, role: str,
                     whole_prefix: bool = False) -> str:
    """Write a reproducer for the plan's pass number ``position`` (0 is capture) failing on
    ``received`` with inputs ``args``; returns the folder (or, when the folder cannot be written,
    a note saying why: the failure being reported matters more than its reproducer)."""
    pass_name = plan.passes[position].name
    folder = repro_root() / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{graph_id}-{pass_name}")
    first = 1 if whole_prefix else position
    info = {
        "format": 1,
        "graph": graph_id,
        "role": role,
        "pass": pass_name,
        "plugin": plugin,
        **_distribution_of(pass_name, plugin),
        "position": position,
        "replay_passes": [first, position],
        "failure": attrs.asdict(failure),
        "tags": sorted(tags),
        "target": target,
        "plan": plan.name,
        "torch": compat.TORCH_VERSION,
    }
    try:
        shutil.rmtree(folder / "minimized", ignore_errors=True)   # from an earlier failure of this pass
        write_folder(folder, info, received, args, plan=_prefix_plan(plan, position, graph_id))
    except OSError as exc:
        return f"(not written to {folder}: {exc})"
    return str(folder)


def _distribution_of(pass_name: str, plugin: str) -> dict:
    """``plugin_distribution`` and ``plugin_version`` of the installed distribution that registered
    ``pass_name`` (what to install to replay elsewhere); empty for a plugin registered from code."""
    entry = get_registry().pass_entry(pass_name)
    if entry is None or str(entry.plugin) != plugin or not entry.plugin.distribution:
        return {}
    return {"plugin_distribution": entry.plugin.distribution, "plugin_version": entry.plugin.version}


def write_folder(folder: Path, info: dict, graph: torch.fx.GraphModule, args: list, *,
                 plan: dict) -> None:
    """Write a reproducer's files (see the module docs) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("graph.json", "constants.pt", "inputs.pt"):
        (folder / stale).unlink(missing_ok=True)
    first, last = info["replay_passes"]
    head = (f"graph {info['graph']} as pass '{info['pass']}' received it" if first == last else
            f"graph {info['graph']} as captured (replay applies passes {first} to {last} of plan.yaml)")
    (folder / "graph.py").write_text(f"# {head}\n{graph.code}")
    try:
        data, constants = graph_to_data(graph)
    except UnsupportedGraph as exc:
        info["graph_data"] = f"not saved: {exc}"
    else:
        (folder / "graph.json").write_text(json.dumps(data, indent=1))
        torch.save(constants, folder / "constants.pt")
        info["graph_data"] = "graph.json"
    (folder / "inputs.json").write_text(json.dumps([_input_meta(a) for a in args], indent=2))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    real = not any(compat.is_fake(t) for t in tensors)
    size = sum(t.numel() * t.element_size() for t in tensors)
    info["inputs_saved"] = bool(real and size <= MAX_SAVED_INPUT_BYTES)
    if info["inputs_saved"]:
        torch.save([a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args], folder / "inputs.pt")
    (folder / "plan.yaml").write_text(dump_yaml(plan))
    (folder / "repro.json").write_text(json.dumps(info, indent=2))


def _prefix_plan(plan: Plan, position: int, graph_id: str) -> dict:
    data = plan.to_data()
    pass_name = plan.passes[position].name
    data["name"] = f"repro-{pass_name}"
    data["description"] = (f"The plan up to and including '{pass_name}', which failed on graph {graph_id}. "
                           f"`pipeline repro` applies only that last pass to graph.json.")
    data["passes"] = data["passes"][:position + 1]
    data["verify"] = "each"
    data["expect"] = {}
    return data


def _input_meta(value: Any) -> dict:
    if isinstance(value, torch.Tensor):
        return {"shape": [compat.size_hint(d) for d in value.shape],
                "stride": [compat.size_hint(d) for d in value.stride()],
                "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device)}
    return {"value": repr(compat.size_hint(value))}


# -- loading and replaying -------------------------------------------------------------------------


__all__ = ["Failure", "MAX_SAVED_INPUT_BYTES", "REPRO_DIR_ENV", "repro_root", "write_folder", "write_reproducer"]
