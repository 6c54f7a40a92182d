"""Symbolic sizes during kernel generation (passes/kernel_ir/symbolic.py): a Dim computes its
expression and its value at the binding, every decision about it is recorded, and the recorded
facts describe exactly the bindings at which the same decisions would be taken."""
from __future__ import annotations

import operator

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.kernel_ir.symbolic import CeilDiv, Decisions, Dim, FloorDiv, SizeClass, render

S0, S1 = sympy.symbols("s0 s1", integer=True, positive=True)


def dims(**values):
    decisions = Decisions({sympy.Symbol(k, integer=True, positive=True): v for k, v in values.items()})
    return decisions, [decisions.dim(sympy.Symbol(k, integer=True, positive=True)) for k in values]


def holds(decisions: Decisions, *values: int) -> bool:
    return decisions.predicate()(*values)


def test_arithmetic_builds_the_expression_and_the_value_at_the_binding():
    decisions, (s0,) = dims(s0=5)
    size = s0 * 768 + 4
    assert isinstance(size, Dim) and size.value == 5 * 768 + 4
    assert sympy.simplify(size.expr - (768 * S0 + 4)) == 0
    assert (s0 - s0) == 0 and isinstance(s0 - s0, int)       # the symbol cancels: a plain int
    assert not decisions.facts


def test_a_comparison_true_for_every_value_records_nothing():
    decisions, (s0,) = dims(s0=5)
    assert s0 * 768 == 768 * s0 and s0 + 1 > s0 and s0 * 4 >= 0
    assert not decisions.facts


def test_a_comparison_that_depends_on_the_sizes_is_recorded_and_bounds_the_class():
    decisions, (s0,) = dims(s0=5)
    assert s0 * 768 < 131072
    assert holds(decisions, 5) and holds(decisions, 170) and not holds(decisions, 171)


def test_using_a_size_as_a_plain_int_specializes_the_class_on_its_value():
    decisions, (s0,) = dims(s0=6)
    assert list(range(s0)) == list(range(6))
    assert holds(decisions, 6) and not holds(decisions, 7)
    assert decisions.exact and "used as a plain int" in decisions.exact[0]


def test_bit_length_records_the_power_of_two_range():
    decisions, (s0,) = dims(s0=100)
    assert (s0 - 1).bit_length() == 7
    assert [v for v in range(1, 300) if holds(decisions, v)] == list(range(65, 129))


def test_truth_and_remainders_are_decisions_too():
    decisions, (s0,) = dims(s0=8)
    assert not (s0 * 3) % 4            # 24 % 4 == 0
    assert [v for v in range(2, 20) if holds(decisions, v)] == [4, 8, 12, 16]


def test_a_ceiling_division_of_a_size_is_spelled_for_python_and_c():
    _, (s0,) = dims(s0=3)
    grid = -(-(s0 * 768) // 4096)
    assert isinstance(grid.expr, CeilDiv)
    function = eval(f"lambda ks0: {render(grid)}")
    assert all(function(v) == -(-(v * 768) // 4096) for v in range(2, 100))
    assert render(grid, "c") == "(((INT64_C(768) * ks0) + INT64_C(4096) - 1) / INT64_C(4096))"


def test_floor_division_and_remainder_evaluate_like_python_at_any_binding():
    _, (s0,) = dims(s0=11)
    cases = [(s0 // 4, lambda v: v // 4), (s0 % 4, lambda v: v % 4), ((s0 * 3) // 2, lambda v: v * 3 // 2),
             (FloorDiv(S0 * 3, 2), lambda v: v * 3 // 2)]
    for size, expected in cases:
        function = eval(f"lambda ks0: {render(size)}")
        assert all(function(v) == expected(v) for v in range(2, 40)), render(size)


def test_an_expression_outside_integer_arithmetic_has_no_spelling():
    with pytest.raises(TypeError, match="no py spelling"):
        render(sympy.sqrt(S0))


def test_maxima_and_minima_are_spelled_for_python_and_c():
    """A stride of a dim that may be empty is ``Max(1, s)``: kernels of such layouts take it as
    an argument like any size."""
    u0, u1 = sympy.symbols("u0 u1", integer=True, nonnegative=True)
    size = sympy.Max(1, u0) * sympy.Min(u1, 5)
    function = eval(f"lambda ku0, ku1: {render(size)}")
    assert all(function(a, b) == max(1, a) * min(b, 5) for a in range(0, 9) for b in range(0, 9))
    assert render(sympy.Max(1, u0), "c") == "(INT64_C(1) > ku0 ? INT64_C(1) : ku0)"


def test_a_size_class_round_trips_as_data_and_gives_layouts_at_any_binding():
    decisions, (s0,) = dims(s0=4)
    assert s0 * 64 < 131072
    size_class = SizeClass(("s0",), tuple(f"{render(e)} {op} 0" for e, op in decisions.facts), (),
                           "(((ks0 * 64, 1),), (((ks0, 64), (64, 1)),), ((ks0 + 3) // 4,))")
    again = SizeClass.from_data(size_class.to_data())
    assert again == size_class
    assert again.fits((2047,)) and not again.fits((2048,))
    assert again.layouts(again.values({"s0": 9})) == (((576, 1),), (((9, 64), (64, 1)),), (3,))


_COMPARISONS = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne]


@settings(max_examples=60, deadline=None)
@given(start=st.integers(2, 300), other=st.integers(2, 300), data=st.data())
def test_the_recorded_facts_imply_every_decision_taken(start, other, data):
    """Random comparisons of random size expressions, decided at one binding: at any other
    binding where the recorded facts hold, every comparison comes out the same."""
    decisions, (s0, s1) = dims(s0=start, s1=start + 7)
    terms = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(-50, 5000),
                                         st.sampled_from(_COMPARISONS), st.integers(1, 9000)), min_size=1, max_size=6))
    taken = []
    for a, b, c, compare, bound in terms:
        size = s0 * a + s1 * b + c
        taken.append(bool(compare(size, bound)) if isinstance(size, Dim) else None)
    values = (other, other + 7)
    if not holds(decisions, *values):
        return
    for (a, b, c, compare, bound), decided in zip(terms, taken):
        if decided is not None:
            assert compare(values[0] * a + values[1] * b + c, bound) == decided
