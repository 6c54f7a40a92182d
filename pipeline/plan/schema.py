"""Plans: the YAML documents that name the passes to run, their order and options, and the
policies around them. Loading validates everything before anything compiles.

Top-level keys of a plan file::

    name, description, extends, target, passes, insert, remove, options, verify, on_error, cache,
    expect, shapes

``extends`` names a parent plan (built-in name or path relative to this file); the child then
overrides, in this order: scalar keys replace, ``passes`` replaces the whole list, ``insert`` puts
passes next to named ones, ``remove`` drops passes by name, ``options`` merges options into the
passes by name; ``cache`` and ``expect`` merge key by key, ``shapes`` merges as
:func:`pipeline.plan.shapes.merge_shapes` says. Overrides given to :func:`load_plan` are one more such
layer. ``insert`` is how a plan adds a pass to its parent's list without restating it::

    extends: default
    insert:
      - after: decompose                 # or before: NAME; the pass of the plan it goes next to
        pass: fusable-reductions
        options: {rules: [max-values]}   # optional, as in a passes entry; so is on: [roles]
      - before: dce
        occurrence: 2                    # which 'dce' (1-based); needed when the plan repeats it
        pass: cse

Entries apply in order, so one may name a pass an earlier one inserted. Restating ``passes``
instead starts every restated pass from its defaults; a :class:`PlanWarning` names each option the
parent set that the restated entry drops.

Sizes are bounded (:mod:`pipeline.plan.yamlio`): a plan file or plan data given directly is at most
256 KiB and 5000 values, a key or pass name at most 256 characters, and errors quote user text cut
to 80 characters.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import attrs

from pipeline.errors import PlanError, did_you_mean
from pipeline.metrics import ExpectationFields, default_limits, limit_fields
from pipeline.options import convert_fields, option, unstructure
from pipeline.registry import Registry, get_registry
from pipeline.plan.layers import merge_options, remove_passes
from pipeline.plan.order import ROLES, ROLES_KEY, check_order, role_pipeline  # noqa: F401  (role_pipeline re-exported)
from pipeline.plan.shapes import ShapeSettings, merge_shapes
from pipeline.plan.yamlio import LocatedDict, check_data, clip, line_of, load_document, read_plan_file, too_long_key

MAX_EXTENDS_DEPTH = 32
# The kinds of graph a pass can run on: an inference graph, a training graph before it is split
# (joint forward+backward), and the forward and backward halves after the split.
TOP_LEVEL_KEYS = ("name", "description", "extends", "target", "passes", "insert", "remove", "options",
                  "verify", "on_error", "cache", "expect", "shapes")
# The keys that change an inherited pass list, so they need 'extends' (or are overrides).
LAYER_KEYS = ("insert", "remove", "options")
INSERT_KEYS = ("before", "after", "occurrence", "pass", "options", ROLES_KEY)


class PlanWarning(UserWarning):
    """A plan that loads but likely does not do what its author meant. Like :class:`PlanError` it
    names the file, line and key (``file:line: PlanWarning: key: reason`` when Python prints it)."""

    def __init__(self, message: str, *, file: str, line: int | None, key: str | None):
        self.file, self.line, self.key, self.reason = file, line, key, message
        super().__init__(f"{key}: {message}" if key else message)


# Each warning is shown once per process (Python's "default" action), however often the plan loads.
_WARNED: dict = {}


def _warn(warning: PlanWarning) -> None:
    warnings.warn_explicit(warning, PlanWarning, filename=warning.file, lineno=warning.line or 0,
                           module="pipeline.plan", registry=_WARNED)


@attrs.frozen
class CacheSettings:
    """Where compiled artefacts are kept: generated kernels (C++ libraries, Triton modules, autotuning
    choices) and whole compiled graphs, keyed on the graph, its inputs, the resolved plan, pass
    versions and sources, torch/triton versions and the device (docs/caching.md)."""

    enabled: bool = option(True, "Keep compiled kernels and compiled graphs on disk and reuse them across "
                                 "processes (false: build kernels in a private temporary folder and "
                                 "cache no graph).")
    dir: str | None = option(None, "Cache directory; null means $PIPELINE_CACHE_DIR or a per-user default.")


@attrs.frozen
class Expectations(ExpectationFields):
    """The plan's ``expect:`` section: the engine's keys (:class:`ExpectationFields`) and, in
    ``limits``, the keys of the registered metrics (``max_kernels``, ``cudagraphs``, ...), each
    readable as an attribute too."""

    limits: dict = attrs.field(factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        limits = object.__getattribute__(self, "limits")
        if name in limits:
            return limits[name]
        raise AttributeError(f"expect has no key '{name}' (registered: {sorted(limits)})")

    def to_data(self) -> dict:
        """The section as YAML spells it: engine keys and metric keys side by side."""
        own = {f.name: getattr(self, f.name) for f in attrs.fields(ExpectationFields)}
        return {**own, **self.limits}


@attrs.frozen
class PassSpec:
    """One entry of a plan's pass list: a registered pass name, its parsed options and the graph
    roles it runs on (``on:`` in YAML; None: every role its place in the plan allows)."""

    name: str
    options: Any
    line: int | None = attrs.field(default=None, eq=False)
    roles: tuple[str, ...] | None = None
    # Where the entry was written: its file (or <dict>, <overrides>), its key path (passes[2],
    # insert[0]) and the option names it spelled out (the others are defaults).
    source: str | None = attrs.field(default=None, eq=False, repr=False)
    key: str | None = attrs.field(default=None, eq=False, repr=False)
    given: frozenset = attrs.field(default=frozenset(), eq=False, repr=False)

    def runs_on(self, role: str) -> bool:
        """Whether this pass runs on graphs of ``role`` (one of :data:`ROLES`)."""
        return self.roles is None or role in self.roles


@attrs.frozen
class Plan:
    """A validated, fully defaulted plan. Two plans are equal when they would compile the same
    way (where they were loaded from does not matter)."""

    name: str
    passes: tuple[PassSpec, ...]
    description: str = ""
    target: Literal["auto", "cuda", "cpu"] = "auto"
    verify: Literal["off", "final", "each"] = "off"
    on_error: Literal["raise", "eager"] = "raise"
    cache: CacheSettings = CacheSettings()
    expect: Expectations = Expectations()
    shapes: ShapeSettings = ShapeSettings()
    source: str | None = attrs.field(default=None, eq=False)
    lineage: tuple[str, ...] = attrs.field(default=(), eq=False)

    def pass_names(self) -> list[str]:
        """The names of the plan's passes in order, capture first."""
        return [p.name for p in self.passes]

    def to_data(self) -> dict:
        """Plain data of the fully defaulted plan (what ``resolve`` prints)."""
        passes = []
        for spec in self.passes:
            opts = unstructure(spec.options)
            if spec.roles is not None:
                passes.append({spec.name: opts, ROLES_KEY: list(spec.roles)})
            else:
                passes.append({spec.name: opts} if opts else spec.name)
        return {
            "name": self.name,
            "description": self.description,
            "target": self.target,
            "passes": passes,
            "verify": self.verify,
            "on_error": self.on_error,
            "cache": unstructure(self.cache),
            "expect": self.expect.to_data(),
            "shapes": self.shapes.to_data(),
        }


_SCALAR_FIELDS = {
    "name": str,
    "description": str,
    "target": Literal["auto", "cuda", "cpu"],
    "verify": Literal["off", "final", "each"],
    "on_error": Literal["raise", "eager"],
}


def load_plan(plan: Any, overrides: dict | None = None, *, registry: Registry | None = None) -> Plan:
    """Load and validate a plan given as a :class:`Plan`, a built-in or plugin plan name, a path to
    a YAML file, or a dict; then apply ``overrides`` (a dict in the same format, e.g.
    ``{"verify": "each", "options": {"capture": {"fullgraph": True}}}``)."""
    registry = registry or get_registry()
    if isinstance(plan, Plan):
        base = plan
    elif isinstance(plan, dict):
        check_data(plan, "<dict>")
        base = _from_data(plan, source="<dict>", registry=registry, chain=())
    elif isinstance(plan, (str, Path)):
        base = _from_file_or_name(plan, registry=registry, chain=(), relative_to=None)
    else:
        raise PlanError(f"a plan is a Plan, a plan name, a path or a dict, not {type(plan).__name__}")
    if overrides:
        check_data(overrides, "<overrides>")
        base = _apply_layer(base, overrides, source="<overrides>", registry=registry, chain=())
    return base


def _from_file_or_name(ref: str | Path, *, registry: Registry, chain: tuple[str, ...],
                       relative_to: Path | None) -> Plan:
    # Errors raised here carry no file: the caller names the file and line of the 'extends'.
    text_ref = str(ref)
    path = Path(text_ref)
    if relative_to is not None and not path.is_absolute():
        candidate = relative_to / path
        if _probe(candidate, Path.exists, text_ref):
            path = candidate
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in text_ref or _probe(path, Path.exists, text_ref)
    if not looks_like_path:
        entry = registry.plans.get(text_ref)
        if entry is None:
            raise PlanError(f"no plan named '{clip(text_ref)}'{did_you_mean(text_ref, registry.plans)} "
                            f"(or give a path to a .yaml file){registry.autoload_hint()}")
        path = entry.path
    if not _probe(path, Path.is_file, text_ref):
        raise PlanError(f"plan file not found: {clip(text_ref)}")
    key = str(path.resolve())
    if key in chain:
        cycle = " -> ".join(list(chain) + [key])
        raise PlanError(f"'extends' forms a cycle: {cycle}")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise PlanError(f"'extends' chains more than {MAX_EXTENDS_DEPTH} plans; a plan hierarchy never "
                        f"needs that many levels")
    raw, line = load_document(read_plan_file(path), str(path))
    return _from_data(raw, source=str(path), registry=registry, chain=chain + (key,),
                      base_dir=path.parent, line=line)


def _probe(path: Path, test: Any, text_ref: str) -> bool:
    """``path.exists()`` / ``path.is_file()`` where a name the OS refuses (too long, NUL bytes) is a
    PlanError instead of an OSError."""
    try:
        return test(path)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PlanError(f"cannot use '{clip(text_ref)}' as a plan path: {why}") from None


def _from_data(raw: Any, *, source: str, registry: Registry, chain: tuple[str, ...],
               base_dir: Path | None = None, line: int | None = None) -> Plan:
    """``line``: where the document starts in ``source`` (for errors about the whole document)."""
    if raw is None:
        raise PlanError("the plan is empty: it needs at least 'name' and 'passes' (or 'extends')",
                        file=source)
    if not isinstance(raw, dict):
        raise PlanError(f"a plan is a mapping of keys ({', '.join(TOP_LEVEL_KEYS)}), "
                        f"got {'a list' if isinstance(raw, list) else type(raw).__name__}",
                        file=source, line=getattr(raw, "line", None) or line)
    _check_top_keys(raw, source)
    parent_ref = raw.get("extends")
    if parent_ref is not None:
        if not isinstance(parent_ref, str):
            raise PlanError("expected a plan name or path", file=source,
                            line=line_of(raw, "extends"), key="extends")
        try:
            parent = _from_file_or_name(parent_ref, registry=registry, chain=chain, relative_to=base_dir)
        except PlanError as exc:
            if exc.file is not None and exc.file != "<plan>":
                raise
            raise PlanError(exc.reason, file=source, line=line_of(raw, "extends"), key="extends") from None
        layer = {k: v for k, v in raw.items() if k != "extends"}
        if isinstance(raw, LocatedDict):
            layer = _relocate(raw, layer)
        plan = _apply_layer(parent, layer, source=source, registry=registry, chain=chain)
        return attrs.evolve(plan, source=source, lineage=(parent.source or parent.name,) + parent.lineage)
    for required in ("name", "passes"):
        if required not in raw:
            raise PlanError(f"missing required key '{required}' (or use 'extends' to start from "
                            f"another plan)", file=source, line=getattr(raw, "line", None), key=required)
    for key in LAYER_KEYS:
        if key in raw:
            raise PlanError(f"'{key}' changes a parent plan, so it needs 'extends'", file=source,
                            line=line_of(raw, key), key=key)
    fields = _convert_scalars(raw, source)
    passes = _parse_passes(raw["passes"], source=source, registry=registry, line=line_of(raw, "passes"))
    cache = _convert_section(CacheSettings, raw, "cache", source)
    expect = _convert_expect(Expectations(limits=default_limits(registry.metrics)), raw, source, registry)
    shapes = merge_shapes(ShapeSettings(), raw["shapes"], source=source, line=line_of(raw, "shapes")) \
        if "shapes" in raw else ShapeSettings()
    plan = Plan(passes=passes, cache=CacheSettings(**cache), expect=expect, shapes=shapes,
                source=source, **fields)
    _check_order(plan, registry, source, raw)
    return plan


def _relocate(raw: LocatedDict, subset: dict) -> LocatedDict:
    out = LocatedDict(subset)
    out.line = raw.line
    out.key_lines = {k: raw.key_lines[k] for k in subset if k in raw.key_lines}
    return out


def _check_top_keys(raw: dict, source: str) -> None:
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            raise PlanError(f"unknown key '{clip(key)}'{did_you_mean(str(key), TOP_LEVEL_KEYS)}",
                            file=source, line=line_of(raw, key), key=clip(key))


def _convert_scalars(raw: dict, source: str) -> dict:
    present = {k: raw[k] for k in _SCALAR_FIELDS if k in raw}
    holder = _ScalarHolder
    values = convert_fields(holder, present, source=source, key=None, line=getattr(raw, "line", None),
                            lines=raw)
    if "name" in values and not values["name"].strip():
        raise PlanError("a plan name cannot be empty", file=source, line=line_of(raw, "name"), key="name")
    return values


@attrs.frozen
class _ScalarHolder:
    name: str = option("", "Plan name.")
    description: str = option("", "What the plan is for.")
    target: Literal["auto", "cuda", "cpu"] = option("auto", "Device the plan compiles for.")
    verify: Literal["off", "final", "each"] = option("off", "Check semantics after the last pass or each pass.")
    on_error: Literal["raise", "eager"] = option("raise", "What a failing compile does.")


def _convert_section(cls: type, raw: dict, key: str, source: str) -> dict:
    if key not in raw:
        return {}
    return convert_fields(cls, raw[key], source=source, key=key, line=line_of(raw, key))


def _convert_expect(base: Expectations, raw: dict, source: str, registry: Registry) -> Expectations:
    """``base`` with the ``expect:`` keys of ``raw`` applied: the engine's keys and those of the
    registered metrics, each checked against its declaration (unknown keys are an error naming
    the valid ones)."""
    if "expect" not in raw or raw["expect"] is None:     # ``expect:`` left empty: nothing expected
        return base
    data, line = raw["expect"], line_of(raw, "expect")
    metric_keys = limit_fields(registry.metrics)
    if not isinstance(data, dict):
        convert_fields(ExpectationFields, data, source=source, key="expect", line=line)   # raises
    own = {k: v for k, v in data.items() if k not in metric_keys}
    fields = {**attrs.fields_dict(ExpectationFields), **{k: f for k, (_, f) in metric_keys.items()}}
    for name in own:
        if name not in attrs.fields_dict(ExpectationFields):
            raise PlanError(f"unknown option '{clip(name)}'{did_you_mean(str(name), sorted(fields))}", file=source,
                            line=line_of(data, name) or line, key=f"expect.{clip(name)}")
    values = convert_fields(ExpectationFields, own, source=source, key="expect", line=line, lines=data)
    limits = dict(base.limits)
    for name, raw_value in data.items():
        if name in metric_keys:
            metric = metric_keys[name][0]
            limits.update(convert_fields(metric.limits, {name: raw_value}, source=source, key="expect",
                                         line=line, lines=data))
    return attrs.evolve(base, limits=limits, **values)


def _parse_passes(raw: Any, *, source: str, registry: Registry, line: int | None) -> tuple[PassSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise PlanError("expected a non-empty list of passes (the first one is the capture pass)",
                        file=source, line=line, key="passes")
    specs = []
    for index, item in enumerate(raw):
        item_line = line_of(raw, index) or line
        specs.append(_parse_pass_entry(item, index=index, source=source, registry=registry, line=item_line))
    return tuple(specs)


def _parse_pass_entry(item: Any, *, index: int, source: str, registry: Registry,
                      line: int | None) -> PassSpec:
    key = f"passes[{index}]"
    roles = None
    if isinstance(item, dict) and ROLES_KEY in item and len(item) == 2:
        roles = _parse_roles(item[ROLES_KEY], source=source, line=line_of(item, ROLES_KEY) or line,
                             key=f"{key}.{ROLES_KEY}")
        rest = LocatedDict({k: v for k, v in item.items() if k != ROLES_KEY})
        rest.line = getattr(item, "line", None)
        rest.key_lines = {k: v for k, v in getattr(item, "key_lines", {}).items() if k != ROLES_KEY}
        item = rest
    if isinstance(item, str):
        name, raw_options, opt_line = item, None, line
    elif isinstance(item, dict) and len(item) == 1:
        name, raw_options = next(iter(item.items()))
        opt_line = line_of(item, name) or line
        if not isinstance(name, str):
            raise PlanError("a pass name must be a string", file=source, line=line, key=key)
    elif isinstance(item, dict):
        shown = clip(", ".join(map(str, item)))
        raise PlanError(f"a pass entry is one name mapped to its options (plus, optionally, "
                        f"'{ROLES_KEY}: [roles]'), got {len(item)} keys ({shown}); "
                        f"write each pass as its own list item", file=source, line=line, key=key)
    else:
        raise PlanError(f"a pass entry is a name or 'name: {{options}}', got {type(item).__name__}",
                        file=source, line=line, key=key)
    options_key = f"{key}.{name}" if isinstance(item, dict) else key
    return _make_spec(name, raw_options, roles, source=source, registry=registry, line=line, key=key,
                      name_key=options_key, options_key=f"{key}.{name}", options_line=opt_line,
                      roles_key=f"{key}.{ROLES_KEY}")


def _make_spec(name: str, raw_options: Any, roles: tuple[str, ...] | None, *, source: str,
               registry: Registry, line: int | None, key: str, name_key: str, options_key: str,
               options_line: int | None, roles_key: str, name_line: int | None = None) -> PassSpec:
    """A checked :class:`PassSpec` for the pass ``name`` of the entry ``key`` at ``line``; the other
    ``*_key`` and ``*_line`` say where errors about its parts point."""
    name_line = name_line or line
    too_long = too_long_key(name, "a pass name")
    if too_long:
        raise PlanError(too_long, file=source, line=name_line, key=key)
    entry = registry.pass_entry(name)
    if entry is None:
        raise PlanError(f"unknown pass '{clip(name)}'{registry.unknown_pass_hint(name)}", file=source,
                        line=name_line, key=name_key)
    values = convert_fields(entry.cls.Options, raw_options, source=source, key=options_key, line=options_line)
    if roles is not None and entry.cls.stage != "graph":
        raise PlanError(f"'{ROLES_KEY}' restricts a graph pass to some graph roles; '{name}' is a "
                        f"{entry.cls.stage} pass and runs where its stage says", file=source, line=line,
                        key=roles_key)
    return PassSpec(name=name, options=entry.cls.Options(**values), line=line, roles=roles, source=source,
                    key=key, given=frozenset(values))


def _parse_roles(raw: Any, *, source: str, line: int | None, key: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"expected a non-empty list of graph roles ({', '.join(ROLES)})", file=source,
                        line=line, key=key)
    for i, role in enumerate(raw):
        if role not in ROLES:
            raise PlanError(f"unknown graph role {clip(repr(role))}{did_you_mean(str(role), ROLES)} (roles: "
                            f"{', '.join(ROLES)})", file=source, line=line_of(raw, i) or line,
                            key=f"{key}[{i}]")
    if len(set(raw)) != len(raw):
        raise PlanError("a graph role is listed twice", file=source, line=line, key=key)
    return tuple(r for r in ROLES if r in raw)


def _apply_layer(base: Plan, layer: Any, *, source: str, registry: Registry,
                 chain: tuple[str, ...]) -> Plan:
    if not isinstance(layer, dict):
        raise PlanError(f"overrides must be a mapping, got {type(layer).__name__}", file=source)
    _check_top_keys(layer, source)
    if "extends" in layer:
        raise PlanError("'extends' is not allowed in overrides", file=source, key="extends")
    fields = _convert_scalars(layer, source)
    passes = base.passes
    dropped: list[PlanWarning] = []
    if "passes" in layer:
        passes = _parse_passes(layer["passes"], source=source, registry=registry,
                               line=line_of(layer, "passes"))
        dropped = _dropped_options(base, passes, layer.get("options"), source)
    if "insert" in layer:
        passes = _insert_passes(passes, layer["insert"], source, registry, line_of(layer, "insert"))
    if "remove" in layer:
        passes = remove_passes(passes, layer["remove"], source, line_of(layer, "remove"))
        if not passes:
            raise PlanError("'remove' leaves the plan without passes; it needs at least its capture pass",
                            file=source, line=line_of(layer, "remove"), key="remove")
    if "options" in layer:
        passes = merge_options(passes, layer["options"], source, registry, line_of(layer, "options"))
    cache = attrs.evolve(base.cache, **_convert_section(CacheSettings, layer, "cache", source))
    expect = _convert_expect(base.expect, layer, source, registry)
    shapes = merge_shapes(base.shapes, layer["shapes"], source=source, line=line_of(layer, "shapes")) \
        if "shapes" in layer else base.shapes
    plan = attrs.evolve(base, passes=passes, cache=cache, expect=expect, shapes=shapes, **fields)
    _check_order(plan, registry, source, layer)
    for warning in dropped:
        _warn(warning)
    return plan


def _insert_passes(passes: tuple[PassSpec, ...], raw: Any, source: str, registry: Registry,
                   line: int | None) -> tuple[PassSpec, ...]:
    """Apply ``insert:`` entries in order, each next to its anchor in the list the previous left."""
    if not isinstance(raw, list):
        raise PlanError("expected a list of entries such as {after: cse, pass: my-pass}", file=source,
                        line=line, key="insert")
    out = list(passes)
    for index, entry in enumerate(raw):
        key = f"insert[{index}]"
        entry_line = line_of(raw, index) or line
        if not isinstance(entry, dict):
            raise PlanError(f"an insert entry is a mapping such as {{after: cse, pass: my-pass}}, got "
                            f"{type(entry).__name__}", file=source, line=entry_line, key=key)
        for part in entry:
            if part not in INSERT_KEYS:
                raise PlanError(f"unknown key '{clip(part)}'{did_you_mean(str(part), INSERT_KEYS)}",
                                file=source, line=line_of(entry, part) or entry_line, key=f"{key}.{clip(part)}")
        sides = [side for side in ("before", "after") if side in entry]
        if len(sides) != 1:
            raise PlanError("an insert entry names exactly one of 'before' or 'after': the pass of the plan "
                            "it goes next to", file=source, line=entry_line, key=key)
        if "pass" not in entry:
            raise PlanError("missing 'pass': the name of the pass to insert", file=source, line=entry_line,
                            key=key)
        side = sides[0]
        at = _anchor(out, entry, side, source=source, line=entry_line, key=key)
        name = entry["pass"]
        if not isinstance(name, str):
            raise PlanError(f"expected a pass name, got {type(name).__name__}", file=source,
                            line=line_of(entry, "pass") or entry_line, key=f"{key}.pass")
        roles = None
        if ROLES_KEY in entry:
            roles = _parse_roles(entry[ROLES_KEY], source=source, key=f"{key}.{ROLES_KEY}",
                                 line=line_of(entry, ROLES_KEY) or entry_line)
        spec = _make_spec(name, entry.get("options"), roles, source=source, registry=registry,
                          line=entry_line, key=key, name_key=f"{key}.pass", name_line=line_of(entry, "pass"),
                          options_key=f"{key}.options", options_line=line_of(entry, "options") or entry_line,
                          roles_key=f"{key}.{ROLES_KEY}")
        out.insert(at if side == "before" else at + 1, spec)
    return tuple(out)


def _anchor(passes: list[PassSpec], entry: dict, side: str, *, source: str, line: int | None,
            key: str) -> int:
    """The index of the pass an insert entry names with ``before``/``after`` (and ``occurrence``)."""
    anchor, anchor_line = entry[side], line_of(entry, side) or line
    if not isinstance(anchor, str):
        raise PlanError(f"expected the name of a pass of the plan, got {type(anchor).__name__}", file=source,
                        line=anchor_line, key=f"{key}.{side}")
    names = [p.name for p in passes]
    found = [i for i, n in enumerate(names) if n == anchor]
    if not found:
        raise PlanError(f"the plan has no pass '{clip(anchor)}' to insert {side}"
                        f"{did_you_mean(anchor, names)}", file=source, line=anchor_line, key=f"{key}.{side}")
    times = f"'{anchor}' appears {len(found)} times in the plan"
    if "occurrence" not in entry:
        if len(found) == 1:
            return found[0]
        where = ", ".join(map(str, found[:-1])) + f" and {found[-1]}"
        raise PlanError(f"{times} (positions {where}); add 'occurrence: N' (1 to {len(found)}) to say "
                        f"which", file=source, line=anchor_line, key=f"{key}.{side}")
    nth = entry["occurrence"]
    if isinstance(nth, bool) or not isinstance(nth, int) or not 1 <= nth <= len(found):
        raise PlanError(f"{times if len(found) > 1 else f'{anchor!r} appears once in the plan'}, so "
                        f"'occurrence' is an integer from 1 to {len(found)}, got {clip(repr(nth))}",
                        file=source, line=line_of(entry, "occurrence") or line, key=f"{key}.occurrence")
    return found[nth - 1]


def _dropped_options(base: Plan, restated: tuple[PassSpec, ...], later_options: Any,
                     source: str) -> list[PlanWarning]:
    """A warning for each option the parent set on a pass that ``restated`` keeps (the n-th pass of
    a name pairs with the parent's n-th) but whose entry leaves out, so it fell back to its default.
    Options the same layer sets under ``options:`` are not dropped."""
    later = later_options if isinstance(later_options, dict) else {}
    parents: dict[str, list[PassSpec]] = {}
    for spec in base.passes:
        parents.setdefault(spec.name, []).append(spec)
    seen: dict[str, int] = {}
    found = []
    for spec in restated:
        nth = seen[spec.name] = seen.get(spec.name, -1) + 1
        if nth >= len(parents.get(spec.name, ())):
            continue
        old = parents[spec.name][nth]
        set_later = later.get(spec.name) if isinstance(later.get(spec.name), dict) else {}
        for field in attrs.fields(type(spec.options)):
            option_name = field.name
            before, now = getattr(old.options, option_name), getattr(spec.options, option_name)
            if option_name in spec.given or option_name in set_later or before == now:
                continue
            where = f"{old.source}:{old.line}" if old.source and old.line else (old.source or base.name)
            found.append(PlanWarning(
                f"the parent sets {spec.name}.{option_name}: {_show(before)} ({where}), but this entry restates "
                f"'{spec.name}' without it, so it becomes {_show(now)} (the default); write the option here "
                f"to keep it, or keep the parent's list and add passes with 'insert:'",
                file=source, line=spec.line, key=f"{spec.key}.{spec.name}.{option_name}"))
    return found


def _show(value: Any) -> str:
    """A value as a warning quotes it (``null``, ``true``, ``'cpp'``, ``['aten.addmm']``)."""
    value = unstructure(value) if attrs.has(type(value)) else value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return clip(repr(value))


def _check_order(plan: Plan, registry: Registry, source: str, raw: Any) -> None:
    """Capture first, every ``requires`` met, roles where they can be (:mod:`.order`). An error
    about an inherited pass names the line of the key of ``source`` that changed the list."""
    changed = next((k for k in ("passes",) + LAYER_KEYS if k in raw), None) if isinstance(raw, dict) else None
    check_order(plan, registry, source, line_of(raw, changed) if changed else None)
