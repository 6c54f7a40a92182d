"""OpInfo conformance sweep: every operator of torch's OpInfo database through a plan, against eager.

    .venv/bin/python benchmarks/opinfo_sweep.py --out benchmarks/results/opinfo-cpu.md
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/opinfo_sweep.py --backend triton \\
        --out benchmarks/results/opinfo-triton-interpret.md

For each OpInfo entry (``torch.testing._internal.common_methods_invocations.op_db``) the first few
samples in float32, and one sample each in float16 and bfloat16 where the op supports them (an op
without those is run in its first integer or boolean dtype, else float64, else complex64), are
compiled as
``lambda *a, **k: op(*a, **k)`` with ``compile_with_plan`` and compared with eager PyTorch
(outputs and in-place updates of inputs, dtype-aware tolerances of ``pipeline.numerics``), as
Inductor's own OpInfo test does. Each op gets one class:

- ``generated``: at least one sample ran through a generated kernel, every sample matched;
- ``extern``: every sample matched, running compiled graphs of ATen calls only;
- ``eager``: the compiled function ran eagerly, with the recorded reason (a graph break, or the
  plan's ``on_error: eager`` fallback with its error);
- ``mismatch`` / ``crash``: a sample's result differs from eager / the compiled call raised where
  eager did not;
- ``excluded``: out of scope, with the reason (sparse tensors, no CPU dtype, no sample eager
  itself can run on CPU).

Samples eager runs twice with different results are skipped (nondeterministic in eager). Random
and uninitialized results (``RANDOM_OPS``) are compiled and run like the rest but compared on
structure, shape, dtype and device only. A float16/bfloat16 result outside the tolerance still
matches when it is as close to a float64 reference as eager's own result.

The sweep runs each op in a worker process (a crash that kills the process is recorded against the
op) and writes a Markdown table and JSON. ``tests/test_opinfo.py`` runs a fixed subset in CI through
:func:`sweep_op`.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.utils._pytree as pytree

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline import compat, compilation_of, compile_with_plan  # noqa: E402
from pipeline.numerics import compare, tolerance  # noqa: E402
from pipeline.verification import clone_inputs  # noqa: E402

CLASSES = ("generated", "extern", "eager", "mismatch", "crash", "excluded")
LOW_PRECISION = (torch.float16, torch.bfloat16)
FALLBACK_DTYPES = (torch.int64, torch.int32, torch.bool, torch.uint8)

# Results that differ run to run or are undefined: compiled, run and checked for shape, dtype and
# device, never for values.
RANDOM_OPS = {
    "bernoulli", "normal", "normal.number_mean", "multinomial", "uniform", "exponential", "geometric",
    "cauchy", "log_normal", "rand_like", "randn_like", "randint_like", "randint", "randn", "rand",
    "randperm", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
    "nn.functional.multi_head_attention_forward", "empty", "empty_like", "new_empty",
    "new_empty_strided", "empty_strided", "empty_permuted", "torch._C._nn._test_warn_in_autograd",
}


@attrs.define
class SampleResult:
    dtype: str
    status: str            # generated | extern | eager | mismatch | crash | skipped
    detail: str = ""
    kernels: int = 0
    seconds: float = 0.0


@attrs.define
class OpResult:
    op: str
    status: str
    reason: str = ""
    samples: list = attrs.field(factory=list)
    seconds: float = 0.0


def op_key(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def wrapper_set_seed(op: Any, *args: Any, **kwargs: Any) -> Any:
    """OpInfo's own seeding wrapper (random ops call it), defined outside ``torch/`` so that
    Dynamo traces it instead of skipping the file it lives in; Inductor's OpInfo test does the same."""
    torch.manual_seed(42)
    return op(*args, **kwargs)


def load_op_db() -> list:
    """torch's OpInfo entries. Importing them freezes ``torch.backends`` flags for the rest of the
    process (a guard of torch's own test suite); that is undone, so tests after this one may set them."""
    frozen = torch.backends.flags_frozen()
    from torch.testing._internal import common_methods_invocations
    common_methods_invocations.wrapper_set_seed = wrapper_set_seed
    if not frozen:
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    return list(common_methods_invocations.op_db)


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exclusion(op: Any) -> str | None:
    """Why ``op`` is out of scope for the sweep, or None."""
    key = op_key(op)
    if "sparse" in key:
        return "sparse tensors are out of scope"
    dtypes = op.supported_dtypes("cpu")
    if not dtypes:
        return "no CPU dtypes"
    return None


def sweep_dtypes(op: Any) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    chosen = [d for d in (torch.float32, *LOW_PRECISION) if d in supported]
    if not chosen:
        chosen = [d for d in FALLBACK_DTYPES if d in supported][:1]
    if not chosen:
        chosen = [d for d in (torch.float64, torch.complex64) if d in supported][:1]
    return chosen


def _clone(tree: Any) -> Any:
    leaves, spec = pytree.tree_flatten(tree)
    return pytree.tree_unflatten(clone_inputs(leaves), spec)


def _metadata_problem(expected: Any, actual: Any) -> str | None:
    exp, exp_spec = pytree.tree_flatten(expected)
    act, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return f"structure differs: {exp_spec} vs {act_spec}"
    for e, a in zip(exp, act):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return f"expected {type(e).__name__}, got {type(a).__name__}"
        if isinstance(e, torch.Tensor) and (e.shape, e.dtype, e.device) != (a.shape, a.dtype, a.device):
            return f"metadata differs: {(tuple(e.shape), e.dtype)} vs {(tuple(a.shape), a.dtype)}"
    return None


def _compare_call(expected: Any, actual: Any, ref_args: Any, cand_args: Any, values: bool) -> str | None:
    if not values:
        return _metadata_problem(expected, actual)
    problem = compare(expected, actual, what="output")
    if problem:
        return problem
    for index, (e, a) in enumerate(zip(pytree.tree_leaves(ref_args), pytree.tree_leaves(cand_args))):
        if isinstance(e, torch.Tensor):
            problem = compare(e, a, what=f"input {index} after the call")
            if problem:
                return problem
    return None


def _upcast(tree: Any) -> Any:
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().to(torch.float64) if t.dtype in LOW_PRECISION else t.detach().clone(),
        tree)


def within_eager_precision(func: Any, args: Any, kwargs: Any, expected: Any, actual: Any) -> bool:
    """For float16/bfloat16: the compiled result (output and updated inputs) is at most twice as far from a float64 reference
    (the op run on the same inputs upcast) as eager's own result, plus the dtype's tolerance.
    Eager rounds once at the end of a fused ATen kernel while a decomposition rounds where its
    ops do, so both are approximations of the same value; this is the fp64-reference check of
    torch's accuracy tooling (``torch._dynamo.utils.same``)."""
    try:
        ref_args, ref_kwargs = _upcast((args, kwargs))
        reference = (func(*ref_args, **ref_kwargs), ref_args, ref_kwargs)
    except Exception:  # noqa: BLE001 - the op has no float64 path: no second opinion
        return False
    exp, act, ref = (pytree.tree_leaves(t) for t in (expected, actual, reference))
    if not len(exp) == len(act) == len(ref):
        return False
    for e, a, r in zip(exp, act, ref):
        if not (isinstance(e, torch.Tensor) and e.dtype in LOW_PRECISION and isinstance(r, torch.Tensor)):
            if compare(e, a):
                return False
            continue
        if e.shape != a.shape or e.dtype != a.dtype or r.shape != e.shape:
            return False
        rtol, atol = tolerance(e.dtype)
        r = r.to(torch.float64)
        bound = 2 * (e.double() - r).abs() + atol + rtol * r.abs()
        error = (a.double() - r).abs()
        ok = (error <= bound) | (torch.isnan(a) & torch.isnan(e)) | (a.double() == e.double())
        if not bool(ok.all()):
            return False
    return True


def run_sample(op: Any, sample: Any, dtype: torch.dtype, *, overrides: dict) -> SampleResult:
    """Compile one OpInfo sample and compare it with eager (warnings of either are not shown)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run_sample(op, sample, dtype, overrides=overrides)


def _run_sample(op: Any, sample: Any, dtype: torch.dtype, *, overrides: dict) -> SampleResult:
    start = time.perf_counter()
    func = op.get_op()
    args = [sample.input, *sample.args]
    kwargs = dict(sample.kwargs)
    values = op_key(op) not in RANDOM_OPS

    def call(*a: Any, **k: Any) -> Any:
        return func(*a, **k)

    def result(status: str, detail: str = "", kernels: int = 0) -> SampleResult:
        return SampleResult(str(dtype).replace("torch.", ""), status, _first_line(detail), kernels,
                            time.perf_counter() - start)

    torch._dynamo.reset()
    try:
        ref_args, ref_kwargs = _clone((args, kwargs))
        expected = func(*ref_args, **ref_kwargs)
        if values:
            again_args, again_kwargs = _clone((args, kwargs))
            again = func(*again_args, **again_kwargs)
            if compare(expected, again):
                return result("skipped", "nondeterministic in eager")
    except Exception as exc:  # noqa: BLE001 - a sample eager rejects is not a compiler test
        return result("skipped", f"eager raised {type(exc).__name__}: {exc}")
    compiled = compile_with_plan(call, "default", **overrides)
    cand_args, cand_kwargs = _clone((args, kwargs))
    breaks_before = compat.graph_break_counts()
    try:
        actual = compiled(*cand_args, **cand_kwargs)
    except Exception as exc:  # noqa: BLE001 - any exception here is a compiler crash
        return result("crash", f"{type(exc).__name__}: {exc}")
    finally:
        torch._dynamo.reset()
    problem = _compare_call(expected, actual, (ref_args, ref_kwargs), (cand_args, cand_kwargs), values)
    precision = ""
    if problem and values and dtype in LOW_PRECISION and within_eager_precision(
            func, args, kwargs, (expected, ref_args, ref_kwargs), (actual, cand_args, cand_kwargs)):
        precision = " (as close to a float64 reference as eager)"
        problem = None
    if problem:
        return result("mismatch", problem)
    compilation = compilation_of(compiled)
    kernels = sum(r.kernels for r in compilation.graphs)
    fallbacks = [r.fallback for r in compilation.graphs if r.fallback]
    suffix = precision if values else " (values not compared: random or uninitialized result)"
    if fallbacks:
        return result("eager", f"on_error: eager fallback: {fallbacks[0]}{suffix}", kernels)
    if kernels:
        return result("generated", f"{kernels} kernel(s){suffix}", kernels)
    if compilation.graphs:
        notes = [n["message"] for r in compilation.graphs for n in r.notes if "runs eagerly" in n["message"]]
        return result("extern", (notes[0] if notes else "ATen calls only") + suffix)
    breaks = [reason for reason, count in compat.graph_break_counts().items()
              if count > breaks_before.get(reason, 0)]
    if breaks:
        return result("eager", f"graph break: {breaks[0].splitlines()[0]}{suffix}")
    return result("eager", f"no graph: Dynamo found no tensor operation to compile{suffix}")


def sweep_op(op: Any, *, max_samples: int = 3, low_precision_samples: int = 1,
             overrides: dict | None = None) -> OpResult:
    """Run ``op``'s samples through the default plan (with ``overrides``) and classify the op."""
    start = time.perf_counter()
    key = op_key(op)
    why = exclusion(op)
    if why:
        return OpResult(key, "excluded", why)
    overrides = {"on_error": "eager"} if overrides is None else overrides
    samples: list[SampleResult] = []
    for dtype in sweep_dtypes(op):
        count = low_precision_samples if dtype in LOW_PRECISION else max_samples
        torch.manual_seed(0)
        try:
            inputs = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), count))
        except Exception as exc:  # noqa: BLE001 - OpInfo's own sample generator failed
            samples.append(SampleResult(str(dtype), "skipped", f"sample_inputs raised {type(exc).__name__}"))
            continue
        for sample in inputs:
            try:
                samples.append(run_sample(op, sample, dtype, overrides=overrides))
            except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                samples.append(SampleResult(str(dtype), "crash", _first_line(
                    f"{type(exc).__name__}: {exc} at {traceback.format_exc().splitlines()[-3]}")))
    status, reason = classify(samples)
    return OpResult(key, status, reason, [attrs.asdict(s) for s in samples], time.perf_counter() - start)


def classify(samples: list[SampleResult]) -> tuple[str, str]:
    """The op's class from its samples: the worst outcome wins (crash, mismatch, a sample compiled
    only through the ``on_error: eager`` fallback); then generated over extern over graph breaks."""
    ran = [s for s in samples if s.status != "skipped"]
    for status in ("crash", "mismatch"):
        bad = [s for s in ran if s.status == status]
        if bad:
            return status, f"{bad[0].dtype}: {bad[0].detail}"
    if not ran:
        reasons = sorted({s.detail for s in samples}) or ["no samples"]
        return "excluded", "no sample eager can run: " + reasons[0]
    fallbacks = [s for s in ran if s.detail.startswith("on_error: eager fallback")]
    if fallbacks:       # under on_error: raise this sample would fail: the op is not compiled
        return "eager", f"{fallbacks[0].dtype}: {fallbacks[0].detail}"
    for status in ("generated", "extern", "eager"):
        hits = [s for s in ran if s.status == status]
        if hits:
            return status, hits[0].detail
    raise AssertionError(samples)


# -- the full sweep: worker processes, tables --------------------------------------------------
def _worker(keys: list[str], options: dict, queue: Any) -> None:
    if options["backend"] == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ops = {op_key(op): op for op in load_op_db()}
    overrides = {"on_error": "eager"}
    if options["backend"] == "triton":
        overrides["options"] = {"codegen": {"backend": "triton"}}
    for key in keys:
        queue.put(("start", key))
        result = sweep_op(ops[key], max_samples=options["max_samples"],
                          low_precision_samples=options["low_precision_samples"], overrides=overrides)
        queue.put(("done", attrs.asdict(result)))
    queue.put(("exit", None))


def run_sweep(keys: list[str], options: dict, *, log: Any = print) -> list[dict]:
    """Sweep ``keys`` in a worker process, restarting it (and recording a crash) if it dies."""
    ctx = multiprocessing.get_context("spawn")
    results: dict[str, dict] = {}
    pending = list(keys)
    while pending:
        queue = ctx.Queue()
        worker = ctx.Process(target=_worker, args=(pending, options, queue), daemon=True)
        worker.start()
        current = None
        while True:
            try:
                kind, payload = queue.get(timeout=5)
            except Exception:  # noqa: BLE001 - queue.Empty: check the worker is alive
                if worker.is_alive():
                    continue
                break
            if kind == "start":
                current = payload
            elif kind == "done":
                results[payload["op"]] = payload
                log(f"[{len(results)}/{len(keys)}] {payload['op']}: {payload['status']} "
                    f"({payload['seconds']:.1f} s) {payload['reason'][:120]}")
                current = None
            else:
                break
        worker.join(timeout=30)
        if current is not None and current not in results:
            results[current] = attrs.asdict(OpResult(current, "crash",
                                                     f"the worker process died (exit code {worker.exitcode})"))
            log(f"{current}: crash (worker died, exit code {worker.exitcode})")
        left = [k for k in keys if k not in results]
        if left == pending:
            raise RuntimeError(f"the sweep worker exited (code {worker.exitcode}) before running any op")
        pending = left
    return [results[k] for k in keys]


def summarize(results: list[dict]) -> dict:
    counts = {c: sum(1 for r in results if r["status"] == c) for c in CLASSES}
    total = len(results)
    clean = counts["generated"] + counts["extern"] + counts["eager"]
    in_scope = total - counts["excluded"]
    fallbacks = sum(1 for r in results for s in r.get("samples", [])
                    if s["detail"].startswith("on_error: eager fallback"))
    return {"ops": total, "counts": counts, "in_scope": in_scope,
            "clean_percent_of_in_scope": round(100 * clean / max(in_scope, 1), 2),
            "clean_percent_of_all": round(100 * clean / max(total, 1), 2),
            "on_error_fallback_samples": fallbacks}


def _commit() -> str:
    """The checked-out commit, with ``+dirty`` when the working tree has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "?"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
    return head + ("+dirty" if dirty else "")


def write_tables(results: list[dict], meta: dict, out: Path) -> None:
    summary = summarize(results)
    data = {"meta": meta, "summary": summary, "ops": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    counts = summary["counts"]
    lines = [
        f"# OpInfo sweep: {meta['backend']} backend, {meta['date']}",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit {meta['commit']}, torch {meta['torch']}, {meta['machine']}; {meta['seconds']:.0f} s wall.  ",
        f"Samples per op: up to {meta['max_samples']} in float32 and {meta['low_precision_samples']} each in "
        f"float16/bfloat16 where supported (an op without those runs in its first integer or bool "
        f"dtype, else float64, else complex64); plan `default` with `on_error: eager`{meta['plan_note']}. Ops: {meta['selection']}.",
        "",
        "| class | ops |", "|---|---|",
        *[f"| {c} | {counts[c]} |" for c in CLASSES],
        f"| **total** | {summary['ops']} |",
        "",
        f"In scope (not excluded): {summary['in_scope']}; matched through generated/extern code or fell back "
        f"cleanly with a reason: {summary['clean_percent_of_in_scope']} % of those, "
        f"{summary['clean_percent_of_all']} % of all ops.  ",
        f"Samples that compiled only through the `on_error: eager` fallback: "
        f"{summary['on_error_fallback_samples']} (under `on_error: raise` each would be an error; with none, "
        f"both policies classify every op alike).  ",
        "Random and uninitialized results (`bernoulli`, `dropout`, `empty`...) are compiled and run, "
        "and checked for structure, shape, dtype and device only. A float16/bfloat16 result that "
        "misses the tolerance is accepted when it is as close to a float64 reference as eager's "
        "(noted in the detail).",
        "",
        "| op | class | samples (dtype: class) | reason / detail |", "|---|---|---|---|",
    ]
    for r in results:
        per = ", ".join(f"{s['dtype'].replace('torch.', '')}:{s['status']}" for s in r["samples"])
        reason = r["reason"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{r['op']}` | {r['status']} | {per} | {reason} |")
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/opinfo-cpu.md")
    parser.add_argument("--backend", choices=["cpp", "triton"], default="cpp")
    parser.add_argument("--max-samples", type=int, default=3)
    parser.add_argument("--low-precision-samples", type=int, default=1)
    parser.add_argument("--ops", nargs="*", help="only these ops (name or name.variant)")
    parser.add_argument("--generated-in", type=Path, metavar="JSON",
                        help="only the ops an earlier sweep (its JSON) classed as generated, e.g. the "
                             "Triton sweep over the ops whose groups the C++ sweep compiled")
    args = parser.parse_args(argv)
    if args.backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        print("the triton sweep runs on CPU under the interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    keys = [op_key(op) for op in load_op_db()]
    if args.ops:
        keys = [k for k in keys if k in set(args.ops) or k.split(".")[0] in set(args.ops)]
    if args.generated_in:
        earlier = json.loads(args.generated_in.read_text())["ops"]
        generated = {r["op"] for r in earlier if r["status"] == "generated"}
        keys = [k for k in keys if k in generated]
    options = {"backend": args.backend, "max_samples": args.max_samples,
               "low_precision_samples": args.low_precision_samples}
    start = time.perf_counter()
    results = run_sweep(keys, options)
    meta = {"backend": args.backend, "date": datetime.date.today().isoformat(), "commit": _commit(),
            "torch": torch.__version__, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "seconds": time.perf_counter() - start, "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "max_samples": args.max_samples, "low_precision_samples": args.low_precision_samples,
            "plan_note": ", `codegen: {backend: triton}` under TRITON_INTERPRET=1" if args.backend == "triton" else "",
            "selection": f"the ops {args.generated_in.name} classes as generated" if args.generated_in
            else "every entry of op_db"}
    write_tables(results, meta, args.out)
    summary = summarize(results)
    print(json.dumps(summary))
    return 0 if summary["counts"]["mismatch"] == 0 and summary["counts"]["crash"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
