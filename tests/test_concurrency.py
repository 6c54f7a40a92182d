"""Compiling and training from several threads at once: each thread's forward and backward graphs
compile (the backward lazily, outside Dynamo) without disturbing another thread's tracing, and
every step matches the same step run eagerly. Processes sharing one cache: tests/test_cache.py."""
from __future__ import annotations

import copy
import threading

import pytest
import torch

from pipeline import compile_with_plan


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


def _steps(model: torch.nn.Module, run, inputs: list) -> list[torch.Tensor]:
    """Losses of SGD steps on ``inputs``, calling the model through ``run``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x in inputs:
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("plan", ["training", "default"])
def test_threads_training_their_own_compiled_models_match_eager(plan):
    threads, seeds = 4, range(4)
    generator = torch.Generator().manual_seed(1)
    inputs = {s: [torch.randn(8 + step % 3, 16, generator=generator) for step in range(5)] for s in seeds}
    models = {seed: _model(seed) for seed in seeds}          # torch's RNG is process-wide: seed here
    expected = {}
    for seed in seeds:
        reference = copy.deepcopy(models[seed])
        expected[seed] = _steps(reference, reference, inputs[seed])
    results: dict = {}
    errors: list = []
    barrier = threading.Barrier(threads)

    def train(seed: int) -> None:
        try:
            model = models[seed]
            compiled = compile_with_plan(model, plan)
            barrier.wait()                       # every thread compiles at the same moment
            results[seed] = _steps(model, compiled, inputs[seed])
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=train, args=(seed,)) for seed in seeds]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not errors, errors
    for seed in seeds:
        torch.testing.assert_close(torch.stack(results[seed]), torch.stack(expected[seed]), rtol=1e-4, atol=1e-5)


class Indexed(torch.nn.Module):
    """Every new value of ``n`` is a new variant: Dynamo guards on the list index."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.table = [float(i) for i in range(64)]

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return self.linear(x) * self.table[n]


def test_threads_calling_one_model_past_its_limit_follow_the_plans_error_policy():
    import warnings

    import pipeline
    model = Indexed()
    compiled = compile_with_plan(model, "default", options={"capture": {
        "recompile_limit": 2, "on_recompile_limit": "error"}})
    outcomes: list = []

    def call(n: int) -> None:
        x = torch.randn(3, 8)
        try:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x, n), model(x, n))
            outcomes.append("ok")
        except pipeline.RecompileError:
            outcomes.append("refused")
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            outcomes.append(f"{type(exc).__name__}: {exc}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        workers = [threading.Thread(target=call, args=(n,)) for n in range(24)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=300)
    assert set(outcomes) <= {"ok", "refused"}, outcomes
    assert "refused" in outcomes
    assert not [w for w in caught if "recompile limit" in str(w.message)], [str(w.message) for w in caught]
