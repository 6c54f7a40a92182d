"""YAML reading with line numbers, on ``yaml.SafeLoader`` (a plan can never execute code).

Deliberate differences from plain ``yaml.safe_load``:
- plain scalars resolve as YAML 1.2's core schema says, not YAML 1.1's: booleans are only
  ``true``/``false``, so ``verify: off`` means the string ``"off"``; integers are decimal, ``0o17`` or
  ``0x1F`` (``010`` is ten, and ``1:30``, ``1_000`` and ``0b11`` are strings, where YAML 1.1 reads 90,
  1000 and 3); floats may have an exponent without a dot (``1e3``); and ``2024-01-01`` is a string,
  not a date;
- a plan is at most :data:`MAX_PLAN_BYTES`, holds at most :data:`MAX_NODES` values and has keys of at
  most :data:`MAX_KEY_CHARS` characters. Size is checked before parsing, the others while parsing (a
  file, text) or before validation (data given directly, :func:`check_data`), so rejecting an
  oversized plan costs at most what loading the largest allowed one costs (well under a second);
- a key given twice in one mapping is an error instead of silently keeping the last value;
- nesting deeper than :data:`MAX_DEPTH` is an error naming its line (no plan needs it, and Python's
  recursion limit would otherwise end the load with a traceback).
Mappings and sequences come back as :class:`Located` containers that remember the line of each entry.
Every failure, including a scalar that its tag cannot hold (``!!int abc``, an integer with more
digits than Python converts), is a :class:`PlanError` naming the source and line. An error quotes
user text through :func:`clip`, so a huge value never fills the message.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PlanError

MAX_DEPTH = 64
# The built-in plans are at most 3 KiB and 100 YAML values (a resolved one about 300 values), so these
# leave room for any real plan. They bound the work of loading one, which grows with the number of
# values and the size of the text (PyYAML is pure Python): at these limits the worst plan loads or is
# rejected in about a second.
MAX_PLAN_BYTES = 256 << 10
MAX_NODES = 5000
# Pass names, option names, input and axis names: none needs more.
MAX_KEY_CHARS = 256
# How much of one piece of user text (a name, a value) an error message quotes.
QUOTE_CHARS = 80


def clip(text: Any, limit: int = QUOTE_CHARS) -> str:
    """``text`` as an error message quotes it: at most ``limit`` characters, cut with ``...``."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _size(count: int) -> str:
    if count % (1 << 20) == 0:
        return f"{count >> 20} MiB"
    if count % (1 << 10) == 0:
        return f"{count >> 10} KiB"
    return f"{count} bytes"


def too_long_key(key: Any, what: str = "a key") -> str | None:
    """Why ``key`` (a mapping key or a pass name) is too long to be one, or None."""
    if isinstance(key, str) and len(key) > MAX_KEY_CHARS:
        return f"{what} is at most {MAX_KEY_CHARS} characters; this one has {len(key)} ('{clip(key)}')"
    return None


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
    nodes = 0

    def compose_node(self, parent, index):
        self.depth += 1
        self.nodes += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise PlanError(f"the YAML nests more than {MAX_DEPTH} levels deep; a plan never needs that",
                                file=self.source, line=mark.line + 1)
            if self.nodes > MAX_NODES:
                mark = self.peek_event().start_mark
                raise PlanError(f"the plan holds more than {MAX_NODES} YAML values (scalars, lists and mappings; "
                                f"an alias counts each time it is used); a plan never needs that many",
                                file=self.source, line=mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, AttributeError) as exc:
            # A scalar its tag cannot hold: ``!!int abc``, ``!!float x``, too many digits, a
            # ``!!timestamp`` that is no date (PyYAML's constructor then fails on a missing match).
            kind = node.tag.rsplit(':', 1)[-1]
            detail = f"{getattr(node, 'value', '')!r} is not one" if isinstance(exc, AttributeError) else exc
            raise PlanError(f"invalid YAML: cannot read {kind} value: {detail}",
                            file=self.source, line=node.start_mark.line + 1) from None


# YAML 1.2 core schema resolvers for booleans and numbers (PyYAML's SafeLoader has YAML 1.1's).
_YAML_1_1_ONLY = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
_RESOLVERS_1_2 = (
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
    ("tag:yaml.org,2002:float", re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                           r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+.0123456789")),
)
_PlanLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_1_1_ONLY]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _regexp, _first in _RESOLVERS_1_2:
    _PlanLoader.add_implicit_resolver(_tag, _regexp, _first)


def _construct_int(loader: _PlanLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    if digits[:2] in ("0o", "0x"):
        return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
    return sign * int(digits, 10)


def _construct_float(loader: _PlanLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node)
    special = text.lower().lstrip("+-")
    if special == ".inf":
        return -math.inf if text.startswith("-") else math.inf
    if special == ".nan":
        return math.nan
    return float(text)


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
        problem = too_long_key(key)
        if problem:
            raise PlanError(problem, file=loader.source, line=line)
        if key in out:
            raise PlanError(f"key '{clip(key)}' is given twice in the same mapping (first on line "
                            f"{out.key_lines[key]})", file=loader.source, line=line, key=clip(key))
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


_PlanLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_PlanLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_PlanLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_PlanLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)
for _tag in ("set", "omap", "pairs"):
    _PlanLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _reject_tag)


def load_yaml(text: str | bytes, source: str) -> Any:
    """Parse one YAML document; errors become :class:`PlanError` naming ``source`` and the line."""
    return load_document(text, source)[0]


def read_plan_file(path: Path) -> bytes:
    """The bytes of a plan file, refusing one larger than :data:`MAX_PLAN_BYTES` without reading
    more than that (even a growing file or a device)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_PLAN_BYTES + 1)
            if len(data) > MAX_PLAN_BYTES:
                handle.seek(0, 2)
                _too_big(max(handle.tell(), len(data)), str(path))
    except OSError as exc:
        raise PlanError(f"cannot read the plan: {exc.strerror or exc}", file=str(path)) from None
    return data


def _too_big(size: int, source: str, unit: str = "bytes") -> None:
    raise PlanError(f"the plan is {size} {unit}; a plan is at most {_size(MAX_PLAN_BYTES)} (the built-in "
                    f"plans are a few KiB)", file=source)


def check_data(data: Any, source: str) -> None:
    """Apply a plan file's limits to plan data given directly (a dict plan, overrides): at most
    :data:`MAX_PLAN_BYTES` of content, counted roughly as YAML would spell it, :data:`MAX_NODES`
    values, keys of at most :data:`MAX_KEY_CHARS` characters and nesting of at most :data:`MAX_DEPTH`.
    It stops at the first limit passed, so its cost is bounded by the limits; data that contains
    itself nests too deep."""
    budget, nodes = MAX_PLAN_BYTES, 1
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PlanError(f"the plan nests more than {MAX_DEPTH} levels deep (or contains itself); a plan "
                            f"never needs that", file=source)
        is_dict, is_list = isinstance(value, dict), isinstance(value, (list, tuple))
        nodes += 2 * len(value) if is_dict else len(value) if is_list else 0   # counted before visited
        if nodes > MAX_NODES:
            raise PlanError(f"the plan holds more than {MAX_NODES} values (scalars, lists and mappings); a plan "
                            f"never needs that many", file=source)
        if is_dict:
            for key in value:
                problem = too_long_key(key)
                if problem:
                    raise PlanError(problem, file=source)
                budget -= (len(key) if isinstance(key, str) else 8) + 2       # "key: "
            stack.extend((child, depth + 1) for child in value.values())
        elif is_list:
            budget -= 2 * len(value)                                          # "- "
            stack.extend((child, depth + 1) for child in value)
        else:
            budget -= len(value) if isinstance(value, str) else 8
        if budget < 0:
            raise PlanError(f"the plan holds more than {_size(MAX_PLAN_BYTES)} of data, the most a plan may hold "
                            f"(the built-in plans are a few KiB)", file=source)


def load_document(text: str | bytes, source: str) -> tuple[Any, int | None]:
    """:func:`load_yaml`, also returning the line the document's content starts on (None for an
    empty document), so an error about a scalar document can name it."""
    if len(text) > MAX_PLAN_BYTES:
        _too_big(len(text), source, "bytes" if isinstance(text, bytes) else "characters")
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


class _PlanDumper(yaml.SafeDumper):
    """SafeDumper that also quotes strings YAML 1.2 would read as numbers (``1e3``), so what it writes
    reads back the same with the plan loader (and with YAML 1.1 readers: their resolvers stay)."""


for _tag, _regexp, _first in _RESOLVERS_1_2:
    _PlanDumper.add_implicit_resolver(_tag, _regexp, _first)


def dump_yaml(data: Any) -> str:
    """Write plain data (dicts, lists, scalars) as block-style YAML in the given key order."""
    return yaml.dump(data, Dumper=_PlanDumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
