"""Generate the plan reference (``docs/plan-reference.md``) from the code that defines plans.

Every pass's section comes from its class: name, plugin, version, stage, invariant tags, docstring
and the options table from :func:`pipeline.options.describe`, the same declaration the plan loader
checks against. So the reference cannot drift from what a plan accepts; ``tests/test_docs.py``
fails when the committed file is stale. Regenerate with::

    python -m pipeline.tools.docgen > docs/plan-reference.md

The output is deterministic: passes and plans sorted by name, no timestamps, no absolute paths and
no package versions (a version bump or running from a source tree must not change the file).
"""
from __future__ import annotations

import inspect
import sys
import typing
from typing import Any, Iterable

import attrs
import yaml

from pipeline.options import OptionInfo, describe, type_name
from pipeline.metrics import ExpectationFields
from pipeline.plan.schema import TOP_LEVEL_KEYS, CacheSettings, Plan, load_plan
from pipeline.plan.shapes import ShapeSettings
from pipeline.registry import OWN_DISTRIBUTION, PluginInfo, Registry, get_registry
from pipeline.plan.yamlio import MAX_DEPTH, MAX_KEY_CHARS, MAX_NODES, MAX_PLAN_BYTES, QUOTE_CHARS

# What each top-level plan key means. Types and defaults of the keys that are fields of
# :class:`Plan` are read from the class; the rest are stated here.
_KEY_DOCS: dict[str, tuple[str | None, str]] = {
    "name": ("str", "The plan's name, shown in logs, reports and errors. Required unless `extends` is given."),
    "description": (None, "What the plan is for, one paragraph."),
    "extends": ("str", "A parent plan: a registered plan name (built-in or shipped by a plugin) or a path "
                       "to a YAML file, relative to this file. This file's keys then override the parent's "
                       "(see *Extending a plan*)."),
    "target": (None, "Device the plan compiles for. `auto` picks `cuda` when any graph input is on a CUDA "
                     "device, else `cpu`. Passes read it as `context.target`; no built-in pass "
                     "changes its output on it yet."),
    "passes": ("list", "The ordered passes. Each entry is a pass name, or one pass name mapped to its "
                       "options (`- decompose: {table: core-aten}`). The first entry must be a capture pass; "
                       "no other may be. Required unless `extends` is given; with `extends` it replaces "
                       "the parent's whole list. An entry may add `on: [roles]` next to the pass name to run "
                       "it only on graphs of those roles: `inference`, `joint` (a training graph before "
                       "the split pass, such as `partition`), `forward` and `backward` (its halves after "
                       "the split). Without `on`, a pass runs on every role its place allows: inference "
                       "graphs run every pass but the split, training graphs run the passes before the "
                       "split on the joint graph and those after it on both halves (a plan without a "
                       "split pass has training graphs split by AOTAutograd's default partitioner first, "
                       "so every pass runs on the halves). At most one split pass per plan. Restating the "
                       "parent's list starts each pass from its defaults: a warning names every option the "
                       "parent set that a restated entry leaves out (use `insert` to add a pass instead)."),
    "insert": ("list", "Only with `extends`: passes to put next to named passes of the parent's list, which "
                       "otherwise stays as it is, options included. Each entry names exactly one of `before` "
                       "or `after` (a pass of the plan), `pass` (the pass to insert) and optionally its "
                       "`options` and `on: [roles]`; when the plan has the anchor pass more than once, "
                       "`occurrence: N` (1-based) says which. Entries apply in order, so one may name a pass "
                       "an earlier entry inserted."),
    "options": ("mapping", "Only with `extends`: `{pass name: {option: value}}`, merged into the options "
                           "of the plan's passes of that name (every pass of that name)."),
    "remove": ("list[str]", "Only with `extends`: names of passes to drop (every pass of that name)."),
    "verify": (None, "`off`: no checks. `final`: on each graph's first call, compare the final graph with "
                     "the captured graph on the real inputs, and run the registered invariant checks after "
                     "every pass. `each`: the same, comparing the graph after every pass, so a mismatch "
                     "names the first pass that changed the result."),
    "on_error": (None, "`raise`: a failing graph pass or verification raises. `eager`: that graph runs as "
                       "captured (eagerly) instead, with a warning, and the reason is recorded as a "
                       "fallback in the compile record."),
    "cache": (None, "Compile-cache settings (table below): where compiled graphs and kernels are kept "
                    "and reused across processes (see docs/caching.md)."),
    "expect": (None, "What the compile must achieve (table below); checked after every call that compiled "
                     "something."),
    "shapes": (None, "Declared shape buckets: each bucketed input dimension is padded up to its bucket at call "
                     "time, warm-up compiles every bucket ahead of serving, and a stance applies after it "
                     "(section below; docs/serving.md)."),
}


def _plain_text(doc: str | None) -> str:
    """A docstring as Markdown paragraphs (common indentation removed)."""
    return inspect.cleandoc(doc) if doc else "(no docstring)"


def _cell(text: Any) -> str:
    """Text safe inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _yaml_value(value: Any) -> str:
    """A value as it is written in a plan (``null``, ``false``, ``[]``), not as Python spells it.
    Strings are shown bare: the plan loader reads ``off`` as a string, not a boolean."""
    if isinstance(value, str):
        return value or '""'
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _options_table(infos: Iterable[OptionInfo]) -> list[str]:
    infos = list(infos)
    if not infos:
        return ["No options."]
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for info in infos:
        tuned = f" (tunable: {', '.join(f'`{_cell(_yaml_value(v))}`' for v in info.tune)})" if info.tune else ""
        lines.append(f"| `{info.name}` | `{_cell(info.type)}` | `{_cell(_yaml_value(info.default))}`{tuned} "
                     f"| {_cell(info.doc)} |")
    return lines


def _plugin_label(info: PluginInfo) -> str:
    """``distribution (module)`` without the distribution's version (see the module docstring)."""
    dist = (info.distribution or "").split(" ")[0]
    return f"`{dist}` (module `{info.module}`)" if dist else f"module `{info.module}`"


def _is_builtin(info: PluginInfo) -> bool:
    return (info.distribution or "").startswith(OWN_DISTRIBUTION)


def _tags(tags: Iterable[str]) -> str:
    return ", ".join(f"`{t}`" for t in sorted(tags)) or "-"


def _conditional(cls: type) -> str:
    """Tags a pass adds only for some options (``Pass.provided``), as seen with its defaults."""
    extra = set(cls.provided(cls.Options())) - set(cls.provides)
    return f" (with default options also {_tags(extra)})" if extra else ""


def _pass_section(name: str, entry: Any) -> list[str]:
    cls = entry.cls
    lines = [f"### `{name}`", "",
             f"- plugin: {_plugin_label(entry.plugin)}, class `{cls.__module__}.{cls.__qualname__}`",
             f"- version: `{cls.version}`; stage: `{cls.stage}`",
             f"- requires: {_tags(cls.requires)}; provides: {_tags(cls.provides)}{_conditional(cls)}; "
             f"invalidates: {_tags(cls.invalidates)}", "",
             _plain_text(cls.__doc__), ""]
    return lines + _options_table(describe(cls.Options)) + [""]


def _top_level_keys() -> list[str]:
    missing = [k for k in TOP_LEVEL_KEYS if k not in _KEY_DOCS]
    if missing:
        raise RuntimeError(f"pipeline/tools/docgen.py has no description for plan key(s) {missing}")
    hints = {f.name: f for f in attrs.fields(Plan)}
    types = {name: type_name(tp) for name, tp in typing.get_type_hints(Plan).items()}
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in TOP_LEVEL_KEYS:
        stated, meaning = _KEY_DOCS[key]
        kind = stated or types[key]
        field = hints.get(key)
        default = "-"
        if field is not None and field.default is not attrs.NOTHING:
            value = field.default
            default = "see below" if attrs.has(type(value)) else f"`{_cell(_yaml_value(value))}`"
        lines.append(f"| `{key}` | `{_cell(kind)}` | {default} | {_cell(meaning)} |")
    return lines


def _plans_section(registry: Registry, include_plugins: bool) -> list[str]:
    lines = ["| plan | passes | verify | on_error | description |", "|---|---|---|---|---|"]
    for name in sorted(registry.plans):
        entry = registry.plans[name]
        if not include_plugins and not _is_builtin(entry.plugin):
            continue
        plan = load_plan(name, registry=registry)
        lines.append(f"| `{name}` | {_cell(' → '.join(plan.pass_names()))} | `{plan.verify}` | "
                     f"`{plan.on_error}` | {_cell(' '.join(plan.description.split()))} |")
    return lines


def _tags_section(registry: Registry, names: list[str]) -> list[str]:
    tags: dict[str, dict[str, list[str]]] = {}
    for name in names:
        cls = registry.passes[name].cls
        for role, values in (("provided by", cls.provided(cls.Options())), ("required by", cls.requires),
                             ("invalidated by", cls.invalidates)):
            for tag in values:
                tags.setdefault(tag, {}).setdefault(role, []).append(f"`{name}`")
    roles = ("provided by", "required by", "invalidated by")
    lines = [f"| tag | {' | '.join(roles)} | invariant check |", "|---|---|---|---|---|"]
    for tag in sorted(set(tags) | set(registry.invariants)):
        checks = [_plugin_label(info) for _, info in registry.invariants.get(tag, [])]
        cells = [", ".join(tags.get(tag, {}).get(role, [])) or "-" for role in roles]
        lines.append(f"| `{tag}` | {' | '.join(cells)} | {', '.join(checks) or '-'} |")
    return lines


def plan_reference(include_plugins: bool = False, registry: Registry | None = None) -> str:
    """The plan reference as Markdown. Only the built-in passes, plans and checks unless
    ``include_plugins`` (the committed file must not depend on what else is installed)."""
    registry = registry or get_registry()
    names = sorted(n for n, e in registry.passes.items() if include_plugins or _is_builtin(e.plugin))
    if not include_plugins:
        registry = _builtin_view(registry)
    out = [
        "# Plan reference",
        "",
        "<!-- Generated by `python -m pipeline.tools.docgen > docs/plan-reference.md`; do not edit by hand. -->",
        "",
        "A plan is a YAML file (or a dict in the same shape) that names the passes to run, in order, "
        "with their options, and the policies around them. Loading validates everything before anything "
        "compiles: an unknown key, pass or option, a mistyped value, or a pass whose `requires` no earlier "
        "pass provides is an error naming the file, line and key, with the nearest valid name. "
        "`pipeline plan resolve PLAN` prints the fully defaulted plan; `pipeline passes` prints the pass "
        "tables below for every installed plugin.",
        "",
        "YAML is read with `yaml.SafeLoader` (a plan never executes code), with these differences: plain "
        "values resolve as in YAML 1.2's core schema, so only `true`/`false` are booleans (`verify: off` is "
        "the string `off`), integers are decimal, `0o17` or `0x1F` (`010` is ten; `1:30`, `1_000` and "
        "`2024-01-01` are strings) and `1e3` is a float; a key given twice in one mapping is an error. "
        f"A plan file (or a plan given as a dict) is at most {MAX_PLAN_BYTES >> 10} KiB and {MAX_NODES} values "
        f"(scalars, lists and mappings), a key or pass name at most {MAX_KEY_CHARS} characters, nesting at "
        f"most {MAX_DEPTH} levels deep; float options must be "
        "finite (no `.nan` or `.inf`; a `pad_value` may be infinite) and strings may not hold a NUL "
        f"character. Errors quote at most {QUOTE_CHARS} characters of any value.",
        "",
        "## Top-level keys",
        "",
        *_top_level_keys(),
        "",
        "## Extending a plan",
        "",
        "With `extends`, scalar keys replace the parent's, `passes` replaces the whole list, `insert` then "
        "puts passes before or after named ones, `remove` then drops passes by name, `options` then merges "
        "options into the remaining passes by name, and `cache` and `expect` merge key by key. The same "
        "rules apply to the keyword overrides of `compile_with_plan(model, plan, **overrides)` (where "
        "`extends` is not allowed). To add a pass, insert it rather than restating the parent's `passes`: "
        "a restated entry starts from the pass's defaults, and `pipeline plan validate` warns about every "
        "option of the parent it drops that way.",
        "",
        "```yaml",
        "name: my-plan",
        "extends: default",
        "insert:",
        "  - after: codegen",
        "    pass: matmul-template",
        "    options: {choose: autotune}",
        "  - after: dce",
        "    occurrence: 2          # default runs dce twice: this is the second",
        "    pass: constant-fold",
        "options:",
        "  capture: {fullgraph: true}",
        "remove: [pad-mm]",
        "verify: each",
        "```",
        "",
        "## `cache`",
        "",
        _plain_text(CacheSettings.__doc__),
        "",
        *_options_table(describe(CacheSettings)),
        "",
        "## `expect`",
        "",
        _plain_text(ExpectationFields.__doc__),
        "",
        *_options_table(describe(ExpectationFields)
                        + [info for m in registry.metrics.values() for info in describe(m.limits)]),
        "",
        "## `shapes`",
        "",
        _plain_text(ShapeSettings.__doc__),
        "",
        *_options_table(describe(ShapeSettings)),
        "",
        "Under `extends`, the scalars replace the parent's and `axes`, `buckets` and `outputs` merge by "
        "name (an entry set to `null` removes the parent's; `shapes: null` clears the section). Padding "
        "appends `pad_value` at the end of each bucketed dimension; a size above the largest bucket is an "
        "error naming the input, dimension, size and buckets. See docs/serving.md.",
        "",
        "## Plans",
        "",
        *_plans_section(registry, include_plugins),
        "",
        "## Invariant tags",
        "",
        "A pass declares the tags it `requires`, `provides` and `invalidates`. A plan is rejected at load "
        "time when a pass requires a tag no earlier pass provides (the capture pass provides `captured`); "
        "a pass may provide more tags for some options (the table shows each pass with its defaults). "
        "When `verify` is not `off`, the invariant checks plugins register for a tag run after every pass "
        "that provides it.",
        "",
        *_tags_section(registry, names),
        "",
        "## Passes",
        "",
    ]
    for name in names:
        out.extend(_pass_section(name, registry.passes[name]))
    return "\n".join(out).rstrip("\n") + "\n"


def _builtin_view(registry: Registry) -> Registry:
    """A registry holding only what the built-in plugin registered."""
    view = Registry()
    view.plugins = [p for p in registry.plugins if _is_builtin(p)]
    view.passes = {n: e for n, e in registry.passes.items() if _is_builtin(e.plugin)}
    view.plans = {n: e for n, e in registry.plans.items() if _is_builtin(e.plugin)}
    view.invariants = {t: [c for c in checks if _is_builtin(c[1])] for t, checks in registry.invariants.items()}
    view.invariants = {t: checks for t, checks in view.invariants.items() if checks}
    view.metrics = {n: m for n, m in registry.metrics.items() if _is_builtin(registry.metric_plugins[n])}
    return view


def main(argv: list[str] | None = None) -> int:
    """Print the reference; ``--all`` includes installed third-party plugins."""
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(plan_reference(include_plugins="--all" in args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
