"""The ``pipeline`` command: inspect passes, validate/resolve/diff plans, run the demo, open
compile reports, bisect a miscompile to its pass, replay or minimize reproducers, and save, load
or show portable compile artifacts."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pipeline.errors import PipelineError


def _cmd_passes(args: argparse.Namespace) -> int:
    from pipeline.options import describe
    from pipeline.registry import get_registry
    registry = get_registry()
    for name in sorted(registry.passes):
        entry = registry.passes[name]
        cls = entry.cls
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"{name}  (v{cls.version}, {cls.stage} pass, from {entry.plugin})")
        if doc:
            print(f"    {doc}")
        if cls.requires or cls.provides or cls.invalidates:
            print("   ".join(f"{label}: {', '.join(sorted(tags)) or '-'}" for label, tags in (
                ("    requires", cls.requires), ("provides", cls.provides), ("invalidates", cls.invalidates))))
        for info in describe(cls.Options):
            print(f"    {info.name}: {info.type} = {_yaml_value(info.default)}")
            print(f"        {info.doc}")
            if info.tune:
                print(f"        tunable: {', '.join(_yaml_value(v) for v in info.tune)}")
        print()
    return 0


def _yaml_value(value: object) -> str:
    """A default as it is written in a plan (``null``, ``false``, ``[]``), not as Python spells it."""
    import yaml
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.plan.schema import load_plan
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
    from pipeline.plan.schema import load_plan
    from pipeline.plan.text import resolve_text
    sys.stdout.write(resolve_text(load_plan(args.plan)))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from pipeline.plan.schema import load_plan
    from pipeline.plan.text import diff_plans
    lines = diff_plans(load_plan(args.a), load_plan(args.b))
    if not lines:
        print("no differences: the plans compile the same way")
        return 0
    print("\n".join(lines))
    return 1 if args.exit_code else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.tools.demo import run_demo
    return run_demo(plan=args.plan, iterations=args.iterations)


def _cmd_bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    script = folder / ("zoo/runner.py" if args.zoo else "gpu_suite.py" if args.device == "cuda" else "cpu_suite.py")
    if not script.is_file():
        print(f"error: {script} not found (benchmarks ship with the source tree, not the wheel)", file=sys.stderr)
        return 2
    rest = list(args.rest)
    if args.zoo:
        rest = ["--device", args.device, *(["--family", args.family] if args.family else []),
                *(["--models", args.models] if args.models else []), *rest]
    elif args.family or args.models:
        print("error: --family and --models select zoo models: add --zoo", file=sys.stderr)
        return 2
    sys.argv = [str(script), *rest]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    import json
    import webbrowser
    from pathlib import Path
    from pipeline.tools.report_html import render_html
    path = Path(args.path)
    source = path / "report.json" if path.is_dir() else path
    if source.suffix == ".html":
        source = source.with_suffix(".json") if source.with_suffix(".json").is_file() else source
    if not source.is_file():
        print(f"error: no compile report at {args.path} (give report.json, report.html or their folder)",
              file=sys.stderr)
        return 2
    page = source
    if source.suffix == ".json":
        try:
            report = json.loads(source.read_text())
        except json.JSONDecodeError as exc:
            print(f"error: {source} is not a compile report: {exc}", file=sys.stderr)
            return 2
        page = source.with_name("report.html")
        page.write_text(render_html(report))
    print(page)
    if args.serve:
        return _serve(page, args.port)
    if not args.no_open and not webbrowser.open(page.resolve().as_uri()):
        print(f"open {page.resolve().as_uri()} in a browser (or use --serve)")
    return 0


def _serve(page: "Path", port: int) -> int:
    import functools
    import http.server
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def _cmd_bisect(args: argparse.Namespace) -> int:
    from pipeline.tools.bisect import bisect, load_target
    model, inputs = load_target(args.target)
    result = bisect(model, *inputs, plan=args.plan, rtol=args.rtol, atol=args.atol, use_fuel=not args.no_fuel)
    print(result)
    return 0 if result.culprit is None else 1


def _cmd_repro(args: argparse.Namespace) -> int:
    from pipeline.tools.repro import load_reproducer, replay
    repro = load_reproducer(args.directory)
    recorded = repro.failure
    print(f"reproducer {repro.directory}: pass '{repro.pass_name}' from {repro.info['plugin']} on graph "
          f"{repro.info['graph']} ({len(repro.graph.graph.nodes)} nodes)")
    print(f"recorded: {recorded.describe()}")
    seen = replay(repro)
    if not recorded.same_kind(seen):
        print(f"not reproduced: {seen.describe() if seen else 'the pass now preserves the result'}")
        return 0
    print(f"reproduced: {seen.describe()}")
    if args.minimize:
        from pipeline.tools.minimize import minimize, write_minimized
        result = minimize(repro, max_checks=args.max_checks)
        folder = write_minimized(repro, result, args.out)
        print(f"minimized: {result.nodes_before} -> {result.nodes_after} nodes in {result.checks} checks, "
              f"still {result.failure.describe()}")
        print(f"written to {folder}")
        print(result.graph.code.strip())
    return 1


def _target_on(target: str, device: str | None) -> tuple:
    """``(model, inputs)`` of a model script, moved to ``device`` when one is named."""
    from pipeline.tools.bisect import load_target
    model, inputs = load_target(target)
    if device:
        import torch
        model = model.to(device) if isinstance(model, torch.nn.Module) else model
        inputs = tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in inputs)
    return model, inputs


def _cmd_tune(args: argparse.Namespace) -> int:
    from pipeline.tools.tune import tune
    model, inputs = _target_on(args.target, args.device)
    result = tune(model, *inputs, base=args.base, budget=args.budget, training=args.training, out=args.out,
                  name=args.name)
    print(result.table())
    print(f"wrote {result.path}: extends {result.winner.base}"
          + (f", changes {result.plan.get('options')}" if result.plan.get("options") else ", no option changed"))
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from pipeline.tools.profile import profile
    model, inputs = _target_on(args.target, args.device)
    print(profile(model, *inputs, plan=args.plan, calls=args.calls, training=args.training).table(args.limit))
    return 0


def _cmd_artifacts(args: argparse.Namespace) -> int:
    from pipeline.cache.artifacts import describe_artifacts, load_artifacts, save_artifacts
    from pipeline.cache import cache_root
    if args.artifacts_command == "save":
        source = cache_root(args.cache_dir)
        manifest = save_artifacts(source, args.bundle, captures=args.captures)
        print(f"saved every compiled graph in {source} to {manifest.parent}")
    elif args.artifacts_command == "load":
        done = load_artifacts(args.bundle, args.cache_dir, trust_captures=args.trust_captures)
        print(f"loaded {done['entries']} compiled graph(s), {done['files']} kernel file(s) and {done['captures']} "
              f"stored capture(s) into {done['cache']}"
              + (f"; {done['captures_skipped']} stored capture(s) not loaded (--trust-captures loads them)"
                 if done["captures_skipped"] else ""))
    else:
        print(describe_artifacts(args.bundle))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``pipeline`` command's argument parser, one sub-command per task."""
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
    p.add_argument("--iterations", type=int, default=200,
                   help="interleaved timing rounds of one eager and one compiled call each (default: 200)")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("bench", help="run the benchmark suite: eager, Inductor and our plans in one run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--zoo", action="store_true", help="run the model zoo (benchmarks/zoo) instead of the suite")
    p.add_argument("--family", default="", help="with --zoo: only these families (comma-separated)")
    p.add_argument("--models", default="", help="with --zoo: only these models (comma-separated)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the suite (e.g. --quick, --out DIR)")
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("report", help="render a compile report (report.json or its folder) as HTML and open it")
    p.add_argument("path", help="report.json, report.html or the folder holding them")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 instead of opening a browser")
    p.add_argument("--port", type=int, default=0, help="port for --serve (default: any free port)")
    p.add_argument("--no-open", action="store_true", help="only write and print the page's path")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("bisect", help="name the first pass after which a model's compiled output differs from eager")
    p.add_argument("target", help="path/to/file.py[:factory] or package.module[:factory]; the factory "
                                  "(default model_and_inputs) returns (model, inputs)")
    p.add_argument("--plan", default="default", help="plan name or path (default: default)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: per dtype)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: per dtype)")
    p.add_argument("--no-fuel", action="store_true", help="do not bisect the rewrites of the pass found")
    p.set_defaults(func=_cmd_bisect)
    target_help = ("path/to/file.py[:factory] or package.module[:factory]; the factory (default model_and_inputs) "
                   "returns (model, inputs)")
    p = sub.add_parser("tune", help="find the fastest plan that matches eager for a model, by measuring it; "
                                    "write it as a small plan extending a built-in one")
    p.add_argument("target", help=target_help)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="move the model and inputs there first")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the search (default 300)")
    p.add_argument("--base", default=None, help="start from this plan only (default: the built-in plans)")
    p.add_argument("--out", default="tuned.yaml", help="where to write the plan (default tuned.yaml)")
    p.add_argument("--name", default=None, help="the written plan's name (default tuned-<model class>)")
    p.add_argument("--training", action="store_true", help="tune a training step (forward, loss, backward)")
    p.set_defaults(func=_cmd_tune)
    p = sub.add_parser("profile", help="time per call of each generated kernel and extern call of a compiled "
                                       "model, with its fused group and source lines")
    p.add_argument("target", help=target_help)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="move the model and inputs there first")
    p.add_argument("--plan", default="default", help="plan name or path (default: default)")
    p.add_argument("--calls", type=int, default=10, help="calls profiled (default 10)")
    p.add_argument("--limit", type=int, default=30, help="rows shown (default 30)")
    p.add_argument("--training", action="store_true", help="profile a training step (forward, loss, backward)")
    p.set_defaults(func=_cmd_profile)
    p = sub.add_parser("repro", help="replay a reproducer written by verify: each (exit 1 when it still fails)")
    p.add_argument("directory", help="the reproducer folder")
    p.add_argument("--minimize", action="store_true", help="shrink the graph while it keeps failing the same way")
    p.add_argument("--out", default=None, help="folder for the minimized reproducer (default: DIR/minimized)")
    p.add_argument("--max-checks", type=int, default=400, help="most replays the minimizer may run")
    p.set_defaults(func=_cmd_repro)
    artifacts = sub.add_parser("artifacts", help="bundle compiled graphs for another process or machine, or load a bundle")
    artifacts_sub = artifacts.add_subparsers(dest="artifacts_command", required=True)
    for name, text in (("save", "bundle every compiled graph of a cache folder (with its kernel files) into BUNDLE"),
                       ("load", "check BUNDLE against this machine's versions and device, then copy it into the cache"),
                       ("show", "list a bundle's graphs, what made them, and whether they load here")):
        p = artifacts_sub.add_parser(name, help=text)
        p.add_argument("bundle", help="the bundle folder")
        if name != "show":
            p.add_argument("--cache-dir", default=None,
                           help="cache folder (default: $PIPELINE_CACHE_DIR or the per-user default)")
        if name == "save":
            p.add_argument("--captures", action="store_true",
                           help="also bundle stored captures (pickles: load them only where the bundle is trusted)")
        if name == "load":
            p.add_argument("--trust-captures", action="store_true",
                           help="also load the bundle's stored captures (unpickled when used: bundles you made only)")
        p.set_defaults(func=_cmd_artifacts)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pipeline`` command; returns its exit status (2 for a project error, printed
    as one line without a traceback)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
