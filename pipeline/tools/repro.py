"""Reproducers: what ``verify: each`` leaves behind when a pass changes a result or raises, and
how ``pipeline repro DIR`` replays it.

A reproducer folder (under ``$PIPELINE_REPRO_DIR``, default ``./pipeline-repro``) holds:

- ``repro.json``: the graph id, the failing pass, its plugin (with the distribution and version to
  install, for an installed plugin) and position in the plan, the failure
  (``mismatch`` with the comparison message, or ``exception`` with its type), the invariant tags
  the graph had, and which passes the replay applies;
- ``graph.py``: the graph the failing pass received, as Python source (for reading);
- ``graph.json`` + ``constants.pt``: the same graph as data (operators by name, no pickled code),
  absent when the graph calls something that cannot be named (the reason is in ``repro.json``);
- ``inputs.json``: shape, stride, dtype and device of every input; ``inputs.pt``: their values
  when they were real tensors (a mismatch) of at most 64 MiB in all;
- ``plan.yaml``: the plan up to and including the failing pass (a valid plan: the passes it
  requires come before it). Replay applies only the failing pass to the saved graph (the
  one-pass plan), with the tags the earlier passes established; under ``verify: final`` the
  failing pass is not known and replay applies the whole plan to the captured graph.
"""
from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.fx

from pipeline import compat
from pipeline.errors import PassFailure, PipelineError
from pipeline.cache.graph_io import data_to_graph
from pipeline.graph_pass import PassContext
from pipeline.instruments import copy_graph
from pipeline.manager import BoundPass, PassManager
from pipeline.plan.schema import Plan, load_plan
from pipeline.registry import get_registry
from pipeline.verification import run_and_compare

from pipeline.reproducer import REPRO_DIR_ENV, Failure, repro_root, write_folder, write_reproducer  # noqa: F401


@attrs.define(eq=False)
class Reproducer:
    """A loaded reproducer folder, ready to replay."""

    directory: Path
    info: dict
    graph: torch.fx.GraphModule
    inputs: list
    plan: Plan

    @property
    def failure(self) -> Failure:
        """The failure recorded when the reproducer was written."""
        return Failure(**self.info["failure"])

    @property
    def pass_name(self) -> str:
        """The name of the pass the reproducer was written for (``pass`` in ``repro.json``)."""
        return self.info["pass"]


def _check_pass_is_registered(folder: Path, info: dict) -> None:
    """A clear error naming what to install when the reproducer's pass is not registered here."""
    name = info["pass"]
    if get_registry().pass_entry(name) is not None:
        return
    where = f"plugin {info.get('plugin', '?')}"
    distribution, version = info.get("plugin_distribution"), info.get("plugin_version")
    if distribution:
        pin = f"{distribution}=={version}" if version else distribution
        where += (f" (distribution {distribution} version {version or '?'}); install it "
                  f"(pip install '{pin}') and replay again")
    else:
        where += ", which was not installed from a distribution; register it (pipeline.register_plugin) " \
                 "in the process that replays, or install the package that provides it"
    raise PipelineError(f"{folder}: unknown pass '{name}': repro.json records it as coming from {where}")


def load_reproducer(directory: str | os.PathLike) -> Reproducer:
    """Load a reproducer folder written by :func:`write_reproducer` (or by the minimizer)."""
    folder = Path(directory)
    info_path = folder / "repro.json"
    if not info_path.is_file():
        raise PipelineError(f"{folder} is not a reproducer folder (no repro.json)")
    info = json.loads(info_path.read_text())
    _check_pass_is_registered(folder, info)
    if not (folder / "graph.json").is_file():
        raise PipelineError(f"{folder}: the graph could not be saved as data ({info.get('graph_data')}); "
                            f"graph.py shows it, and plan.yaml recompiles the model up to the failing pass")
    constants = torch.load(folder / "constants.pt", weights_only=True)
    graph = data_to_graph(json.loads((folder / "graph.json").read_text()), constants)
    metas = json.loads((folder / "inputs.json").read_text())
    if info.get("inputs_saved"):
        saved = torch.load(folder / "inputs.pt", weights_only=True)
        inputs = [v.to(meta["device"]) if isinstance(v, torch.Tensor) else v for v, meta in zip(saved, metas)]
    else:
        inputs = [_make_input(meta, seed) for seed, meta in enumerate(metas)]
    plan = load_plan(folder / "plan.yaml")
    return Reproducer(directory=folder, info=info, graph=graph, inputs=list(inputs), plan=plan)


def _make_input(meta: dict, seed: int) -> Any:
    if "value" in meta:
        return ast.literal_eval(meta["value"])
    dtype = getattr(torch, meta["dtype"])
    generator = torch.Generator().manual_seed(seed)
    shape = meta["shape"]
    if dtype.is_floating_point or dtype.is_complex:
        values = torch.randn(shape, generator=generator).to(dtype)
    elif dtype == torch.bool:
        values = torch.rand(shape, generator=generator) > 0.5
    else:
        values = torch.randint(-8, 9, shape, generator=generator).to(dtype)
    out = torch.empty_strided(shape, meta["stride"], dtype=dtype, device=meta["device"])
    out.copy_(values)
    return out


def replay(repro: Reproducer, graph: torch.fx.GraphModule | None = None,
           inputs: list | None = None) -> Failure | None:
    """Apply the reproducer's pass to ``graph`` (default: the saved one) and compare the result
    with ``graph`` on ``inputs``; the failure seen, or None when the pass now behaves."""
    graph = repro.graph if graph is None else graph
    inputs = repro.inputs if inputs is None else inputs
    registry = get_registry()
    first, last = repro.info["replay_passes"]
    bound = []
    for spec in repro.plan.passes[first:last + 1]:
        entry = registry.passes[spec.name]
        bound.append(BoundPass(entry.cls(spec.options), entry.plugin))
    work = copy_graph(graph)
    fakes = compat.fake_propagate(work, inputs)
    context = PassContext(graph_id=repro.info["graph"], target=repro.info["target"], example_inputs=fakes,
                          cache=repro.plan.cache, role=repro.info["role"], tags=set(repro.info["tags"]))
    manager = PassManager(bound, registry=registry, plugin_manager=registry.plugin_manager(),
                          check_invariants=True)
    try:
        result = manager.run(work, context)
    except PassFailure as exc:
        cause = exc.__cause__
        return Failure(kind="exception", message=str(cause or exc), exception_type=type(cause or exc).__name__)
    try:
        problem = run_and_compare(graph, result.forward, list(inputs))
    except Exception as exc:  # noqa: BLE001 - the transformed graph crashing when run is its failure
        return Failure(kind="exception", message=str(exc), exception_type=type(exc).__name__)
    return Failure(kind="mismatch", message=problem) if problem else None


__all__ = ["Failure", "Reproducer", "write_reproducer", "write_folder", "load_reproducer", "replay",
           "repro_root", "REPRO_DIR_ENV"]
