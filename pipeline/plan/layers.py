"""Edits an extending plan makes to its parent's pass list by name: ``remove:`` and ``options:``
(``insert:`` needs the pass-entry parser and stays in :mod:`.schema`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from pipeline.errors import PlanError, did_you_mean
from pipeline.options import convert_fields
from pipeline.plan.yamlio import clip, line_of

if TYPE_CHECKING:
    from pipeline.plan.schema import PassSpec
    from pipeline.registry import Registry


def remove_passes(passes: tuple[PassSpec, ...], raw: Any, source: str, line: int | None) -> tuple:
    """``passes`` without those named by a layer's ``remove:`` (each must be there)."""
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise PlanError("expected a list of pass names", file=source, line=line, key="remove")
    names = [p.name for p in passes]
    for i, name in enumerate(raw):
        if name not in names:
            raise PlanError(f"the parent plan has no pass '{clip(name)}' to remove"
                            f"{did_you_mean(name, names)}", file=source, line=line_of(raw, i) or line,
                            key=f"remove[{i}]")
    return tuple(p for p in passes if p.name not in raw)


def merge_options(passes: tuple[PassSpec, ...], raw: Any, source: str, registry: Registry,
                  line: int | None) -> tuple:
    """``passes`` with a layer's ``options:`` (pass name -> options) merged into theirs."""
    if not isinstance(raw, dict):
        raise PlanError("expected a mapping of pass name to options", file=source, line=line, key="options")
    names = [p.name for p in passes]
    updates = {}
    for name, opts in raw.items():
        name_line = line_of(raw, name) or line
        if name not in names:
            raise PlanError(f"the plan has no pass '{clip(name)}' to set options on"
                            f"{did_you_mean(str(name), names)}",
                            file=source, line=name_line, key=f"options.{clip(name)}")
        cls = registry.passes[name].cls
        updates[name] = convert_fields(cls.Options, opts, source=source, key=f"options.{name}", line=name_line)
    return tuple(attrs.evolve(p, options=attrs.evolve(p.options, **updates[p.name])) if p.name in updates
                 else p for p in passes)
