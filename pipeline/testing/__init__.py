"""Public testing helpers: random FX graphs (hypothesis strategies) and assertions that a pass or a
plan preserves semantics against eager PyTorch. Plugin authors fuzz their own passes with these::

    from hypothesis import given
    from pipeline.testing import graphs, assert_preserves_semantics

    @given(graphs(max_ops=10))
    def test_my_rewrite_preserves_semantics(case):
        assert_preserves_semantics(MyRewrite, case)
"""
from pipeline.numerics import TOLERANCES, compare, tolerance
from pipeline.testing.assertions import SemanticsError, assert_preserves_semantics, prelude_for, run_passes, tags_of
from pipeline.testing.strategies import FLOAT_DTYPES, GraphCase, TensorSpec, graphs
from pipeline.testing.training import assert_gradients_match, gradient_inputs, loss_and_gradients

__all__ = ["graphs", "GraphCase", "TensorSpec", "FLOAT_DTYPES", "assert_preserves_semantics",
           "SemanticsError", "prelude_for", "run_passes", "tags_of", "compare", "tolerance", "TOLERANCES",
           "assert_gradients_match", "gradient_inputs", "loss_and_gradients"]
