"""Plans: the YAML documents that name the passes to run, their order and options, and the
policies around them. Loading validates everything before anything compiles.

Top-level keys of a plan file::

    name, description, extends, target, passes, options, remove, verify, on_error, cache, expect, shapes

``extends`` names a parent plan (built-in name or path relative to this file); the child then
overrides: scalar keys replace, ``passes`` replaces the whole list, ``options`` merges options into
the parent's passes by name, ``remove`` drops passes by name, ``cache`` and ``expect`` merge key by key,
``shapes`` merges as :func:`pipeline.shapes.merge_shapes` says.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs

from .errors import PlanError, did_you_mean
from .options import convert_fields, option, positive, non_negative, unstructure
from .registry import Registry, get_registry
from .shapes import ShapeSettings, merge_shapes
from .yamlio import LocatedDict, line_of, load_document

MAX_EXTENDS_DEPTH = 32
# The kinds of graph a pass can run on: an inference graph, a training graph before it is split
# (joint forward+backward), and the forward and backward halves after the split.
ROLES = ("inference", "joint", "forward", "backward")
ROLES_KEY = "on"
TOP_LEVEL_KEYS = ("name", "description", "extends", "target", "passes", "options", "remove",
                  "verify", "on_error", "cache", "expect", "shapes")


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
class Expectations:
    """What a compile must achieve; checked after every call that compiled something."""

    max_graph_breaks: int | None = option(None, "Most graph breaks allowed (null: no limit).", check=non_negative)
    max_recompiles: int | None = option(None, "Most recompiles allowed, not counting warm-up of the declared "
                                              "shape buckets (null: no limit).", check=non_negative)
    max_kernels: int | None = option(None, "Most generated kernels over all graphs (null: no limit).",
                                     check=non_negative)
    cudagraphs: Literal["full", "any"] | None = option(
        None, "full: every graph must run under a CUDA graph; any: at least one (null: no check).")
    max_compile_seconds: float | None = option(None, "Most seconds of compile work (null: no limit).",
                                               check=positive)
    on_miss: Literal["error", "warn"] = option("error", "What a missed expectation does.")


@attrs.frozen
class PassSpec:
    """One entry of a plan's pass list: a registered pass name, its parsed options and the graph
    roles it runs on (``on:`` in YAML; None: every role its place in the plan allows)."""

    name: str
    options: Any
    line: int | None = attrs.field(default=None, eq=False)
    roles: tuple[str, ...] | None = None

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
            "expect": unstructure(self.expect),
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
        base = _from_data(plan, source="<dict>", registry=registry, chain=())
    elif isinstance(plan, (str, Path)):
        base = _from_file_or_name(plan, registry=registry, chain=(), relative_to=None)
    else:
        raise PlanError(f"a plan is a Plan, a plan name, a path or a dict, not {type(plan).__name__}")
    if overrides:
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
            raise PlanError(f"no plan named '{_shorten(text_ref)}'{did_you_mean(text_ref, registry.plans)} "
                            f"(or give a path to a .yaml file)")
        path = entry.path
    if not _probe(path, Path.is_file, text_ref):
        raise PlanError(f"plan file not found: {_shorten(text_ref)}")
    key = str(path.resolve())
    if key in chain:
        cycle = " -> ".join(list(chain) + [key])
        raise PlanError(f"'extends' forms a cycle: {cycle}")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise PlanError(f"'extends' chains more than {MAX_EXTENDS_DEPTH} plans; a plan hierarchy never "
                        f"needs that many levels")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read the plan: {exc.strerror}", file=str(path)) from None
    raw, line = load_document(data, str(path))
    return _from_data(raw, source=str(path), registry=registry, chain=chain + (key,),
                      base_dir=path.parent, line=line)


def _probe(path: Path, test: Any, text_ref: str) -> bool:
    """``path.exists()`` / ``path.is_file()`` where a name the OS refuses (too long, NUL bytes) is a
    PlanError instead of an OSError."""
    try:
        return test(path)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PlanError(f"cannot use '{_shorten(text_ref)}' as a plan path: {why}") from None


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
    for key in ("options", "remove"):
        if key in raw:
            raise PlanError(f"'{key}' changes a parent plan, so it needs 'extends'", file=source,
                            line=line_of(raw, key), key=key)
    fields = _convert_scalars(raw, source)
    passes = _parse_passes(raw["passes"], source=source, registry=registry, line=line_of(raw, "passes"))
    cache = _convert_section(CacheSettings, raw, "cache", source)
    expect = _convert_section(Expectations, raw, "expect", source)
    shapes = merge_shapes(ShapeSettings(), raw["shapes"], source=source, line=line_of(raw, "shapes")) \
        if "shapes" in raw else ShapeSettings()
    plan = Plan(passes=passes, cache=CacheSettings(**cache), expect=Expectations(**expect), shapes=shapes,
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
            raise PlanError(f"unknown key '{key}'{did_you_mean(str(key), TOP_LEVEL_KEYS)}",
                            file=source, line=line_of(raw, key), key=str(key))


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
        raise PlanError(f"a pass entry is one name mapped to its options (plus, optionally, "
                        f"'{ROLES_KEY}: [roles]'), got {len(item)} keys ({', '.join(map(str, item))}); "
                        f"write each pass as its own list item", file=source, line=line, key=key)
    else:
        raise PlanError(f"a pass entry is a name or 'name: {{options}}', got {type(item).__name__}",
                        file=source, line=line, key=key)
    entry = registry.pass_entry(name)
    if entry is None:
        raise PlanError(f"unknown pass '{name}'{registry.unknown_pass_hint(name)}", file=source,
                        line=line, key=f"{key}.{name}" if isinstance(item, dict) else key)
    values = convert_fields(entry.cls.Options, raw_options, source=source, key=f"{key}.{name}", line=opt_line)
    if roles is not None and entry.cls.stage != "graph":
        raise PlanError(f"'{ROLES_KEY}' restricts a graph pass to some graph roles; '{name}' is a "
                        f"{entry.cls.stage} pass and runs where its stage says", file=source, line=line,
                        key=f"{key}.{ROLES_KEY}")
    return PassSpec(name=name, options=entry.cls.Options(**values), line=line, roles=roles)


def _parse_roles(raw: Any, *, source: str, line: int | None, key: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"expected a non-empty list of graph roles ({', '.join(ROLES)})", file=source,
                        line=line, key=key)
    for i, role in enumerate(raw):
        if role not in ROLES:
            raise PlanError(f"unknown graph role {role!r}{did_you_mean(str(role), ROLES)} (roles: "
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
    if "passes" in layer:
        passes = _parse_passes(layer["passes"], source=source, registry=registry,
                               line=line_of(layer, "passes"))
    if "remove" in layer:
        passes = _remove_passes(passes, layer["remove"], source, line_of(layer, "remove"))
        if not passes:
            raise PlanError("'remove' leaves the plan without passes; it needs at least its capture pass",
                            file=source, line=line_of(layer, "remove"), key="remove")
    if "options" in layer:
        passes = _merge_options(passes, layer["options"], source, registry, line_of(layer, "options"))
    cache = attrs.evolve(base.cache, **_convert_section(CacheSettings, layer, "cache", source))
    expect = attrs.evolve(base.expect, **_convert_section(Expectations, layer, "expect", source))
    shapes = merge_shapes(base.shapes, layer["shapes"], source=source, line=line_of(layer, "shapes")) \
        if "shapes" in layer else base.shapes
    plan = attrs.evolve(base, passes=passes, cache=cache, expect=expect, shapes=shapes, **fields)
    _check_order(plan, registry, source, layer, lines_from_source="passes" in layer)
    return plan


def _remove_passes(passes: tuple[PassSpec, ...], raw: Any, source: str, line: int | None) -> tuple:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise PlanError("expected a list of pass names", file=source, line=line, key="remove")
    names = [p.name for p in passes]
    for i, name in enumerate(raw):
        if name not in names:
            raise PlanError(f"the parent plan has no pass '{name}' to remove{did_you_mean(name, names)}",
                            file=source, line=line_of(raw, i) or line, key=f"remove[{i}]")
    return tuple(p for p in passes if p.name not in raw)


def _merge_options(passes: tuple[PassSpec, ...], raw: Any, source: str, registry: Registry,
                   line: int | None) -> tuple:
    if not isinstance(raw, dict):
        raise PlanError("expected a mapping of pass name to options", file=source, line=line, key="options")
    names = [p.name for p in passes]
    updates = {}
    for name, opts in raw.items():
        name_line = line_of(raw, name) or line
        if name not in names:
            raise PlanError(f"the plan has no pass '{name}' to set options on{did_you_mean(str(name), names)}",
                            file=source, line=name_line, key=f"options.{name}")
        cls = registry.passes[name].cls
        updates[name] = convert_fields(cls.Options, opts, source=source, key=f"options.{name}", line=name_line)
    return tuple(attrs.evolve(p, options=attrs.evolve(p.options, **updates[p.name])) if p.name in updates
                 else p for p in passes)


def _check_order(plan: Plan, registry: Registry, source: str, raw: Any, *,
                 lines_from_source: bool = True) -> None:
    """Check the capture pass comes first and every ``requires`` is met. Inherited passes
    (``lines_from_source`` false) carry lines of the parent's file, so their errors point at the
    key of ``source`` that changed the list (``remove`` or ``options``) instead."""
    changed = next((k for k in ("passes", "remove", "options") if k in raw), None) \
        if isinstance(raw, dict) else None
    passes_line = line_of(raw, changed) if changed else None

    def line_for(spec: PassSpec) -> int | None:
        return (spec.line if lines_from_source else None) or passes_line

    first = plan.passes[0]
    first_cls = registry.passes[first.name].cls
    if first_cls.stage != "capture":
        captures = sorted(n for n, e in registry.passes.items() if e.cls.stage == "capture")
        raise PlanError(f"the first pass must be a capture pass ({', '.join(captures)}), got "
                        f"'{first.name}'", file=source, line=line_for(first), key="passes[0]")
    tags: set[str] = set()
    for index, spec in enumerate(plan.passes):
        cls = registry.passes[spec.name].cls
        if index > 0 and cls.stage == "capture":
            raise PlanError(f"'{spec.name}' is a capture pass and can only come first", file=source,
                            line=line_for(spec), key=f"passes[{index}]")
        missing = sorted(set(cls.requires) - tags)
        if missing:
            providers = sorted(n for n, e in registry.passes.items()
                               if set(missing) & set(e.cls.provides))
            hint = f"; put one of {', '.join(providers)} before it" if providers else ""
            raise PlanError(f"pass '{spec.name}' requires {', '.join(missing)}, which no earlier pass "
                            f"provides{hint}", file=source, line=line_for(spec),
                            key=f"passes[{index}]")
        tags -= set(cls.invalidates)
        tags |= set(cls.provided(spec.options))
    _check_roles(plan, registry, source, line_for)


def role_pipeline(passes: tuple[PassSpec, ...] | list[PassSpec], stages: list[str], role: str) -> list[int]:
    """Indices of the passes that run, in order, on a graph of ``role`` (capture excluded).

    Inference graphs run every pass but the split. A training graph runs the passes before the
    split pass on the joint graph, then the split, then the passes after it on each half; so
    ``forward`` and ``backward`` list the joint passes, the split and their own passes (without a
    split pass in the plan, AOTAutograd's default partition splits first and every pass runs
    on the halves). ``on:`` in a plan entry narrows all of this."""
    split = next((i for i, stage in enumerate(stages) if stage == "split"), None)
    out = []
    for index, (spec, stage) in enumerate(zip(passes, stages)):
        if stage == "capture":
            continue
        if role == "inference":
            runs = stage != "split" and spec.runs_on("inference")
        elif role == "joint":
            runs = split is not None and index < split and spec.runs_on("joint")
        elif split is None or index > split:
            runs = spec.runs_on(role)
        else:
            runs = index == split or spec.runs_on("joint")
        if runs:
            out.append(index)
    return out


def _check_roles(plan: Plan, registry: Registry, source: str, line_for: Any) -> None:
    """At most one split pass; ``on:`` names roles a pass can meet where it stands; and every
    ``requires`` is met along each role's own sequence of passes."""
    stages = [registry.passes[spec.name].cls.stage for spec in plan.passes]
    splits = [i for i, stage in enumerate(stages) if stage == "split"]
    if len(splits) > 1:
        spec = plan.passes[splits[1]]
        raise PlanError(f"a plan splits training graphs once, but '{plan.passes[splits[0]].name}' and "
                        f"'{spec.name}' are both split passes", file=source, line=line_for(spec),
                        key=f"passes[{splits[1]}]")
    split = splits[0] if splits else None
    for index, spec in enumerate(plan.passes):
        if spec.roles is None:
            continue
        where = f"passes[{index}].{ROLES_KEY}"
        if split is None and "joint" in spec.roles:
            raise PlanError("role 'joint' needs a split pass (such as 'partition') later in the plan: without "
                            "one, training graphs are split before any pass runs", file=source,
                            line=line_for(spec), key=where)
        if split is not None and index > split and "joint" in spec.roles:
            raise PlanError(f"'{spec.name}' comes after the split pass '{plan.passes[split].name}', where "
                            f"training graphs are forward and backward halves, not joint", file=source,
                            line=line_for(spec), key=where)
        halves = [r for r in ("forward", "backward") if r in spec.roles]
        if split is not None and index < split and halves:
            raise PlanError(f"'{spec.name}' comes before the split pass '{plan.passes[split].name}', where "
                            f"training graphs are still joint; move it after the split to run it on "
                            f"{' and '.join(halves)} graphs", file=source, line=line_for(spec), key=where)
    capture_cls = registry.passes[plan.passes[0].name].cls
    for role in ROLES:
        tags = set(capture_cls.provided(plan.passes[0].options))
        for index in role_pipeline(plan.passes, stages, role):
            spec = plan.passes[index]
            cls = registry.passes[spec.name].cls
            missing = sorted(set(cls.requires) - tags)
            if missing:
                raise PlanError(f"pass '{spec.name}' requires {', '.join(missing)} on {role} graphs, which "
                                f"no earlier pass that runs on them provides (see their '{ROLES_KEY}:')",
                                file=source, line=line_for(spec), key=f"passes[{index}]")
            tags -= set(cls.invalidates)
            tags |= set(cls.provided(spec.options))
