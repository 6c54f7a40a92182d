"""The zoo runner, modelled on torch's own benchmark harness: for each model and variant (eager,
Inductor default and ``reduce-overhead``, our ``default`` and ``reduce-overhead`` plans; for
training rows eager, Inductor and our ``training`` plans), it checks accuracy against eager, times
the variants interleaved round by round in one process, and records host time, GPU kernel time
and launches per call, cold compile time (and warm, from a second process with the caches kept)
and peak memory.

    python benchmarks/zoo/runner.py --device cuda --out "$OUT" [--family decoder] [--models gpt2,bert]
        [--size full|small] [--mode inference|training|both] [--jobs 4] [--warm] [--accuracy-only]
    pipeline bench --zoo [--family F] [--models a,b] [--device cuda] [...]

``--variants ours-default@PLAN`` (a plan's name or YAML path) adds that plan, judged against the
Inductor variant of ``ours-default``'s mode, to the same interleaved rounds: an option is measured
against the built-in plans in one run.

Each model runs in its own process (a crash or an out-of-memory error costs that model only, and
peak memory is its own); ``--jobs`` runs several at once, with a file lock so that only one of
them times at a time while the others compile. Results: ``zoo-<device>.json`` (every number),
``zoo-<device>.md`` (per-family summary and the per-model table) and ``zoo-<device>.png`` (speed-up
per model, ours against Inductor) under ``--out``; a progress line per model on stderr.

Training rows run a step as users write it: the compiled model's forward under bf16 autocast on
CUDA (float32 on the CPU), the loss, ``backward()``, then ``AdamW.step()`` outside the compiled
region. Dropout is turned off in training rows (its random masks would make losses incomparable);
batch norm runs in training mode, updating its running statistics as eager does."""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import fcntl
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import zoo  # noqa: E402
from zoo import measure  # noqa: E402
from zoo.variants import INFERENCE, TRAINING, Variant, variant  # noqa: E402


def _run(call: Callable, args: tuple, kwargs: dict) -> Any:
    return call(*args, **kwargs)


def _clone(value: Any) -> Any:
    return torch.utils._pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value)


def no_dropout(module: torch.nn.Module) -> None:
    """Turn off every dropout of a module: ``nn.Dropout`` layers and the float dropout
    probabilities Hugging Face attention layers keep as attributes."""
    for sub in module.modules():
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd):
            sub.p = 0.0
        for name, value in list(vars(sub).items()):
            if "dropout" in name.lower() and isinstance(value, float):
                setattr(sub, name, 0.0)


class TimingLock:
    """Only one model process times at a time (the others keep compiling); a no-op without a path."""

    def __init__(self, path: str | None):
        self.path = path
        self._file: Any = None

    def __enter__(self) -> None:
        if self.path:
            self._file = open(self.path, "a")
            fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:600]}"


# -- one model ------------------------------------------------------------------------------------
def run_model(model: zoo.ZooModel, *, mode: str, device: str, size: str, variants: list[Variant],
              cache_dir: Path, rounds: int = 7, iters: int = 10, lock: str | None = None,
              timing: bool = True) -> dict:
    """Build ``model``, compile it with every variant, check each against eager and (``timing``)
    measure them; returns the model's record (plain data)."""
    record: dict = {"model": model.name, "family": model.family, "mode": mode, "device": device, "size": size,
                    "note": model.note, "variants": {}}
    missing = model.missing()
    if missing:
        record["skipped"] = missing
        return record
    training = mode == "training"
    dtype = torch.bfloat16 if device.startswith("cuda") and not training else torch.float32
    record["dtype"] = str(dtype).replace("torch.", "") + (" + bf16 autocast" if training and device != "cpu" else "")
    torch.manual_seed(0)
    try:
        built = model.build(device, dtype, size)
    except Exception as exc:  # noqa: BLE001 - reported as the model's error
        record["error"] = f"build: {_error(exc)}"
        return record
    base = built.module
    if training:
        no_dropout(base)
        base.train()
    args, kwargs = built.inputs(seed=0)
    check_args, check_kwargs = built.inputs(seed=1)
    runners: dict[str, Callable[[], Any]] = {}
    eager_check: Any = None
    for variant in variants:
        entry: dict = {}
        record["variants"][variant.name] = entry
        target = copy.deepcopy(base) if training and variant.kind != "eager" else base
        try:
            before = variant.snapshot()
            compiled = variant.make(target, cache_dir / variant.name.replace("/", "_"), model.name)
            step = _Step(compiled, target, built.loss, device, variant, args, kwargs) if training else None
            call = step if training else (lambda c=compiled: _run(c, args, kwargs))
            start = time.perf_counter()
            with torch.no_grad() if not training else contextlib.nullcontext():
                _check_call(compiled, step, check_args, check_kwargs)     # first call: compiles
            measure.synchronize(device)
            entry["cold_s"] = round(time.perf_counter() - start, 3)
            # The checked call runs in the grad mode of the timed ones: the graph judged is the one timed.
            with torch.no_grad() if not training else contextlib.nullcontext():
                result = _check_call(compiled, step, check_args, check_kwargs, keep=True)
            if variant.kind == "eager":
                eager_check = result
                entry["status"] = "pass"
            else:
                entry.update(_accuracy(result, eager_check, dtype, base, built, training, check_args,
                                       check_kwargs, device))
                fallback = variant.ran_compiled(compiled, before)
                if fallback and entry["status"] == "pass":
                    entry["status"], entry["error"] = "fallback", fallback
                entry.update(variant.details(compiled))
            runners[variant.name] = call if training else _no_grad(call)
        except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, the rest go on
            entry.update(status="error", error=_error(exc), traceback=traceback.format_exc()[-3000:])
            if variant.kind == "eager":
                record["error"] = f"eager: {entry['error']}"
                return record
    if timing and runners:
        with TimingLock(lock):
            _time(record, runners, device, rounds=rounds, iters=iters)
    return record


def _no_grad(call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return call()
    return run


class _Step:
    """A training step of ``compiled`` (whose parameters are ``module``'s): forward under bf16
    autocast on CUDA, loss, backward, then (``update``) an AdamW step outside the compiled region.
    Called without inputs it steps on the timing inputs."""

    def __init__(self, compiled: Callable, module: torch.nn.Module, loss_of: Callable, device: str,
                 variant: Variant, args: tuple, kwargs: dict):
        self.compiled, self.module, self.loss_of, self.variant = compiled, module, loss_of, variant
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
        self.autocast = device.startswith("cuda")
        self.args, self.kwargs = args, kwargs

    def __call__(self, args: tuple | None = None, kwargs: dict | None = None, *, update: bool = True) -> Any:
        if self.variant.step_begin is not None:
            self.variant.step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
            out = self.compiled(*(self.args if args is None else args), **(self.kwargs if kwargs is None else kwargs))
        loss = self.loss_of(out)
        loss.backward()
        if update:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss



def _check_call(compiled: Callable, step: Callable | None, args: tuple, kwargs: dict, *, keep: bool = False) -> Any:
    """One call on the check inputs; with ``keep``, what accuracy compares: the output, or for a
    training step the loss and every parameter's gradient (before any optimizer step)."""
    if step is None:
        out = compiled(*args, **kwargs)
        return measure.tensors(_clone(out)) if keep else None
    module = step.module
    for p in module.parameters():
        p.grad = None
    loss = step(args, kwargs, update=False)
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    return [loss.detach().clone().reshape(1), *grads] if keep else None


def _accuracy(result: list, eager: list, dtype: torch.dtype, base: torch.nn.Module, built: zoo.Built,
              training: bool, args: tuple, kwargs: dict, device: str) -> dict:
    def reference() -> list[torch.Tensor]:
        double = measure.double_copy(base)
        d_args, d_kwargs = measure.to_double((args, kwargs))
        if not training:
            with torch.no_grad():
                return measure.tensors(double(*d_args, **d_kwargs))
        loss = built.loss(double(*d_args, **d_kwargs)).double()
        loss.backward()
        return [loss.detach().reshape(1), *[p.grad if p.grad is not None else torch.zeros_like(p)
                                            for p in double.parameters()]]

    reduced = dtype in (torch.bfloat16, torch.float16) or (training and device.startswith("cuda"))
    judged = measure.judge(result, eager, torch.bfloat16 if reduced else dtype, reference)
    judged["status"] = "pass" if judged["passed"] else "fail"
    if not judged["passed"]:
        judged["error"] = (f"accuracy: error {judged['error_vs_eager']:.3g} against eager"
                           + (f", {judged['error_vs_fp64']:.3g} against float64 (eager's own "
                              f"{judged['eager_error_vs_fp64']:.3g})" if "error_vs_fp64" in judged else ""))
    del judged["passed"]
    return judged


def _time(record: dict, runners: dict[str, Callable[[], Any]], device: str, *, rounds: int, iters: int) -> None:
    timed = measure.interleaved(runners, device, rounds=rounds, iters=iters)
    for name, call in runners.items():
        entry = record["variants"][name]
        entry.update({k: round(v, 5) if isinstance(v, float) else v for k, v in timed[name].items() if k != "rounds"})
        entry["round_ms"] = [round(v, 5) for v in timed[name]["rounds"]]
        try:
            entry["host_ms"] = measure.host_ms(call, device)
            entry.update(measure.profile(call, device))
            entry["peak_bytes"] = measure.peak_memory(call, device)
        except Exception as exc:  # noqa: BLE001 - a profiler problem leaves the timing standing
            entry["profile_error"] = _error(exc)


# -- the whole zoo --------------------------------------------------------------------------------
def _child(args: argparse.Namespace) -> int:
    zoo.load()
    model = zoo.MODELS[args.one]
    names = (TRAINING if args.one_mode == "training" else INFERENCE)["cuda" if args.device.startswith("cuda") else "cpu"]
    if args.variants:
        asked = args.variants.split(",")
        names = [n for n in names if n in asked] + [n for n in asked if "@" in n]
    record = run_model(model, mode=args.one_mode, device=args.device, size=args.size,
                       variants=[variant(n) for n in names], cache_dir=Path(args.cache_dir),
                       rounds=args.rounds, iters=args.iters, lock=args.lock, timing=not args.accuracy_only)
    Path(args.result).write_text(json.dumps(record, default=str))
    return 0


def _tasks(args: argparse.Namespace) -> list[tuple[zoo.ZooModel, str]]:
    families = [f for f in args.family.split(",") if f] or None
    names = [m for m in args.models.split(",") if m] or None
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    tasks = []
    for model in zoo.select(families=families, names=names, device=device):
        if args.mode in ("inference", "both"):
            tasks.append((model, "inference"))
        if args.mode in ("training", "both") and model.train:
            tasks.append((model, "training"))
    return tasks


def _spawn(model: zoo.ZooModel, mode: str, args: argparse.Namespace, work: Path, *, warm: bool = False) -> tuple:
    result = work / f"{model.name}-{mode}{'-warm' if warm else ''}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", model.name, "--one-mode", mode,
           "--device", args.device, "--size", args.size, "--result", str(result),
           "--cache-dir", str(work / "cache" / f"{model.name}-{mode}"), "--rounds", str(args.rounds),
           "--iters", str(args.iters), "--lock", str(work / "timing.lock")]
    if args.variants:
        cmd += ["--variants", args.variants]
    if args.accuracy_only or warm:
        cmd.append("--accuracy-only")
    log = open(work / f"{model.name}-{mode}{'-warm' if warm else ''}.log", "w")
    env = dict(os.environ)
    if args.jobs > 1:      # several compiles at once: each gets a share of the cores
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) // args.jobs)))
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), result, log


def run_zoo(args: argparse.Namespace, written: Callable[[dict], None] = lambda result: None) -> dict:
    """Every selected model in its own process, ``--jobs`` at a time; returns the whole result.
    ``written`` gets the result so far after each model (so a run stopped early keeps what it
    measured). Models are started taking the families in turn (:func:`_interleaved`); a model
    that ran out of device memory beside other model processes runs again next, alone. With
    ``--budget``, no model starts after that many seconds, and models still running at the budget
    plus ``--grace`` seconds are stopped and reported as unfinished."""
    tasks = _tasks(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    pending = list(tasks)
    running: list[tuple] = []
    started = time.perf_counter()
    done = 0

    def finish(item: tuple) -> None:
        nonlocal done
        (model, mode, warm, _), (process, path, log), t0 = item
        log.close()
        if path.exists():
            record = json.loads(path.read_text())
        else:
            tail = (work / f"{model.name}-{mode}{'-warm' if warm else ''}.log").read_text()[-1500:]
            record = {"model": model.name, "family": model.family, "mode": mode, "variants": {},
                      "error": f"the model's process exited with {process.returncode}: {tail}"}
        if warm:
            first = next((r for r in records if r["model"] == model.name and r["mode"] == mode), None)
            for name, entry in record.get("variants", {}).items():
                if first is not None and name in first["variants"] and "cold_s" in entry:
                    first["variants"][name]["warm_s"] = entry["cold_s"]
            return
        records.append(record)
        done += 1
        _progress(record, done, len(tasks), time.perf_counter() - started, time.perf_counter() - t0)

    def result() -> dict:
        return {"device": _device_name(args.device), "date": datetime.date.today().isoformat(),
                "commit": _commit(), "torch": torch.__version__, "size": args.size, "jobs": args.jobs,
                "rounds": args.rounds, "iters": args.iters, "records": records}

    queue = [(m, mode, False, False) for m, mode in _interleaved(pending)]   # (model, mode, warm, alone)
    retried: set[tuple[str, str]] = set()
    first_attempts: dict[tuple[str, str], dict] = {}    # kept until the retry alone replaces them
    while queue or running:
        elapsed = time.perf_counter() - started
        if args.budget and elapsed > args.budget:
            spent = f"the run's budget of {args.budget:.0f} s was spent"
            for model, mode, warm, _ in queue:
                if warm:
                    continue
                first = first_attempts.get((model.name, mode))
                if first is not None:       # what ran beside other processes, rather than nothing
                    records.append(dict(first, note=f"first attempt, beside other model processes (a variant "
                                                    f"ran out of device memory); not run again alone: {spent}"))
                else:
                    records.append({"model": model.name, "family": model.family, "mode": mode, "variants": {},
                                    "skipped": f"not started: {spent}"})
            queue = []
        # A retry alone waits for the running processes and runs with none beside it.
        while queue and len(running) < args.jobs and not any(item[0][3] for item in running):
            if queue[0][3] and running:
                break
            task = queue.pop(0)
            model, mode, warm, alone = task
            running.append((task, _spawn(model, mode, args, work, warm=warm), time.perf_counter()))
            if alone:
                break
        for item in list(running):
            process = item[1][0]
            if process.poll() is None and args.budget and elapsed > args.budget + args.grace:
                process.kill()
                process.wait()
            if process.poll() is not None:
                running.remove(item)
                finish(item)
                model, mode, warm, alone = item[0]
                record = records[-1] if records and not warm else None
                again = (record is not None and record["model"] == model.name and args.jobs > 1 and not alone
                         and _out_of_memory(record) and (model.name, mode) not in retried)
                if again:       # out of device memory beside other model processes: run again alone, next
                    retried.add((model.name, mode))
                    first_attempts[(model.name, mode)] = records.pop()
                    done -= 1
                    queue.insert(0, (model, mode, False, True))
                written(result())
                if args.warm and not warm and not again:
                    queue.append((model, mode, True, False))
        time.sleep(0.2)
    return result()


def _interleaved(tasks: list) -> list:
    """``tasks`` taking the families in turn (each family's models in their order): the large
    models of one family (the decoders) do not all run at once and exhaust the device's memory."""
    by_family: dict = {}
    for task in tasks:
        by_family.setdefault(task[0].family, []).append(task)
    out = []
    while any(by_family.values()):
        for family in by_family.values():
            if family:
                out.append(family.pop(0))
    return out


def _out_of_memory(record: dict) -> bool:
    """Whether a model (or one of its variants) ran out of device memory."""
    texts = [record.get("error") or ""] + [v.get("error") or "" for v in record.get("variants", {}).values()]
    return any("OutOfMemoryError" in text or "out of memory" in text for text in texts)


def _progress(record: dict, done: int, total: int, elapsed: float, seconds: float) -> None:
    variants = record.get("variants", {})
    eager = variants.get("eager", {}).get("ms")
    parts = []
    for name, entry in variants.items():
        if name == "eager":
            continue
        status = entry.get("status", "?")
        speed = f" {eager / entry['ms']:.2f}x" if eager and entry.get("ms") else ""
        parts.append(f"{name} {status}{speed}")
    what = record.get("skipped") and f"skipped: {record['skipped']}" or record.get("error") or ", ".join(parts)
    left = elapsed / done * (total - done)
    sys.stderr.write(f"[zoo {done}/{total}, {elapsed:.0f} s, ~{left:.0f} s left] {record['model']} "
                     f"({record['mode']}, {seconds:.0f} s): {what}\n")
    sys.stderr.flush()


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _commit() -> str:
    from record import commit       # PIPELINE_COMMIT names the tree on a machine whose copy has an older history
    try:
        return commit()
    except OSError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--family", default="", help="comma-separated families (default: all)")
    parser.add_argument("--models", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--size", choices=["full", "small"], default=None,
                        help="full (timing sizes; default on CUDA) or small (default on the CPU)")
    parser.add_argument("--mode", choices=["inference", "training", "both"], default="both")
    parser.add_argument("--variants", default="", help="only these variants (comma-separated; eager always runs); "
                        "<ours variant>@<plan> adds a plan judged in that variant's mode")
    parser.add_argument("--jobs", type=int, default=1, help="models compiled at once (one times at a time)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warm", action="store_true", help="also time a warm compile in a second process")
    parser.add_argument("--accuracy-only", action="store_true")
    parser.add_argument("--work", default=None, help="folder for logs, caches and per-model results")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds after which no model starts (0: no limit)")
    parser.add_argument("--grace", type=float, default=60.0,
                        help="with --budget: seconds more before models still running are stopped")
    parser.add_argument("--name", default=None, help="file stem of the results (default zoo-<device>)")
    for hidden in ("--one", "--one-mode", "--result", "--cache-dir", "--lock"):
        parser.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.size is None:
        args.size = "full" if args.device.startswith("cuda") else "small"
    if args.variants and "eager" not in args.variants.split(","):
        args.variants = "eager," + args.variants
    for name in filter(None, args.variants.split(",")):
        try:
            variant(name)
        except KeyError as exc:
            parser.error(str(exc.args[0]))
    if args.one:
        return _child(args)
    from zoo.summary import write_results
    stem = args.name or f"zoo-{'cuda' if args.device.startswith('cuda') else 'cpu'}"
    result = run_zoo(args, written=lambda so_far: write_results(so_far, Path(args.out), stem))
    for path in write_results(result, Path(args.out), stem):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
