"""YAML reading with line numbers, on ``yaml.SafeLoader`` (a plan can never execute code).

Deliberate differences from plain ``yaml.safe_load``:
- booleans are only ``true``/``false`` (YAML 1.2), so ``verify: off`` means the string ``"off"``;
- a key given twice in one mapping is an error instead of silently keeping the last value;
- nesting deeper than :data:`MAX_DEPTH` is an error naming its line (no plan needs it, and Python's
  recursion limit would otherwise end the load with a traceback).
Mappings and sequences come back as :class:`Located` containers that remember the line of each entry.
Every failure, including a scalar that its tag cannot hold (``!!int abc``, an integer with more
digits than Python converts), is a :class:`PlanError` naming the source and line.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import PlanError

MAX_DEPTH = 64


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
    """SafeLoader that records lines, rejects duplicate keys and limits nesting."""

    source = "<plan>"
    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise PlanError(f"the YAML nests more than {MAX_DEPTH} levels deep; a plan never needs that",
                                file=self.source, line=mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as exc:
            # A scalar its tag cannot hold: ``!!int abc``, ``!!float x``, too many digits.
            raise PlanError(f"invalid YAML: cannot read {node.tag.rsplit(':', 1)[-1]} value: {exc}",
                            file=self.source, line=node.start_mark.line + 1) from None


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


def _reject_tag(loader: _PlanLoader, node: yaml.Node) -> None:
    raise PlanError(f"invalid YAML: the tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not used in "
                    f"plans; write a plain list or mapping", file=loader.source, line=node.start_mark.line + 1)


_PlanLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_PlanLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)
for _tag in ("set", "omap", "pairs"):
    _PlanLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _reject_tag)


def load_yaml(text: str | bytes, source: str) -> Any:
    """Parse one YAML document; errors become :class:`PlanError` naming ``source`` and the line."""
    return load_document(text, source)[0]


def load_document(text: str | bytes, source: str) -> tuple[Any, int | None]:
    """:func:`load_yaml`, also returning the line the document's content starts on (None for an
    empty document), so an error about a scalar document can name it."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            valid = text[:exc.start].decode("utf-8")
            raise PlanError(f"the file is not valid UTF-8 (byte {exc.start}): save it as UTF-8",
                            file=source, line=_line_at(valid, len(valid))) from None
    try:
        loader = _PlanLoader(text)
    except yaml.reader.ReaderError as exc:
        raise PlanError(f"the file holds a character YAML does not allow ({_character(exc.character)}); "
                        f"remove it", file=source, line=_line_at(text, exc.position)) from None
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        return loader.construct_document(node), node.start_mark.line + 1
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


_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _line_at(text: str, position: int) -> int:
    """1-based line of ``position``, counting line breaks as YAML does."""
    return len(_LINE_BREAK.findall(text, 0, position)) + 1


def _character(value: Any) -> str:
    code = value if isinstance(value, int) else ord(value)
    return f"U+{code:04X}"


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
