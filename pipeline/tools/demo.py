"""``pipeline demo`` / ``make demo``: compile a built-in example model and compare with eager.

Timing on a shared machine drifts by far more than the difference being measured. So the demo times
eager and compiled calls interleaved one by one (in rounds that alternate which goes first),
prints each variant's spread, and prints a speed-up only when the per-round ratios agree: a
slowdown that hits both variants of a round cancels in its ratio, and one that does not shows up
as ratios that disagree, reported as such instead of as a number.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import attrs
import torch

from pipeline.api import compilation_of, compile_with_plan
from pipeline.numerics import compare

# The speed-up is stable when the middle half of the per-round ratios lies within this factor
# of their median (either side).
STABLE_RATIO_SPREAD = 1.15


class ExampleMLP(torch.nn.Module):
    """8 x Linear(256) with ReLU between layers: the example model of the card."""

    def __init__(self, width: int = 256, depth: int = 8):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).relu()


class NormBlock(torch.nn.Module):
    """Layer norm, GELU and a residual add: memory-bound work that fusion turns into one kernel."""

    def __init__(self, width: int = 1024):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(x)) + x


@attrs.frozen
class Spread:
    """Quartiles of a list of measurements (milliseconds, or ratios)."""

    low: float
    q1: float
    median: float
    q3: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        """The spread of ``values`` (at least one)."""
        if len(values) == 1:
            return cls(*[values[0]] * 5)
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(min(values), q1, median, q3, max(values))

    def describe(self, digits: int = 3) -> str:
        """``min a  q1 b  median c  q3 d  max e``."""
        return "  ".join(f"{label} {value:.{digits}f}" for label, value in (
            ("min", self.low), ("q1", self.q1), ("median", self.median), ("q3", self.q3), ("max", self.high)))


@attrs.frozen
class Timing:
    """Interleaved timings of eager and compiled calls: each variant's spread per call (ms), the
    spread of the per-round ratios eager / compiled, and whether those ratios agree."""

    eager: Spread
    compiled: Spread
    ratio: Spread
    rounds: int

    @classmethod
    def of(cls, eager_ms: list[float], compiled_ms: list[float]) -> "Timing":
        """From per-round times: ``eager_ms[i]`` and ``compiled_ms[i]`` were measured in round i."""
        if len(eager_ms) != len(compiled_ms) or not eager_ms:
            raise ValueError("need one eager and one compiled time per round, and at least one round")
        ratios = [e / c for e, c in zip(eager_ms, compiled_ms)]
        return cls(Spread.of(eager_ms), Spread.of(compiled_ms), Spread.of(ratios), len(eager_ms))

    @property
    def stable(self) -> bool:
        """True when the middle half of the per-round ratios lies within ``STABLE_RATIO_SPREAD``
        of their median."""
        return (self.ratio.q1 * STABLE_RATIO_SPREAD >= self.ratio.median
                and self.ratio.q3 <= self.ratio.median * STABLE_RATIO_SPREAD)

    def lines(self) -> list[str]:
        """What the demo prints about the timing."""
        out = [f"per call, {self.rounds} interleaved rounds (ms):",
               f"  eager     {self.eager.describe()}",
               f"  compiled  {self.compiled.describe()}"]
        if self.stable:
            out.append(f"speed-up {self.ratio.median:.2f}x (median of the per-round ratios; their quartiles "
                       f"{self.ratio.q1:.2f}x-{self.ratio.q3:.2f}x)")
        else:
            out.append(f"speed-up not stable: the per-round ratios' quartiles are {self.ratio.q1:.2f}x-"
                       f"{self.ratio.q3:.2f}x (median {self.ratio.median:.2f}x), more than "
                       f"{STABLE_RATIO_SPREAD:.2f}x from the median (a busy or noisy machine): rerun with "
                       f"nothing else running")
        return out


def measure_interleaved(eager: Callable[[], object], compiled: Callable[[], object], rounds: int) -> Timing:
    """Time ``rounds`` rounds of one eager call and one compiled call each; even rounds call eager
    first, odd rounds compiled first, so neither variant always runs on a cache the other warmed."""
    eager_ms, compiled_ms = [], []
    for index in range(rounds):
        order = ((eager, eager_ms), (compiled, compiled_ms))
        for fn, into in (order if index % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            fn()
            into.append((time.perf_counter() - start) * 1e3)
    return Timing.of(eager_ms, compiled_ms)


def _demo_one(title: str, model: torch.nn.Module, shape: tuple, plan: str, iterations: int) -> bool:
    compiled = compile_with_plan(model, plan)
    x = torch.randn(*shape)
    with torch.no_grad():
        start = time.perf_counter()
        first = compiled(x)
        first_call = time.perf_counter() - start
        problem = compare(model(x), first)
        fresh = torch.randn(*shape)
        problem = problem or compare(model(fresh), compiled(fresh))
        for _ in range(10):
            model(x), compiled(x)
        timing = measure_interleaved(lambda: model(x), lambda: compiled(x), max(iterations, 1))
    comp = compilation_of(compiled)
    print(f"== {title}, input {list(shape)} float32, CPU, {torch.get_num_threads()} threads")
    print(f"plan:  {comp.plan.name} ({comp.plan.source}): {' -> '.join(comp.plan.pass_names())}")
    print(f"graphs: {comp.summary()['graph_count']}, graph breaks: {len(comp.graph_breaks)}, "
          f"first call (compile + run): {first_call:.2f} s")
    for record in comp.graphs:
        steps = ", ".join(f"{p['pass']} {p['seconds'] * 1e3:.0f} ms" for p in record.passes)
        print(f"  {record.graph_id}: {record.nodes_in} nodes captured; {steps}")
    print(f"kernels generated: {sum(r.kernels for r in comp.graphs)} (matmuls stay extern ATen calls)")
    print(f"correctness vs eager (fresh random inputs): {'OK' if problem is None else 'MISMATCH: ' + problem}")
    print("\n".join(timing.lines()))
    print()
    return problem is None


def run_demo(plan: str = "default", iterations: int = 200) -> int:
    """``pipeline demo``: compile the example models with ``plan``, check them against eager on
    fresh inputs, print per-pass compile times and both variants' timings (``iterations``
    interleaved rounds); 0 when all match."""
    torch.manual_seed(0)
    ok = _demo_one("8 x Linear(256) MLP (launch- and matmul-bound)", ExampleMLP().eval(), (128, 256), plan,
                   iterations)
    ok &= _demo_one("layer norm + GELU + residual (memory-bound, fuses into one kernel)", NormBlock().eval(),
                    (2048, 1024), plan, iterations)
    return 0 if ok else 1
