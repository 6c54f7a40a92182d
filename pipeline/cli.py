"""The ``pipeline`` command: inspect passes, validate/resolve/diff plans, run the demo."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import PipelineError


def _cmd_passes(args: argparse.Namespace) -> int:
    from .options import describe
    from .registry import get_registry
    registry = get_registry()
    for name in sorted(registry.passes):
        entry = registry.passes[name]
        cls = entry.cls
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"{name}  (v{cls.version}, {cls.stage} pass, from {entry.plugin})")
        if doc:
            print(f"    {doc}")
        if cls.requires or cls.provides:
            print(f"    requires: {', '.join(sorted(cls.requires)) or '-'}   provides: "
                  f"{', '.join(sorted(cls.provides)) or '-'}")
        for info in describe(cls.Options):
            print(f"    {info.name}: {info.type} = {_yaml_value(info.default)}")
            print(f"        {info.doc}")
        print()
    return 0


def _yaml_value(value: object) -> str:
    """A default as it is written in a plan (``null``, ``false``, ``[]``), not as Python spells it."""
    import yaml
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _cmd_validate(args: argparse.Namespace) -> int:
    from .plan import load_plan
    status = 0
    for ref in args.plans:
        try:
            plan = load_plan(ref)
        except PipelineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"ok: {ref} (plan '{plan.name}', {len(plan.passes)} passes: {' -> '.join(plan.pass_names())})")
    return status


def _cmd_resolve(args: argparse.Namespace) -> int:
    from .plan import load_plan
    from .plan_text import resolve_text
    sys.stdout.write(resolve_text(load_plan(args.plan)))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from .plan import load_plan
    from .plan_text import diff_plans
    lines = diff_plans(load_plan(args.a), load_plan(args.b))
    if not lines:
        print("no differences: the plans compile the same way")
        return 0
    print("\n".join(lines))
    return 1 if args.exit_code else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(plan=args.plan, iterations=args.iterations)


def _cmd_bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    script = folder / ("gpu_suite.py" if args.device == "cuda" else "cpu_suite.py")
    if not script.is_file():
        print(f"error: {script} not found (benchmarks ship with the source tree, not the wheel)", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("passes", help="list every registered pass with its options, types, defaults and docs")
    p.set_defaults(func=_cmd_passes)
    plan = sub.add_parser("plan", help="validate, resolve or diff plans")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True)
    p = plan_sub.add_parser("validate", help="check plans without compiling anything")
    p.add_argument("plans", nargs="+", help="plan names or paths")
    p.set_defaults(func=_cmd_validate)
    p = plan_sub.add_parser("resolve", help="print the fully defaulted plan as YAML (it loads back equal)")
    p.add_argument("plan")
    p.set_defaults(func=_cmd_resolve)
    p = plan_sub.add_parser("diff", help="passes added, removed, reordered and options changed from A to B")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--exit-code", action="store_true", help="exit 1 when the plans differ")
    p.set_defaults(func=_cmd_diff)
    p = sub.add_parser("demo", help="compile the built-in example model; print correctness and speed vs eager")
    p.add_argument("--plan", default="default")
    p.add_argument("--iterations", type=int, default=200)
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("bench", help="run the benchmark suite: eager, Inductor and our plans in one run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite (e.g. --quick, --out DIR)")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
