"""YAML reading with line numbers, on ``yaml.SafeLoader`` (a plan can never execute code).

Two deliberate differences from plain ``yaml.safe_load``:
- booleans are only ``true``/``false`` (YAML 1.2), so ``verify: off`` means the string ``"off"``;
- a key given twice in one mapping is an error instead of silently keeping the last value.
Mappings and sequences come back as :class:`Located` containers that remember the line of each entry.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import PlanError


class LocatedDict(dict):
    """A dict that knows its own line and the line of each key (1-based)."""

    line: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}


class LocatedList(list):
    """A list that knows its own line and the line of each item (1-based)."""

    line: int | None = None

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list[int | None] = []


class _PlanLoader(yaml.SafeLoader):
    """SafeLoader that records lines and rejects duplicate keys."""

    source = "<plan>"


_PlanLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_PlanLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _construct_mapping(loader: _PlanLoader, node: yaml.MappingNode, deep: bool = False) -> LocatedDict:
    loader.flatten_mapping(node)
    out = LocatedDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise PlanError("a mapping key must be a plain scalar, not a list or mapping",
                            file=loader.source, line=line) from None
        if key in out:
            raise PlanError(f"key '{key}' is given twice in the same mapping (first on line "
                            f"{out.key_lines[key]})", file=loader.source, line=line, key=str(key))
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


def _construct_sequence(loader: _PlanLoader, node: yaml.SequenceNode, deep: bool = False) -> LocatedList:
    out = LocatedList()
    out.line = node.start_mark.line + 1
    for child in node.value:
        out.append(loader.construct_object(child, deep=True))
        out.item_lines.append(child.start_mark.line + 1)
    return out


_PlanLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_PlanLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def load_yaml(text: str | bytes, source: str) -> Any:
    """Parse one YAML document; errors become :class:`PlanError` naming ``source`` and the line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlanError(f"the file is not valid UTF-8 (byte {exc.start}): save it as UTF-8",
                            file=source, line=text.count(b"\n", 0, exc.start) + 1) from None
    loader = _PlanLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except PlanError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise PlanError(f"invalid YAML: {problem}", file=source, line=line) from None
    except yaml.YAMLError as exc:
        raise PlanError(f"invalid YAML: {exc}", file=source) from None
    except RecursionError:
        raise PlanError("the YAML nests too deeply to be a plan", file=source) from None
    finally:
        loader.dispose()


def line_of(container: Any, key: Any) -> int | None:
    """The line of ``key`` (a dict key or list index) inside a located container, if known."""
    if isinstance(container, LocatedDict):
        return container.key_lines.get(key, container.line)
    if isinstance(container, LocatedList):
        if isinstance(key, int) and 0 <= key < len(container.item_lines):
            return container.item_lines[key]
        return container.line
    return None


def dump_yaml(data: Any) -> str:
    """Write plain data (dicts, lists, scalars) as block-style YAML in the given key order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
