"""``pipeline tune``: the fastest correct plan for one model, found by measuring it.

Starting from base plans (the built-in plans of the model's mode that this device can use, or
one given), the tuner compiles each candidate on the user's real inputs, checks it against eager
(a candidate whose results differ is discarded, with the reason), and times the survivors in
interleaved rounds. From the fastest base it then tries each *tunable* option of the passes that
plan runs, one at a time (coordinate descent): an option is tunable when its pass declares the
values to try (``pipeline.option(..., tune=(...))``, so plugins' passes are tunable too); a value
is kept when it is faster than the best so far in an interleaved A/B run. The search stops when
the time budget is spent. The winner is written as a small plan that ``extends`` its base and
states only the options it changed, with the measured numbers in its description.

Candidates whose final code is the same as one measured already (``reduce-overhead`` on a CPU
is ``default``) are not timed again. Timing: wall time per call (synchronized) and host time per
call (the time to issue it); with ``profile_gpu`` on CUDA, the GPU kernel time per call of the
finalists (torch's profiler).
"""
from __future__ import annotations

import copy
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import attrs
import torch
import yaml

from pipeline.api import compile_with_plan
from pipeline.compilation import compilation_of
from pipeline.errors import PipelineError
from pipeline.numerics import compare
from pipeline.options import tunable, unstructure
from pipeline.plan.schema import load_plan
from pipeline.registry import get_registry

# Built-in plans a tune starts from, per mode; those that do not load here (a plugin removed
# them) are left out, and on a CPU the CUDA-only ones add nothing but compile the same code.
BASES = {"inference": ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", "cpu-inference"),
         "training": ("training", "training-reduce-overhead")}
MARGIN = 0.02       # a change is kept when it is at least this much faster than the best so far
RECOMPILE_LIMIT = 1024   # every trial compiles the same function: Dynamo keeps each one's entry


@attrs.define
class Trial:
    """One candidate plan: what it changes from its base, and how it did."""

    name: str
    base: str
    changes: dict                   # {pass: {option: value}}
    ms: float | None = None         # wall time per call, synchronized
    host_ms: float | None = None    # time to issue one call
    gpu_ms: float | None = None     # GPU kernel time per call (CUDA, with profile_gpu)
    kernels: int | None = None
    compile_s: float | None = None
    verdict: str = ""
    signature: tuple = ()           # the final code of its graphs (equal code: equal speed)
    call: Callable | None = attrs.field(default=None, repr=False)

    def plan(self, capture: str | None = None) -> dict:
        """The plan to compile: the base with the changes; with ``capture`` (the plan's capture
        pass) its recompile limit raised, since every trial compiles the same function."""
        options = copy.deepcopy(self.changes)
        if capture is not None:
            options.setdefault(capture, {})["recompile_limit"] = RECOMPILE_LIMIT
        return {"extends": self.base, "options": options} if options else {"extends": self.base}


@attrs.frozen
class TuneResult:
    """Every trial in order, the winner, eager's time, the written plan (data) and its file."""

    trials: tuple
    winner: Trial
    eager_ms: float
    plan: dict
    path: Path | None

    def table(self) -> str:
        """The trials as a text table: variant, times, kernels, compile time, verdict."""
        rows = [("variant", "ms/call", "host ms", "GPU ms", "kernels", "compile s", "verdict"),
                ("eager", f"{self.eager_ms:.3f}", "-", "-", "-", "-", "reference")]
        for t in self.trials:
            rows.append((t.name, _num(t.ms), _num(t.host_ms), _num(t.gpu_ms), "-" if t.kernels is None else str(t.kernels),
                         _num(t.compile_s, 1), t.verdict + ("  <- chosen" if t is self.winner else "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class Runner:
    """Calls a model the way the tune measures it: inference under no_grad, or a training step
    (forward, a scalar loss of the outputs, backward) whose gradients it returns."""

    def __init__(self, model: Any, inputs: tuple, kwargs: dict, training: bool):
        self.model, self.inputs, self.kwargs, self.training = model, inputs, kwargs, training
        self.device = next((t.device for t in torch.utils._pytree.tree_leaves((inputs, kwargs))
                            if isinstance(t, torch.Tensor)), torch.device("cpu"))

    def __call__(self, fn: Callable) -> Any:
        if not self.training:
            with torch.no_grad():
                return fn(*self.inputs, **self.kwargs)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        out = fn(*self.inputs, **self.kwargs)
        loss = sum(t.float().square().mean() for t in torch.utils._pytree.tree_leaves(out)
                   if isinstance(t, torch.Tensor) and t.is_floating_point())
        loss.backward()
        return [loss.detach(), *[p.grad for p in params]]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def result(self, fn: Callable) -> Any:
        """One call's results, detached and copied (the next call may overwrite them)."""
        return torch.utils._pytree.tree_map(
            lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, self(fn))


def tune(model: Any, *inputs: Any, base: str | None = None, budget: float = 300.0, training: bool = False,
         out: str | Path | None = None, name: str | None = None, rounds: int = 5, profile_gpu: bool = True,
         stream: TextIO | None = None, **kwargs: Any) -> TuneResult:
    """Find the fastest plan that matches eager for ``model`` called with ``inputs`` (and keyword
    ``kwargs``); see the module docstring. ``base``: start from this plan only (a name or path);
    default: every built-in plan of the mode. ``budget``: seconds for the search (bases are tried
    first, in turn, until it is spent; at least one). ``out``: write the winning plan there as YAML. Progress goes to ``stream``
    (standard error by default)."""
    stream = sys.stderr if stream is None else stream
    started = time.perf_counter()
    runner = Runner(model, inputs, kwargs, training)
    name = name or f"tuned-{type(model).__name__.lower()}"
    expected = runner.result(model)
    registry = get_registry()
    mode = "training" if training else "inference"
    bases = [base] if base is not None else [b for b in BASES[mode] if b in registry.plans]
    trials: list[Trial] = []

    def log(message: str) -> None:
        stream.write(f"[tune {len(trials)} tried, {time.perf_counter() - started:.0f} s of {budget:.0f} s] "
                     f"{message}\n")
        stream.flush()

    for plan_name in bases:
        if trials and any(t.call is not None for t in trials) and time.perf_counter() - started > budget:
            log(f"budget spent; base plan(s) not tried: {', '.join(bases[len(trials):])}")
            break
        capture = load_plan(plan_name, registry=registry).passes[0].name
        trial = _try(Trial(plan_name, plan_name, {}), model, runner, expected, trials, capture)
        trials.append(trial)
        log(f"{trial.name}: {trial.verdict}")
    alive = [t for t in trials if t.call is not None]
    if not alive:
        raise PipelineError("pipeline tune: no base plan compiled this model and matched eager: "
                            + "; ".join(f"{t.name}: {t.verdict}" for t in trials))
    distinct = [t for t in alive if not t.verdict.startswith("same code")]
    eager_ms = _measure_all({"eager": model, **{t.name: t.call for t in distinct}}, runner, rounds, trials)["eager"]
    for trial in alive:
        twin = next((t for t in distinct if t.signature == trial.signature), trial)
        trial.ms, trial.host_ms = twin.ms, twin.host_ms
    best = min(alive, key=lambda t: t.ms)
    log(f"best base: {best.name} at {best.ms:.3f} ms (eager {eager_ms:.3f} ms)")
    search = [(p, o, v) for p, o, values, current in _space(best.base, registry) for v in values if v != current]
    for done, (pass_name, option, value) in enumerate(search):
        if time.perf_counter() - started > budget:
            log(f"budget spent; {len(search) - done} change(s) not tried")
            break
        changes = copy.deepcopy(best.changes)
        changes.setdefault(pass_name, {})[option] = value
        label = " + ".join([best.base] + [f"{p}.{o}={_show(v)}" for p, opts in changes.items() for o, v in opts.items()])
        capture = load_plan(best.base, registry=registry).passes[0].name
        trial = _try(Trial(label, best.base, changes), model, runner, expected, trials, capture)
        trials.append(trial)
        if trial.call is not None and trial.ms is None:
            _measure_all({best.name: best.call, trial.name: trial.call}, runner, rounds, trials)
            if trial.ms < best.ms * (1 - MARGIN):
                trial.verdict = f"faster than {best.name} ({best.ms:.3f} ms): kept"
                best = trial
            else:
                trial.verdict = f"not faster than {best.name} ({best.ms:.3f} ms)"
        log(f"{trial.name}: {trial.verdict}")
    if profile_gpu and runner.device.type == "cuda":
        for trial in {id(t): t for t in [best, *[t for t in trials if t.changes == {} and t.call is not None]]}.values():
            trial.gpu_ms = _gpu_ms(trial.call, runner)
    for trial in trials:
        if trial.call is not None and not trial.verdict.startswith(("faster", "not faster", "same code")):
            trial.verdict = "measured"
    plan = _plan_data(best, name, eager_ms, trials, runner.device, bases)
    path = None
    if out is not None:
        path = Path(out)
        path.write_text(yaml.safe_dump(plan, sort_keys=False, width=100))
        load_plan(str(path))        # what was written loads back (a broken plan is an error here)
        log(f"wrote {path}")
    return TuneResult(tuple(trials), best, eager_ms, plan, path)


def _show(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _space(base: str, registry: Any) -> list[tuple[str, str, tuple, Any]]:
    """``(pass, option, values, current value)`` for each tunable option of the passes ``base``
    runs, in plan order."""
    plan = load_plan(base, registry=registry)
    out = []
    for spec in plan.passes:
        cls = registry.passes[spec.name].cls
        current = unstructure(spec.options)
        for option, values in tunable(cls.Options):
            out.append((spec.name, option, values, current.get(option)))
    return out


def _try(trial: Trial, model: Any, runner: Runner, expected: Any, earlier: list[Trial], capture: str) -> Trial:
    """Compile ``trial``'s plan, check its first call against eager, and note its kernels and
    compile time; a failure or a mismatch is its verdict."""
    try:
        compiled = compile_with_plan(model, trial.plan(capture))
        start = time.perf_counter()
        got = runner.result(compiled)
        runner.sync()
        trial.compile_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - any failure discards the candidate, with its reason
        trial.verdict = f"error: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return trial
    problem = compare(expected, got, what="result")
    if problem is not None:
        trial.verdict = f"mismatch: {problem[:200]}"
        return trial
    records = compilation_of(compiled).graphs
    trial.verdict = "matches eager"
    trial.kernels = sum(r.kernels or 0 for r in records)
    trial.signature = tuple(r.final_code for r in records)
    trial.call = compiled
    twin = next((t for t in earlier if t.call is not None and t.signature == trial.signature), None)
    if twin is not None:        # timed once, for both (the base phase copies the times after timing)
        trial.ms, trial.host_ms, trial.verdict = twin.ms, twin.host_ms, f"same code as {twin.name}"
    return trial


def _measure_all(calls: dict, runner: Runner, rounds: int, trials: list[Trial]) -> dict:
    """Time ``calls`` (name -> callable) in interleaved rounds; fills the trials' ms and host ms
    and returns each name's wall ms per call."""
    for fn in calls.values():           # warm: caches, allocator
        runner(fn)
    runner.sync()
    start = time.perf_counter()
    runner(next(iter(calls.values())))
    runner.sync()
    iters = max(3, min(200, int(0.05 / max(time.perf_counter() - start, 1e-6))))
    wall: dict = {name: [] for name in calls}
    host: dict = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            runner.sync()
            begin, issued = time.perf_counter(), 0.0
            for _ in range(iters):
                t = time.perf_counter()
                runner(fn)
                issued += time.perf_counter() - t
            runner.sync()
            wall[name].append((time.perf_counter() - begin) * 1e3 / iters)
            host[name].append(issued * 1e3 / iters)
    medians = {name: statistics.median(v) for name, v in wall.items()}
    for trial in trials:
        if trial.name in calls:
            trial.ms, trial.host_ms = medians[trial.name], statistics.median(host[trial.name])
    return medians


def _gpu_ms(fn: Callable, runner: Runner, calls: int = 5) -> float | None:
    """GPU kernel time per call, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    runner(fn)
    runner.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            runner(fn)
        runner.sync()
    total = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
    return total / 1e3 / calls if total else None


def _plan_data(best: Trial, name: str, eager_ms: float, trials: list[Trial], device: torch.device,
               bases: list[str]) -> dict:
    """The winner as a plan extending its base, with what was measured in its description."""
    base_trial = next(t for t in trials if t.name == best.base)
    tried = sum(1 for t in trials)
    discarded = sum(1 for t in trials if t.call is None)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    text = (f"Chosen by pipeline tune on {datetime.date.today().isoformat()} ({where}): {best.ms:.3f} ms per call "
            f"against {base_trial.ms:.3f} ms for {best.base} and {eager_ms:.3f} ms eager; {tried} variant(s) tried "
            f"from {', '.join(bases)}, {discarded} discarded.")
    plan: dict = {"name": name, "extends": best.base, "description": text}
    if best.changes:
        plan["options"] = best.changes
    return plan


__all__ = ["tune", "TuneResult", "Trial", "BASES"]
