"""``pipeline demo`` times eager and compiled calls interleaved call by call, prints each
variant's spread, and prints a speed-up only when the per-round ratios agree (a run once showed
eager at 1.11 ms and, in the next run, 10.2 ms: a "13x" speed-up that interleaving showed to be
1.8-1.9x)."""
from __future__ import annotations

import contextlib
import io

import pytest

from pipeline.tools.demo import STABLE_RATIO_SPREAD, Spread, Timing, measure_interleaved, run_demo


def test_eager_and_compiled_calls_alternate_call_by_call_and_swap_order_each_round():
    calls = []
    timing = measure_interleaved(lambda: calls.append("eager"), lambda: calls.append("compiled"), rounds=4)
    assert calls == ["eager", "compiled", "compiled", "eager", "eager", "compiled", "compiled", "eager"]
    assert timing.rounds == 4


def test_a_slowdown_shared_by_both_calls_of_a_round_still_gives_a_stable_ratio():
    eager = [1.0, 1.1, 10.0, 10.4] * 5           # the machine got 10x slower for half the rounds
    compiled = [e / 1.85 for e in eager]
    timing = Timing.of(eager, compiled)
    assert timing.stable
    assert timing.lines()[-1].startswith("speed-up 1.85x (median of the per-round ratios")


def test_ratios_that_disagree_give_no_speed_up_number():
    eager = [1.11] * 10 + [10.2] * 10            # one variant slowed down on its own
    timing = Timing.of(eager, [0.6] * 20)
    assert not timing.stable
    assert timing.lines()[-1].startswith("speed-up not stable: the per-round ratios' quartiles are 1.85x-17.00x")


@pytest.mark.parametrize("spread, stable", [(STABLE_RATIO_SPREAD * 0.99, True), (STABLE_RATIO_SPREAD * 1.01, False)])
def test_stable_means_the_middle_half_of_the_ratios_lies_within_the_bound_of_their_median(spread, stable):
    ratios = [2.0 / spread] * 6 + [2.0] * 8 + [2.0 * spread] * 6     # the quartiles: 2 / spread, 2 * spread
    assert Timing.of(ratios, [1.0] * len(ratios)).stable is stable


def test_spread_lists_min_quartiles_median_and_max():
    assert Spread.of([4.0, 1.0, 3.0, 2.0, 5.0]) == Spread(1.0, 2.0, 3.0, 4.0, 5.0)
    assert Spread.of([1.5]).describe(1) == "min 1.5  q1 1.5  median 1.5  q3 1.5  max 1.5"


def test_demo_prints_both_spreads_and_a_speed_up_line_for_each_model():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_demo(iterations=8) == 0
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("per call, ")] == ["per call, 8 interleaved rounds (ms):"] * 2
    assert len([line for line in lines if line.startswith("  eager     min ")]) == 2
    assert len([line for line in lines if line.startswith("  compiled  min ")]) == 2
    assert len([line for line in lines if line.startswith(("speed-up ", "speed-up not stable: "))]) == 2
