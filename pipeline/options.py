"""Typed, documented options: declared once on a frozen attrs class, checked when a plan loads,
printed back by ``resolve`` and rendered into the plan reference.

A pass declares its options like this::

    @attrs.frozen
    class FuseOptions:
        max_group_size: int = option(64, "Most nodes one fused group may hold.", check=positive)

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None``,
``list[X]``, ``dict[str, X]`` and nested attrs classes built from the same.

Checks every option gets, before its own ``check``: a float is finite (``.nan`` and ``.inf`` are
rejected; an option where they mean something declares ``option(..., finite=False)``), and a string
holds no NUL character (no path, name or pattern can contain one, and it would only fail later
inside a compiler or the OS).
"""
from __future__ import annotations

import math
import types
import typing
from typing import Any, Callable, Literal, Union

import attrs

from pipeline.errors import PlanError, did_you_mean, nearest
from pipeline.plan.yamlio import clip, line_of

_NO_DEFAULT = attrs.NOTHING


def option(default: Any, doc: str, *, check: Callable[[Any], str | None] | None = None,
           finite: bool = True, tune: tuple | list | None = None) -> Any:
    """Declare one option: its default, a one-line doc, and an optional check returning an error
    message (or None) for a well-typed but invalid value. ``finite=False`` lets a float option (or
    floats inside a list or mapping option) be NaN or infinite. ``tune`` makes the option tunable:
    the values ``pipeline tune`` tries for it (any value it tries must keep the model's results
    correct: an option that trades exactness for speed, or whose safety depends on how the user
    changes the model later, is not tunable)."""
    metadata = {"doc": doc, "check": check, "finite": finite, "tune": tuple(tune) if tune is not None else None}
    if isinstance(default, (list, dict, set)):
        value = default
        return attrs.field(factory=lambda: type(value)(value), metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


def _non_finite(value: Any) -> float | None:
    """The first NaN or infinite float in ``value`` (a converted option value), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((bad for bad in map(_non_finite, items) if bad is not None), None)


def yaml_float(value: float) -> str:
    """A float as YAML spells it (``.nan``, ``-.inf``, ``1.5``)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def positive(value: Any) -> str | None:
    """Check for options that must be > 0."""
    return None if value is None or value > 0 else f"must be greater than 0, got {value!r}"


def non_negative(value: Any) -> str | None:
    """Check for options that must be >= 0."""
    return None if value is None or value >= 0 else f"must be 0 or more, got {value!r}"


def device_types(values: Any) -> str | None:
    """Check for options listing device types (``cpu``, ``cuda``)."""
    bad = [v for v in values or () if v not in ("cpu", "cuda")]
    return f"unknown device(s) {bad}; use cpu or cuda" if bad else None


@attrs.frozen
class NoOptions:
    """For passes that take no options."""


@attrs.frozen
class OptionInfo:
    """One option as the docs and the CLI show it."""

    name: str
    type: str
    default: Any
    doc: str
    tune: tuple | None = None     # the values pipeline tune tries (None: not tunable)


def option_class_problem(cls: Any) -> str | None:
    """Why ``cls`` cannot be a pass's options class, or None when it can."""
    if not (isinstance(cls, type) and attrs.has(cls)):
        return "is not an attrs class (decorate it with @attrs.frozen)"
    if getattr(cls.__setattr__, "__name__", "") != "_frozen_setattrs":
        return "is not frozen (use @attrs.frozen so options cannot change after loading)"
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:  # noqa: BLE001 - any failure to resolve annotations is the answer
        return f"has annotations that cannot be resolved: {exc}"
    for field in attrs.fields(cls):
        if field.default is _NO_DEFAULT:
            return f"option '{field.name}' has no default"
        if not field.metadata.get("doc"):
            return f"option '{field.name}' has no doc (declare it with pipeline.option(default, doc))"
        problem = _type_problem(hints.get(field.name))
        if problem:
            return f"option '{field.name}' {problem}"
    return None


def _type_problem(tp: Any) -> str | None:
    if tp in (bool, int, float, str):
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return None
    if origin in (Union, types.UnionType):
        for arg in args:
            if arg is not type(None):
                problem = _type_problem(arg)
                if problem:
                    return problem
        return None
    if origin is list and len(args) == 1:
        return _type_problem(args[0])
    if origin is dict and len(args) == 2 and args[0] is str:
        return _type_problem(args[1])
    if isinstance(tp, type) and attrs.has(tp):
        return option_class_problem(tp)
    return f"has unsupported type {tp!r} (use bool, int, float, str, Literal, Optional, list, dict)"


def type_name(tp: Any) -> str:
    """A short readable name for an option type, as shown in docs and errors."""
    if tp in (bool, int, float, str):
        return tp.__name__
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return " | ".join(_literal_text(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[str, {type_name(args[1])}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def _literal_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _describe_value(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            type(None): "null"}.get(type(value))
    if kind is None:
        kind = "list" if isinstance(value, list) else "mapping" if isinstance(value, dict) else type(value).__name__
        return kind
    if value is None:
        return "null"
    return f"{kind} {yaml_float(value) if isinstance(value, float) else clip(repr(value))}"


def structure(cls: type, data: Any, *, source: str | None, key: str | None,
              line: int | None) -> Any:
    """Build an instance of the options class ``cls`` from plain YAML data, checking every key
    and type; errors name ``source``, the line and the dotted key path."""
    return cls(**convert_fields(cls, data, source=source, key=key, line=line))


def convert_fields(cls: type, data: Any, *, source: str | None, key: str | None,
                   line: int | None, lines: Any = None) -> dict:
    """Check and convert only the keys present in ``data`` (for merging onto defaults or a parent).
    ``key`` is the dotted path of ``data`` itself (None at the top level of a document)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PlanError(f"expected a mapping of options, got {_describe_value(data)}",
                        file=source, line=line, key=key)
    lines = data if lines is None else lines
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    values = {}
    for name, raw in data.items():
        name_line = line_of(lines, name) or line
        path = f"{key}.{name}" if key else str(name)
        if name not in fields:
            valid = sorted(fields)
            hint = did_you_mean(str(name), valid) if valid else " (this takes no options)"
            path = f"{key}.{clip(name)}" if key else clip(name)
            raise PlanError(f"unknown option '{clip(name)}'{hint}", file=source, line=name_line, key=path)
        field = fields[name]
        value = _convert(hints[name], raw, source=source, key=path, line=name_line)
        bad = _non_finite(value) if field.metadata.get("finite", True) else None
        if bad is not None:
            raise PlanError(f"expected a finite number, got {yaml_float(bad)} (NaN and infinity mean nothing "
                            f"here{'; null means no value' if _allows_none(hints[name]) else ''})",
                            file=source, line=name_line, key=path)
        check = field.metadata.get("check")
        if check is not None:
            problem = check(value)
            if problem:
                raise PlanError(problem, file=source, line=name_line, key=path)
        values[name] = value
    return values


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _no_nul(text: str, *, source: str | None, key: str, line: int | None) -> str:
    if "\x00" in text:
        raise PlanError(f"a string in a plan cannot hold a NUL character (U+0000), as {clip(repr(text))} "
                        f"does", file=source, line=line, key=key)
    return text


def _convert(tp: Any, raw: Any, *, source: str | None, key: str, line: int | None) -> Any:
    def fail(expected: str) -> PlanError:
        return PlanError(f"expected {expected}, got {_describe_value(raw)}", file=source, line=line, key=key)

    if tp is bool:
        if isinstance(raw, bool):
            return raw
        raise fail("true or false")
    if tp is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        raise fail("an integer")
    if tp is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        raise fail("a number")
    if tp is str:
        if isinstance(raw, str):
            return _no_nul(raw, source=source, key=key, line=line)
        raise fail("a string")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if raw in args and type(raw) in {type(a) for a in args}:
            return raw
        valid = [_literal_text(a) for a in args]
        guess = nearest(raw, valid) if isinstance(raw, str) else None
        hint = f"; did you mean '{guess}'?" if guess is not None else ""
        raise PlanError(f"expected one of {', '.join(valid)}, got {_describe_value(raw)}{hint}",
                        file=source, line=line, key=key)
    if origin in (Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        others = [a for a in args if a is not type(None)]
        errors = []
        for arg in others:
            try:
                return _convert(arg, raw, source=source, key=key, line=line)
            except PlanError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise fail(type_name(tp))
    if origin is list:
        if not isinstance(raw, list):
            raise fail(f"a list of {type_name(args[0])}")
        return [_convert(args[0], item, source=source, key=f"{key}[{i}]",
                         line=line_of(raw, i) or line) for i, item in enumerate(raw)]
    if origin is dict:
        if not isinstance(raw, dict):
            raise fail(f"a mapping of {type_name(args[1])}")
        out = {}
        for k, v in raw.items():
            if not isinstance(k, str):
                raise PlanError(f"keys must be strings, got {_describe_value(k)}", file=source,
                                line=line_of(raw, k) or line, key=key)
            _no_nul(k, source=source, key=key, line=line_of(raw, k) or line)
            out[k] = _convert(args[1], v, source=source, key=f"{key}.{clip(k)}", line=line_of(raw, k) or line)
        return out
    if isinstance(tp, type) and attrs.has(tp):
        return structure(tp, raw, source=source, key=key, line=line)
    raise fail(type_name(tp))


def unstructure(instance: Any) -> dict:
    """Plain data for an options instance, every field present (the fully defaulted form)."""
    out = {}
    for field in attrs.fields(type(instance)):
        out[field.name] = _plain(getattr(instance, field.name))
    return out


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return unstructure(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def describe(cls: type) -> list[OptionInfo]:
    """Every option of ``cls`` with its type, default and doc (for docs and ``pipeline passes``)."""
    hints = typing.get_type_hints(cls)
    infos = []
    for field in attrs.fields(cls):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        tune = field.metadata.get("tune")
        infos.append(OptionInfo(field.name, type_name(hints[field.name]), _plain(default),
                                field.metadata.get("doc", ""), tuple(_plain(v) for v in tune) if tune else None))
    return infos


def tunable(cls: type) -> list[tuple[str, tuple]]:
    """``(option, values)`` for each option of ``cls`` declared with ``tune``, in declaration order."""
    return [(f.name, f.metadata["tune"]) for f in attrs.fields(cls) if f.metadata.get("tune")]
