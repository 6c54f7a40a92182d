"""What the zoo runner measures of one callable: accuracy against eager (and a float64 reference
when reduced precision is in question), time per call in interleaved rounds, host time per call,
GPU kernel time and launches per call (from the profiler), and peak memory.

Accuracy follows torch's own benchmark harness: a compiled result passes when it is close to
eager's under the dtype's tolerance, or, failing that, when its error against a float64 run of
the same model is at most :data:`MULTIPLIER` times eager's own error against that reference plus
a small floor. Errors are norm-relative (``|a - b| / |b|`` over the whole tensor), since whole
models in bf16 never agree elementwise."""
from __future__ import annotations

import copy
import math
import statistics
import time
from typing import Any, Callable

import torch

MULTIPLIER = 3.0
# Direct comparison with eager: norm-relative error allowed per dtype.
DIRECT = {torch.float32: 1e-4, torch.float64: 1e-9, torch.bfloat16: 1e-2, torch.float16: 2e-3}
# Against the float64 reference: the floor added to MULTIPLIER x eager's own error.
FLOOR = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 1e-3, torch.float16: 5e-4}


def tensors(value: Any) -> list[torch.Tensor]:
    """The floating-point tensors in an output or a gradient list, in order."""
    leaves = torch.utils._pytree.tree_leaves(value)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def relerr(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    """Norm-relative error ``|a - e| / max(|e|, floor)`` (inf when shapes differ or a value is not
    finite where expected's is)."""
    if actual.shape != expected.shape:
        return math.inf
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.equal(torch.isfinite(a), torch.isfinite(e)):
        return math.inf
    finite = torch.isfinite(e)
    a, e = a[finite], e[finite]
    scale = max(float(e.norm()), floor)
    diff = float((a - e).norm())
    return diff / scale if scale > 0 else diff


#: A tensor much smaller than the largest one it comes with (a gradient that is zero in exact
#: arithmetic, such as a key projection's bias under softmax) is compared relative to this share of
#: the largest norm instead of its own, which is rounding noise.
NEGLIGIBLE = 1e-4


def worst(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest :func:`relerr` over paired tensors (inf when the structures differ)."""
    if len(actual) != len(expected):
        return math.inf
    floor = NEGLIGIBLE * max((float(e.detach().double().norm()) for e in expected), default=0.0)
    return max((relerr(a, e, floor) for a, e in zip(actual, expected)), default=0.0)


def judge(actual: list[torch.Tensor], eager: list[torch.Tensor], dtype: torch.dtype,
          reference: Callable[[], list[torch.Tensor]] | None) -> dict:
    """Whether ``actual`` (a variant's tensors) is as accurate as eager's: close to eager directly,
    else (when ``reference`` gives float64 tensors) within MULTIPLIER x eager's own error."""
    direct = worst(actual, eager)
    out = {"error_vs_eager": direct, "passed": direct <= DIRECT.get(dtype, 1e-4)}
    if out["passed"] or reference is None or math.isinf(direct):
        return out
    ref = reference()
    if not ref:
        return out
    mine, theirs = worst(actual, ref), worst(eager, ref)
    bound = MULTIPLIER * theirs + FLOOR.get(dtype, 1e-5)
    out.update(error_vs_fp64=mine, eager_error_vs_fp64=theirs, passed=mine <= bound)
    return out


def to_double(value: Any) -> Any:
    """Floating-point tensors of ``value`` (args, kwargs) as float64; everything else as it is."""
    return torch.utils._pytree.tree_map(
        lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, value)


def double_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of a module (its buffers too), for the reference."""
    return copy.deepcopy(module).double()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


CPU_PAUSE = 0.05     # seconds between variants on the CPU (see interleaved)


def interleaved(calls: dict[str, Callable[[], Any]], device: str, *, rounds: int = 7, iters: int = 10,
                warmup: int = 3) -> dict[str, dict]:
    """Per variant: median and spread of ms per call over ``rounds`` rounds, each round timing
    ``iters`` calls of every variant in turn (the order rotating round by round, and reversed every
    other round, so drift on a noisy host hits all variants alike and no variant always follows
    the same one). CUDA events on the GPU, ``perf_counter`` on the CPU, where each variant's calls
    start after a pause of CPU_PAUSE seconds and one untimed call: the OpenMP threads of the variant
    before (Inductor's kernels, eager's ATen ops, our kernels) spin for a while after their last
    parallel region, and on a host with few cores that spinning would slow down whichever variant
    comes next; the untimed call wakes the timed variant's own threads after the pause."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in round_order(names, round_):
            if not device.startswith("cuda"):
                time.sleep(CPU_PAUSE)
                calls[name]()          # untimed: wakes this variant's own threads after the pause
            samples[name].append(_time_calls(calls[name], device, iters))
    return {name: {"ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s), "rounds": s}
            for name, s in samples.items()}


def round_order(names: list[str], round_: int) -> list[str]:
    """The order variants are timed in during round ``round_``: rotated by one each round and
    reversed every other round, so no variant always follows the same one."""
    order = names[round_ % len(names):] + names[:round_ % len(names)]
    return order[::-1] if round_ % 2 else order


def _time_calls(call: Callable[[], Any], device: str, iters: int) -> float:
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    start_s = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start_s) / iters * 1e3


def host_ms(call: Callable[[], Any], device: str, *, iters: int = 10) -> float | None:
    """Median CPU ms for one call to return, the device idle when it starts (so a full launch
    queue never blocks it): the generated wrapper's and the framework's overhead plus launch
    costs. None on the CPU, where host time is the time per call."""
    if not device.startswith("cuda"):
        return None
    times = []
    for _ in range(iters):
        synchronize(device)
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    synchronize(device)
    return statistics.median(times)


_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch", "cudaLaunchCooperativeKernel",
             "cudaMemcpyAsync", "cudaMemsetAsync", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def profile(call: Callable[[], Any], device: str, *, iters: int = 5) -> dict:
    """GPU kernel ms per call and launches (kernel, graph, copy and memset launches) per call,
    from torch.profiler; empty on the CPU."""
    if not device.startswith("cuda"):
        return {}
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    call()
    synchronize(device)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        synchronize(device)
    kernel_us, launches = 0.0, 0
    for event in prof.events():
        if event.name.startswith(_LAUNCHES):
            launches += 1
        elif getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernel_us += event.time_range.elapsed_us()      # a kernel (or copy) on the device
    return {"gpu_ms": kernel_us / 1e3 / iters, "launches": launches / iters}


def peak_memory(call: Callable[[], Any], device: str) -> int | None:
    """Bytes allocated at the peak of one call (weights and everything else alive included)."""
    if not device.startswith("cuda"):
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats()
    call()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated())


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


__all__ = ["DIRECT", "FLOOR", "MULTIPLIER", "double_copy", "geomean", "host_ms", "interleaved", "judge",
           "peak_memory", "profile", "relerr", "tensors", "to_double", "worst"]
