"""The variants the zoo compares, each a way to turn a model into something to call: eager,
torch.compile with Inductor in each mode, and our plans. A variant also says whether a compiled
model really ran compiled code (a silent eager fallback does not count as passing)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline import compilation_of, compile_with_plan  # noqa: E402


@attrs.frozen
class Variant:
    """``make(module, cache_dir)`` returns the callable; ``ran_compiled(callable, before)`` says
    whether it ran compiled code (``before`` is what :meth:`snapshot` read before it compiled) and,
    if not, why; ``step_begin`` runs before each training step (CUDA-graph trees need it)."""

    name: str
    kind: str                      # eager | inductor | ours | custom
    setting: str = ""              # the torch.compile mode or our plan
    step_begin: Callable[[], None] | None = None
    wrap: Callable[[torch.nn.Module], Callable] | None = None    # custom: how to make the callable

    def make(self, module: torch.nn.Module, cache_dir: Path, model: str = "") -> Callable:
        """The compiled callable; ``{model}`` in our plan's path is the zoo model's name (a plan
        per model, such as the ones benchmarks/zoo/tune.py writes)."""
        if self.kind == "eager":
            return module
        if self.kind == "custom":
            return self.wrap(module)
        if self.kind == "inductor":
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
            os.environ["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
            return torch.compile(module, mode=None if self.setting == "default" else self.setting)
        return compile_with_plan(module, self.setting.replace("{model}", model),
                                 cache={"dir": str(cache_dir / "pipeline")})

    def snapshot(self) -> int:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])

    def ran_compiled(self, compiled: Any, before: int) -> str | None:
        if self.kind in ("eager", "custom"):
            return None
        if self.kind == "inductor":
            return None if self.snapshot() > before else "Dynamo compiled no graph"
        summary = compilation_of(compiled).summary()
        if not summary["graphs"]:
            return "capture compiled no graph"
        if summary["fallbacks"]:
            return "fell back to eager: " + "; ".join(f["reason"][:200] for f in summary["fallbacks"])
        return None

    def details(self, compiled: Any) -> dict:
        """What the compile produced (graphs, breaks, kernels) where the variant can tell."""
        if self.kind != "ours":
            return {}
        summary = compilation_of(compiled).summary()
        return {"graphs": summary["graph_count"], "graph_breaks": len(summary["graph_breaks"]),
                "kernels": sum(g["kernels"] for g in summary["graphs"]),
                "recompiles": len(summary["recompiles"])}


def _mark_step() -> None:
    torch.compiler.cudagraph_mark_step_begin()


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("eager", "eager"),
    Variant("inductor-default", "inductor", "default"),
    Variant("inductor-reduce-overhead", "inductor", "reduce-overhead", step_begin=_mark_step),
    Variant("ours-default", "ours", "default"),
    Variant("ours-reduce-overhead", "ours", "reduce-overhead"),
    Variant("ours-training", "ours", "training"),
    Variant("ours-training-reduce-overhead", "ours", "training-reduce-overhead"),
)}

INFERENCE = {"cuda": ["eager", "inductor-default", "inductor-reduce-overhead", "ours-default", "ours-reduce-overhead"],
             "cpu": ["eager", "inductor-default", "ours-default"]}
TRAINING = {"cuda": ["eager", "inductor-default", "inductor-reduce-overhead", "ours-training",
                     "ours-training-reduce-overhead"],
            "cpu": ["eager", "inductor-default", "ours-training"]}
#: The variant each of ours is judged against: same mode.
SAME_MODE = {"ours-default": "inductor-default", "ours-reduce-overhead": "inductor-reduce-overhead",
             "ours-training": "inductor-default", "ours-training-reduce-overhead": "inductor-reduce-overhead"}


def variant(name: str) -> Variant:
    """The variant called ``name``: one of :data:`VARIANTS`, or ``<ours variant>@<plan>`` (a
    built-in plan's name or a YAML path), our plan judged in the named variant's mode, so that a
    plan's option can be compared with the built-in plans in the same run
    (``ours-default@plans/experiment.yaml``; ``ours-default@tuned/{model}.yaml``: one plan per model)."""
    if name in VARIANTS:
        return VARIANTS[name]
    base, _, plan = name.partition("@")
    if not plan or VARIANTS.get(base, Variant("", "")).kind != "ours":
        raise KeyError(f"no zoo variant {name!r}: one of {', '.join(VARIANTS)}, or <ours variant>@<plan>")
    return Variant(name, "ours", plan)


def same_mode(name: str) -> str | None:
    """The Inductor variant ``name`` (a variant of ours) is judged against, else None."""
    return SAME_MODE.get(name.partition("@")[0])


__all__ = ["INFERENCE", "SAME_MODE", "TRAINING", "VARIANTS", "Variant", "same_mode", "variant"]
