"""The ``shapes:`` section of a plan: declared shape buckets, warm-up and the stance after it.

A serving plan declares which sizes each input dimension may take at run time. A call's size is
padded up to the smallest bucket that holds it, so a model compiled with static shapes sees only
the declared sizes: one compiled variant per bucket combination, all of them compiled by warm-up,
and no recompile while serving. The runtime side (padding, slicing outputs back, warm-up, the
stance switch) is :mod:`pipeline.serving`; this module is the schema and its validation::

    shapes:
      axes:                                  # named bucket lists, shared by dims that stay equal
        batch: [1, 2, 4, 8, 16]
        seq: {sizes: [1], multiple_of: 64, max: 2048}
      buckets:                               # forward parameter name (or position) -> dim -> axis
        input_ids: {0: batch, 1: seq}
        attention_mask: {0: batch, 1: {axis: seq, pad_value: 0}}
      outputs:                               # output key (or position) -> dim -> axis to slice back
        logits: {0: batch, 1: seq}
      warmup: true
      after_warmup: fail_on_recompile

A dimension may also declare its buckets inline (``input_ids: {1: {multiple_of: 64, max: 2048,
pad_value: 0}}`` or ``{0: [1, 2, 4]}``); that declares an axis named ``input_ids.1`` which other
dimensions and outputs can name. ``resolve`` prints every axis under ``axes``.
"""
from __future__ import annotations

import math
from typing import Any, Literal

import attrs

from pipeline import compat
from pipeline.errors import PlanError, did_you_mean
from pipeline.options import convert_fields, option
from pipeline.plan.yamlio import clip, line_of

SHAPES_KEYS = ("axes", "buckets", "outputs", "warmup", "after_warmup", "unknown_inputs")
AXIS_KEYS = ("sizes", "multiple_of", "max")
MAX_BUCKETS_PER_AXIS = 4096
Stance = Literal["default", "eager_on_recompile", "fail_on_recompile"]


@attrs.frozen
class Axis:
    """The sizes one bucketed dimension may be padded to: the explicit ``sizes`` plus every
    multiple of ``multiple_of`` up to ``max``."""

    sizes: tuple[int, ...] = ()
    multiple_of: int | None = None
    max: int | None = None

    def buckets(self) -> tuple[int, ...]:
        """Every size of the axis, ascending."""
        found = set(self.sizes)
        if self.multiple_of is not None and self.max is not None:
            found.update(range(self.multiple_of, self.max + 1, self.multiple_of))
        return tuple(sorted(found))

    def bucket_for(self, size: int) -> int | None:
        """The smallest bucket holding ``size``, or None when ``size`` exceeds the largest."""
        return next((b for b in self.buckets() if b >= size), None)

    def to_data(self) -> dict:
        """Plain data, as ``resolve`` prints it."""
        data: dict = {"sizes": list(self.sizes)} if self.sizes else {}
        if self.multiple_of is not None:
            data.update(multiple_of=self.multiple_of, max=self.max)
        return data


@attrs.frozen
class BucketedDim:
    """One input dimension padded to the buckets of ``axis``, filling new elements with ``pad_value``."""

    axis: str
    pad_value: int | float | bool = 0


@attrs.frozen
class ShapeSettings:
    """Declared shape buckets: padded at call time, compiled ahead of serving by warm-up."""

    axes: dict = option({}, "Named axes: a list of sizes, or {sizes, multiple_of, max}.")
    buckets: dict = option({}, "Input (forward parameter name or position) -> dimension -> axis name, "
                               "inline axis, or {axis, pad_value}; pad_value defaults to 0.")
    outputs: dict = option({}, "Output (key of a dict-like output, or position; 0 for a single tensor) -> "
                               "dimension -> axis it is sliced back along to the call's size.")
    warmup: bool = option(False, "Compile every combination of the buckets before the first call is served.")
    after_warmup: Stance = option(
        "default", "Stance for the calls after warm-up: fail_on_recompile raises naming the failed guard; "
                   "eager_on_recompile runs new shapes eagerly; default recompiles.")
    unknown_inputs: Literal["error", "ignore"] = option(
        "error", "What buckets for an input the model does not take do: error, or ignore them (a plan "
                 "written for several models).")

    def used_axes(self) -> list[str]:
        """The axes some input dimension is padded along, in declaration order."""
        used = {dim.axis for dims in self.buckets.values() for dim in dims.values()}
        return [name for name in self.axes if name in used]

    def combinations(self) -> int:
        """How many bucket combinations warm-up compiles (the product over the used axes)."""
        count = 1
        for name in self.used_axes():
            count *= len(self.axes[name].buckets())
        return count

    def to_data(self) -> dict:
        """Plain data, fully defaulted (what ``resolve`` prints)."""
        return {
            "axes": {name: axis.to_data() for name, axis in self.axes.items()},
            "buckets": {key: {dim: {"axis": d.axis, "pad_value": d.pad_value} for dim, d in dims.items()}
                        for key, dims in self.buckets.items()},
            "outputs": {key: dict(dims) for key, dims in self.outputs.items()},
            "warmup": self.warmup,
            "after_warmup": self.after_warmup,
            "unknown_inputs": self.unknown_inputs,
        }


@attrs.frozen
class _Scalars:
    warmup: bool = option(False, "")
    after_warmup: Stance = option("default", "")
    unknown_inputs: Literal["error", "ignore"] = option("error", "")


def merge_shapes(base: ShapeSettings, raw: Any, *, source: str, line: int | None) -> ShapeSettings:
    """Apply the ``shapes`` section ``raw`` of one plan layer over ``base`` (the parent's, or the
    defaults) and validate the result. Scalars replace; ``axes``, ``buckets`` and ``outputs`` merge
    by name, where an entry set to null removes the parent's; ``shapes: null`` clears everything."""
    if raw is None:
        return ShapeSettings()
    if not isinstance(raw, dict):
        raise PlanError("expected a mapping (axes, buckets, outputs, warmup, after_warmup, unknown_inputs)",
                        file=source, line=line, key="shapes")
    for key in raw:
        if key not in SHAPES_KEYS:
            raise PlanError(f"unknown key '{clip(key)}'{did_you_mean(str(key), SHAPES_KEYS)}", file=source,
                            line=line_of(raw, key) or line, key=f"shapes.{clip(key)}")
    scalars = {k: raw[k] for k in ("warmup", "after_warmup", "unknown_inputs") if k in raw}
    values = convert_fields(_Scalars, scalars, source=source, key="shapes", line=line, lines=raw)
    where = _Where(source, raw, line)
    axes = dict(base.axes)
    buckets = dict(base.buckets)
    outputs = dict(base.outputs)
    for name, entry in _mapping(raw, "axes", where).items():
        key = f"shapes.axes.{name}"
        if not isinstance(name, str) or not name:
            raise where.error("an axis name is a non-empty string", key, raw.get("axes"), name)
        if entry is None:
            axes.pop(name, None)
        else:
            axes[name] = _parse_axis(entry, where.at(raw["axes"], name), key)
    for input_key, dims in _mapping(raw, "buckets", where).items():
        key = f"shapes.buckets.{input_key}"
        _check_input_key(input_key, where.at(raw["buckets"], input_key), key)
        if dims is None:
            buckets.pop(input_key, None)
            continue
        buckets[input_key] = _parse_input(input_key, dims, where.at(raw["buckets"], input_key), key, axes)
    for output_key, dims in _mapping(raw, "outputs", where).items():
        key = f"shapes.outputs.{output_key}"
        if isinstance(output_key, bool) or not isinstance(output_key, (str, int)):
            raise where.error("an output key is a string (a key of a dict-like output) or a position",
                              key, raw["outputs"], output_key)
        if dims is None:
            outputs.pop(output_key, None)
            continue
        outputs[output_key] = _parse_output(dims, where.at(raw["outputs"], output_key), key)
    settings = ShapeSettings(axes=axes, buckets=buckets, outputs=outputs,
                             **{k: values.get(k, getattr(base, k)) for k in ("warmup", "after_warmup",
                                                                              "unknown_inputs")})
    _check_references(settings, where)
    _check_warmup_size(settings, where)
    return settings


def _check_warmup_size(settings: ShapeSettings, where: _Where) -> None:
    ceiling = compat.max_variants_per_function()
    if settings.warmup and settings.combinations() > ceiling:
        raw = where.container if isinstance(where.container, dict) else {}
        raise PlanError(f"warm-up would compile {settings.combinations()} bucket combinations, more than the "
                        f"{ceiling} variants Dynamo keeps per function; declare fewer buckets (share axes "
                        f"between dimensions that stay equal)", file=where.source,
                        line=line_of(raw, "warmup") or where.line, key="shapes.warmup")


class _Where:
    """The file and the located container an error points into."""

    def __init__(self, source: str, container: Any, line: int | None):
        self.source = source
        self.container = container
        self.line = line

    def at(self, container: Any, key: Any) -> "_Where":
        return _Where(self.source, container.get(key) if isinstance(container, dict) else None,
                      line_of(container, key) or self.line)

    def error(self, message: str, key: str, container: Any = None, item: Any = None) -> PlanError:
        line = (line_of(container, item) if container is not None else None) or self.line
        return PlanError(message, file=self.source, line=line, key=key)


def _mapping(raw: dict, name: str, where: _Where) -> dict:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping, got {type(value).__name__}", f"shapes.{name}", raw, name)
    return value


def _size_list(value: Any, where: _Where, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise where.error("expected a non-empty list of sizes", key)
    for index, size in enumerate(value):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise where.error(f"a bucket size is an integer of 1 or more, got {clip(repr(size))}",
                              f"{key}[{index}]", value, index)
    if len(value) > MAX_BUCKETS_PER_AXIS:
        raise where.error(f"more than {MAX_BUCKETS_PER_AXIS} sizes; declare fewer buckets", key)
    return tuple(sorted(set(value)))


def _parse_axis(entry: Any, where: _Where, key: str) -> Axis:
    if isinstance(entry, list):
        return Axis(sizes=_size_list(entry, where, key))
    if not isinstance(entry, dict):
        raise where.error("an axis is a list of sizes or a mapping with sizes and/or multiple_of and max", key)
    for name in entry:
        if name not in AXIS_KEYS:
            raise where.error(f"unknown key '{clip(name)}'{did_you_mean(str(name), AXIS_KEYS)}",
                              f"{key}.{clip(name)}", entry, name)
    sizes = _size_list(entry["sizes"], where.at(entry, "sizes"), f"{key}.sizes") if "sizes" in entry else ()
    multiple, largest = entry.get("multiple_of"), entry.get("max")
    if (multiple is None) != (largest is None):
        missing = "max" if largest is None else "multiple_of"
        raise where.error(f"multiple_of and max go together; add '{missing}'", key)
    if multiple is not None:
        for name, value in (("multiple_of", multiple), ("max", largest)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise where.error(f"expected an integer of 1 or more, got {clip(repr(value))}", f"{key}.{name}",
                                  entry, name)
        if largest % multiple:
            raise where.error(f"max ({largest}) must be a multiple of multiple_of ({multiple})", f"{key}.max",
                              entry, "max")
        if largest // multiple > MAX_BUCKETS_PER_AXIS:
            raise where.error(f"{largest // multiple} buckets; declare at most {MAX_BUCKETS_PER_AXIS}", key)
    if not sizes and multiple is None:
        raise where.error("an axis needs sizes, or multiple_of and max", key)
    return Axis(sizes=sizes, multiple_of=multiple, max=largest)


def _check_input_key(input_key: Any, where: _Where, key: str) -> None:
    if isinstance(input_key, bool) or not isinstance(input_key, (str, int)):
        raise where.error("an input is named by its forward parameter name or its position", key)
    if isinstance(input_key, int) and input_key < 0:
        raise where.error("an input position is 0 or more", key)
    if isinstance(input_key, str) and not input_key.isidentifier():
        raise where.error(f"'{clip(input_key)}' is not a parameter name; name an input by its forward parameter "
                          f"name or give its position as an integer", key)


def _dim(dim: Any, where: _Where, key: str, container: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise where.error(f"a dimension is an integer of 0 or more, got {clip(repr(dim))}", key, container, dim)
    return dim


def _parse_input(input_key: Any, dims: Any, where: _Where, key: str, axes: dict) -> dict:
    if not isinstance(dims, dict) or not dims:
        raise where.error("expected a mapping of dimension to its buckets, e.g. {0: batch, 1: {multiple_of: "
                          "64, max: 2048, pad_value: 0}}", key)
    out = {}
    for dim, spec in dims.items():
        dim_key = f"{key}.{dim}"
        _dim(dim, where, dim_key, dims)
        here = where.at(dims, dim)
        pad_value: Any = 0
        if isinstance(spec, dict) and "pad_value" in spec:
            pad_value = spec["pad_value"]
            if not isinstance(pad_value, (int, float, bool)):
                raise here.error(f"pad_value is a number or true/false, got {type(pad_value).__name__}",
                                 f"{dim_key}.pad_value", spec, "pad_value")
            if isinstance(pad_value, float) and math.isnan(pad_value):
                # -inf and inf are fill values (additive masks); NaN would poison every reduction
                # over the padded elements and make the plan unequal to itself.
                raise here.error("pad_value cannot be NaN (.nan); padding is read by reductions over the "
                                 "dimension", f"{dim_key}.pad_value", spec, "pad_value")
            spec = {k: v for k, v in spec.items() if k != "pad_value"}
        if isinstance(spec, dict) and "axis" in spec:
            extra = [k for k in spec if k != "axis"]
            if extra:
                raise here.error(f"'{clip(extra[0])}' cannot go with 'axis': the sizes are the named axis's",
                                 f"{dim_key}.{clip(extra[0])}")
            spec = spec["axis"]
        if isinstance(spec, str):
            name = spec
        elif spec is None:
            raise here.error("expected an axis name, a list of sizes or a mapping", dim_key)
        else:
            name = f"{input_key}.{dim}"
            axes[name] = _parse_axis(spec, here, dim_key)
        out[dim] = BucketedDim(axis=name, pad_value=pad_value)
    return out


def _parse_output(dims: Any, where: _Where, key: str) -> dict:
    if not isinstance(dims, dict) or not dims:
        raise where.error("expected a mapping of dimension to the axis it is sliced back along", key)
    out = {}
    for dim, axis in dims.items():
        _dim(dim, where, f"{key}.{dim}", dims)
        if not isinstance(axis, str):
            raise where.error(f"expected an axis name, got {clip(repr(axis))}", f"{key}.{dim}", dims, dim)
        out[dim] = axis
    return out


def _check_references(settings: ShapeSettings, where: _Where) -> None:
    raw = where.container if isinstance(where.container, dict) else {}
    used = set(settings.used_axes())
    for section, entries in (("buckets", settings.buckets), ("outputs", settings.outputs)):
        for entry_key, dims in entries.items():
            for dim, value in dims.items():
                name = value.axis if isinstance(value, BucketedDim) else value
                known = name in (settings.axes if section == "buckets" else used)
                if known:
                    continue
                section_raw = raw.get(section) if isinstance(raw.get(section), dict) else {}
                line = line_of(section_raw, entry_key) or line_of(raw, section) or where.line
                choices = settings.axes if section == "buckets" else sorted(used)
                what = "no axis" if section == "buckets" else "no input padded along the axis"
                raise PlanError(f"{what} '{clip(name)}'{did_you_mean(name, choices)}", file=where.source,
                                line=line, key=f"shapes.{section}.{entry_key}.{dim}")


__all__ = ["Axis", "BucketedDim", "ShapeSettings", "merge_shapes", "SHAPES_KEYS"]
