"""Plans as text: ``resolve`` (the fully defaulted plan as YAML that loads back to an equal plan)
and ``diff`` (what changes between two plans)."""
from __future__ import annotations

from typing import Any

from .options import unstructure
from .plan import Plan
from .yamlio import dump_yaml


def resolve_text(plan: Plan) -> str:
    """The fully defaulted plan as YAML. Loading it gives a plan equal to ``plan``."""
    header = f"# resolved from {plan.source or '<dict>'}"
    if plan.lineage:
        header += " (extends " + " <- ".join(plan.lineage) + ")"
    return header + "\n" + dump_yaml(plan.to_data())


def _flatten(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def diff_plans(a: Plan, b: Plan) -> list[str]:
    """Human-readable differences from ``a`` to ``b``: passes added (+), removed (-), moved (~),
    options and settings changed (~). Empty when the plans compile the same way."""
    lines: list[str] = []
    names_a, names_b = a.pass_names(), b.pass_names()
    for name in _multiset_minus(names_b, names_a):
        lines.append(f"+ pass {name} (at position {names_b.index(name)})")
    for name in _multiset_minus(names_a, names_b):
        lines.append(f"- pass {name} (was at position {names_a.index(name)})")
    common_a = [n for n in names_a if n in names_b]
    common_b = [n for n in names_b if n in names_a]
    if common_a != common_b:
        lines.append(f"~ order: {' -> '.join(common_a)}  became  {' -> '.join(common_b)}")
    seen: dict[str, int] = {}
    for spec_a in a.passes:
        occurrence = seen.get(spec_a.name, 0)
        seen[spec_a.name] = occurrence + 1
        matches = [s for s in b.passes if s.name == spec_a.name]
        if occurrence >= len(matches):
            continue
        spec_b = matches[occurrence]
        flat_a: dict = {}
        flat_b: dict = {}
        _flatten(spec_a.name, unstructure(spec_a.options), flat_a)
        _flatten(spec_b.name, unstructure(spec_b.options), flat_b)
        for key in flat_a:
            if flat_a[key] != flat_b.get(key):
                lines.append(f"~ {key}: {_show(flat_a[key])} -> {_show(flat_b.get(key))}")
    data_a = {k: v for k, v in a.to_data().items() if k != "passes"}
    data_b = {k: v for k, v in b.to_data().items() if k != "passes"}
    flat_a, flat_b = {}, {}
    _flatten("", data_a, flat_a)
    _flatten("", data_b, flat_b)
    for key in flat_a:
        if flat_a[key] != flat_b.get(key):
            lines.append(f"~ {key}: {_show(flat_a[key])} -> {_show(flat_b.get(key))}")
    return lines


def _multiset_minus(xs: list[str], ys: list[str]) -> list[str]:
    remaining = list(ys)
    out = []
    for x in xs:
        if x in remaining:
            remaining.remove(x)
        else:
            out.append(x)
    return out


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
