"""Plans as text: ``resolve`` (the fully defaulted plan as YAML that loads back to an equal plan)
and ``diff`` (what changes between two plans)."""
from __future__ import annotations

import difflib
from typing import Any

from pipeline.options import unstructure
from pipeline.plan.schema import Plan
from pipeline.plan.yamlio import dump_yaml


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
    options, graph roles (``on:``) and settings changed (~). Empty when the plans compile the same way."""
    lines: list[str] = []
    names_a, names_b = a.pass_names(), b.pass_names()
    pairs, removed, added = _align(names_a, names_b)
    for j in added:
        lines.append(f"+ pass {names_b[j]} (at position {j})")
    for i in removed:
        lines.append(f"- pass {names_a[i]} (was at position {i})")
    common_a = [names_a[i] for i, _ in pairs]
    common_b = [names_b[j] for _, j in sorted(pairs, key=lambda pair: pair[1])]
    if common_a != common_b:
        lines.append(f"~ order: {' -> '.join(common_a)}  became  {' -> '.join(common_b)}")
    for i, j in pairs:
        flat_a: dict = {}
        flat_b: dict = {}
        _flatten(names_a[i], unstructure(a.passes[i].options), flat_a)
        _flatten(names_b[j], unstructure(b.passes[j].options), flat_b)
        lines.extend(_changes(flat_a, flat_b))
        roles_a, roles_b = a.passes[i].roles, b.passes[j].roles
        if roles_a != roles_b:   # the graph roles a pass runs on (``on:``; all: null)
            lines.append(f"~ {names_b[j]}.on: {_show(list(roles_a) if roles_a else None)} -> "
                         f"{_show(list(roles_b) if roles_b else None)}")
    data_a = {k: v for k, v in a.to_data().items() if k != "passes"}
    data_b = {k: v for k, v in b.to_data().items() if k != "passes"}
    flat_a, flat_b = {}, {}
    _flatten("", data_a, flat_a)
    _flatten("", data_b, flat_b)
    lines.extend(_changes(flat_a, flat_b))
    return lines


def _align(names_a: list[str], names_b: list[str]) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Pair the passes of ``a`` with those of ``b``: first the longest run-preserving matching
    (so deleting or inserting passes never reads as a reorder), then any same-named leftovers
    (those moved). Returns the pairs in ``a``'s order, the unpaired indices of ``a`` (removed)
    and of ``b`` (added)."""
    matcher = difflib.SequenceMatcher(None, names_a, names_b, autojunk=False)
    pairs = [(block.a + k, block.b + k) for block in matcher.get_matching_blocks()
             for k in range(block.size)]
    paired_a = {i for i, _ in pairs}
    free_b = [j for j in range(len(names_b)) if j not in {j for _, j in pairs}]
    removed = []
    for i in range(len(names_a)):
        if i in paired_a:
            continue
        j = next((j for j in free_b if names_b[j] == names_a[i]), None)
        if j is None:
            removed.append(i)
        else:
            free_b.remove(j)
            pairs.append((i, j))
    return sorted(pairs), removed, free_b


def _changes(flat_a: dict, flat_b: dict) -> list[str]:
    """``~ key: old -> new`` for every key whose value differs, including keys only one side has
    (a dict option's entries)."""
    keys = list(flat_a) + [k for k in flat_b if k not in flat_a]
    return [f"~ {key}: {_show(flat_a.get(key))} -> {_show(flat_b.get(key))}"
            for key in keys if flat_a.get(key) != flat_b.get(key)]


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
