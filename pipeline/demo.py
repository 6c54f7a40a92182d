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


def run_demo(plan: str = "default", iterations: int = 200) -> int:
    torch.manual_seed(0)
    model = ExampleMLP().eval()
    compiled = compile_with_plan(model, plan)
    x = torch.randn(128, 256)
    with torch.no_grad():
        start = time.perf_counter()
        first = compiled(x)
        first_call = time.perf_counter() - start
        problem = compare(model(x), first)
        fresh = torch.randn(128, 256)
        problem = problem or compare(model(fresh), compiled(fresh))
        for _ in range(10):
            model(x), compiled(x)
        eager_ms = _median_ms(lambda: model(x), iterations)
        compiled_ms = _median_ms(lambda: compiled(x), iterations)
    comp = compilation_of(compiled)
    print(f"model: 8 x Linear(256) MLP, batch 128, float32, CPU, {torch.get_num_threads()} threads")
    print(f"plan:  {comp.plan.name} ({comp.plan.source}): {' -> '.join(comp.plan.pass_names())}")
    print(f"graphs: {comp.summary()['graph_count']}, graph breaks: {len(comp.graph_breaks)}, "
          f"first call (compile + run): {first_call:.2f} s")
    for record in comp.graphs:
        steps = ", ".join(f"{p['pass']} {p['seconds'] * 1e3:.0f} ms" for p in record.passes)
        print(f"  {record.graph_id}: {record.nodes_in} nodes captured; {steps}")
    print(f"correctness vs eager (fp32, fresh random inputs): {'OK' if problem is None else 'MISMATCH: ' + problem}")
    print(f"median per call: eager {eager_ms:.3f} ms, compiled {compiled_ms:.3f} ms, "
          f"speed-up {eager_ms / compiled_ms:.2f}x")
    print(f"kernels generated: {sum(r.kernels for r in comp.graphs)} (matmuls stay extern ATen calls)")
    return 0 if problem is None else 1
