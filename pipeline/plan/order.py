"""Whether a plan's passes can run in the order it gives: the capture pass first, every
``requires`` met by an earlier pass along each graph role's own sequence, at most one split pass,
and ``on:`` roles a pass can meet where it stands; and that sequence itself (:func:`role_pipeline`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.errors import PlanError

if TYPE_CHECKING:
    from pipeline.plan.schema import PassSpec, Plan
    from pipeline.registry import Registry

ROLES = ("inference", "joint", "forward", "backward")
ROLES_KEY = "on"


def check_order(plan: Plan, registry: Registry, source: str, passes_line: int | None) -> None:
    """Check the capture pass comes first and every ``requires`` is met. An error about a pass
    written in ``source`` names its entry (``passes[2]``, ``insert[0]``); one about an inherited pass
    names its position and ``passes_line``, the line of the key that changed the list."""

    def line_for(spec: PassSpec) -> int | None:
        return (spec.line if spec.source == source else None) or passes_line

    def key_for(spec: PassSpec, index: int) -> str:
        return spec.key if spec.source == source and spec.key else f"passes[{index}]"

    first = plan.passes[0]
    first_cls = registry.passes[first.name].cls
    if first_cls.stage != "capture":
        captures = sorted(n for n, e in registry.passes.items() if e.cls.stage == "capture")
        raise PlanError(f"the first pass must be a capture pass ({', '.join(captures)}), got "
                        f"'{first.name}'", file=source, line=line_for(first), key=key_for(first, 0))
    tags: set[str] = set()
    for index, spec in enumerate(plan.passes):
        cls = registry.passes[spec.name].cls
        if index > 0 and cls.stage == "capture":
            raise PlanError(f"'{spec.name}' is a capture pass and can only come first", file=source,
                            line=line_for(spec), key=key_for(spec, index))
        missing = sorted(set(cls.requires) - tags)
        if missing:
            providers = sorted(n for n, e in registry.passes.items()
                               if set(missing) & set(e.cls.provides))
            hint = f"; put one of {', '.join(providers)} before it" if providers else ""
            raise PlanError(f"pass '{spec.name}' requires {', '.join(missing)}, which no earlier pass "
                            f"provides{hint}", file=source, line=line_for(spec),
                            key=key_for(spec, index))
        tags -= set(cls.invalidates)
        tags |= set(cls.provided(spec.options))
    _check_roles(plan, registry, source, line_for, key_for)


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


def _check_roles(plan: Plan, registry: Registry, source: str, line_for: Any, key_for: Any) -> None:
    """At most one split pass; ``on:`` names roles a pass can meet where it stands; and every
    ``requires`` is met along each role's own sequence of passes."""
    stages = [registry.passes[spec.name].cls.stage for spec in plan.passes]
    splits = [i for i, stage in enumerate(stages) if stage == "split"]
    if len(splits) > 1:
        spec = plan.passes[splits[1]]
        raise PlanError(f"a plan splits training graphs once, but '{plan.passes[splits[0]].name}' and "
                        f"'{spec.name}' are both split passes", file=source, line=line_for(spec),
                        key=key_for(spec, splits[1]))
    split = splits[0] if splits else None
    for index, spec in enumerate(plan.passes):
        if spec.roles is None:
            continue
        where = f"{key_for(spec, index)}.{ROLES_KEY}"
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
                                file=source, line=line_for(spec), key=key_for(spec, index))
            tags -= set(cls.invalidates)
            tags |= set(cls.provided(spec.options))
