"""``pipeline demo`` / ``make demo``: compile a built-in example model and compare with eager."""
from __future__ import annotations

import statistics
import time

import torch

from .api import compilation_of, compile_with_plan
from .numerics import compare


class ExampleMLP(torch.nn.Module):
    """8 x Linear(256) with ReLU between layers: the example model of the card."""

    def __init__(self, width: int = 256, depth: int = 8):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).relu()


def _median_ms(fn, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class NormBlock(torch.nn.Module):
    """Layer norm, GELU and a residual add: memory-bound work that fusion turns into one kernel."""

    def __init__(self, width: int = 1024):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(x)) + x


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
        eager_ms, compiled_ms = [], []
        for _ in range(5):  # interleaved rounds, so drift on a shared machine hits both alike
            eager_ms.append(_median_ms(lambda: model(x), iterations // 5))
            compiled_ms.append(_median_ms(lambda: compiled(x), iterations // 5))
        eager, ours = statistics.median(eager_ms), statistics.median(compiled_ms)
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
    print(f"median per call: eager {eager:.3f} ms, compiled {ours:.3f} ms, speed-up {eager / ours:.2f}x")
    print()
    return problem is None


def run_demo(plan: str = "default", iterations: int = 200) -> int:
    """``pipeline demo``: compile the example models with ``plan``, check them against eager on
    fresh inputs, print per-pass compile times and the speed of both; 0 when all match."""
    torch.manual_seed(0)
    ok = _demo_one("8 x Linear(256) MLP (launch- and matmul-bound)", ExampleMLP().eval(), (128, 256), plan,
                   iterations)
    ok &= _demo_one("layer norm + GELU + residual (memory-bound, fuses into one kernel)", NormBlock().eval(),
                    (2048, 1024), plan, iterations)
    return 0 if ok else 1
