"""Declared shape buckets (``shapes:`` in a plan): the schema loads, round-trips, merges and
fails with located errors; at call time inputs are padded to their buckets and outputs cut back,
warm-up compiles every bucket, and serving within the buckets never recompiles."""
from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import pipeline
from pipeline import PlanError, ShapeError, compilation_of, compile_with_plan, load_plan
from pipeline.numerics import compare
from pipeline.plan.text import diff_plans, resolve_text

SKETCH = {"buckets": {"input_ids": {0: [1, 2, 4, 8, 16], 1: {"multiple_of": 64, "max": 2048, "pad_value": 0}}},
          "warmup": True, "after_warmup": "fail_on_recompile"}


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_error(plan) -> PlanError:
    with pytest.raises(PlanError) as info:
        load_plan(plan)
    return info.value


class TinyDecoder(torch.nn.Module):
    """Embedding, one causal self-attention block honouring an attention mask, and a linear head."""

    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        allowed = causal & attention_mask.bool()[:, None, None, :]
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        return self.head(self.norm(x))


SERVING = {"name": "serve-test", "extends": "default",
           "options": {"capture": {"dynamic": False, "recompile_limit": 2}},
           "shapes": {"axes": {"batch": [1, 2, 4], "seq": {"multiple_of": 16, "max": 64}},
                      "buckets": {"input_ids": {0: "batch", 1: "seq"},
                                  "attention_mask": {0: "batch", 1: {"axis": "seq", "pad_value": 0}}},
                      "outputs": {0: {0: "batch", 1: "seq"}},
                      "warmup": True, "after_warmup": "fail_on_recompile"}}


def request(rng: random.Random, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[rng.randrange(64) for _ in range(length)] for _ in range(batch)])
    return ids, torch.ones(batch, length, dtype=torch.long)


# -- the schema ------------------------------------------------------------------------------------

def test_the_design_sketch_loads_with_an_axis_per_inline_dimension():
    shapes = load_plan({"name": "p", "extends": "default", "shapes": SKETCH}).shapes
    assert shapes.axes["input_ids.0"].buckets() == (1, 2, 4, 8, 16)
    assert shapes.axes["input_ids.1"].buckets() == tuple(range(64, 2049, 64))
    assert shapes.buckets["input_ids"][1].axis == "input_ids.1"
    assert shapes.combinations() == 5 * 32
    assert (shapes.warmup, shapes.after_warmup) == (True, "fail_on_recompile")


def test_an_axis_takes_explicit_sizes_and_multiples_together():
    shapes = load_plan({"name": "p", "extends": "default", "shapes": {
        "axes": {"seq": {"sizes": [1], "multiple_of": 4, "max": 12}}, "buckets": {"x": {0: "seq"}}}}).shapes
    axis = shapes.axes["seq"]
    assert axis.buckets() == (1, 4, 8, 12)
    assert [axis.bucket_for(n) for n in (1, 2, 8, 9, 12, 13)] == [1, 4, 8, 12, 12, None]


@pytest.mark.parametrize("shapes", [SKETCH, SERVING["shapes"]])
def test_resolved_shapes_load_back_equal(tmp_path, shapes):
    plan = load_plan({"name": "p", "extends": "default", "shapes": shapes})
    path = tmp_path / "resolved.yaml"
    path.write_text(resolve_text(plan))
    assert load_plan(path) == plan
    assert load_plan(path).shapes.to_data() == plan.shapes.to_data()


def test_extends_merges_axes_and_buckets_by_name_and_null_removes(tmp_path):
    write(tmp_path, """
        name: parent
        extends: default
        shapes:
          axes: {batch: [1, 2], seq: [8, 16]}
          buckets:
            x: {0: batch, 1: seq}
            y: {0: batch}
          warmup: true
    """, "parent.yaml")
    child = write(tmp_path, """
        name: child
        extends: parent.yaml
        shapes:
          axes: {seq: [32]}
          buckets: {y: null}
          after_warmup: eager_on_recompile
    """, "child.yaml")
    parent, plan = load_plan(tmp_path / "parent.yaml"), load_plan(child)
    assert plan.shapes.axes["batch"].buckets() == (1, 2)
    assert plan.shapes.axes["seq"].buckets() == (32,)
    assert list(plan.shapes.buckets) == ["x"]
    assert (plan.shapes.warmup, plan.shapes.after_warmup) == (True, "eager_on_recompile")
    changes = diff_plans(parent, plan)
    assert "~ shapes.axes.seq.sizes: [8, 16] -> [32]" in changes
    assert "~ shapes.after_warmup: 'default' -> 'eager_on_recompile'" in changes


def test_shapes_null_in_a_child_clears_the_parents_buckets():
    parent = load_plan({"name": "p", "extends": "default", "shapes": SKETCH})
    assert load_plan({"name": "c", "extends": "default", "shapes": None}).shapes == pipeline.ShapeSettings()
    assert load_plan(parent, {"shapes": None}).shapes == pipeline.ShapeSettings()


def test_unknown_shapes_key_is_located_with_a_suggestion(tmp_path):
    path = write(tmp_path, """
        name: p
        extends: default
        shapes:
          warmpu: true
    """)
    exc = load_error(path)
    assert (exc.file, exc.line, exc.key) == (str(path), 4, "shapes.warmpu")
    assert "did you mean 'warmup'?" in str(exc)


def test_a_dimension_naming_an_undeclared_axis_is_located(tmp_path):
    path = write(tmp_path, """
        name: p
        extends: default
        shapes:
          axes: {batch: [1, 2]}
          buckets:
            x: {0: bach}
    """)
    exc = load_error(path)
    assert (exc.line, exc.key) == (6, "shapes.buckets.x.0")
    assert "no axis 'bach'; did you mean 'batch'?" in str(exc)


def test_max_must_be_a_multiple_of_multiple_of(tmp_path):
    path = write(tmp_path, """
        name: p
        extends: default
        shapes:
          buckets:
            x:
              1: {multiple_of: 64, max: 1000}
    """)
    exc = load_error(path)
    assert (exc.line, exc.key) == (6, "shapes.buckets.x.1.max")
    assert "max (1000) must be a multiple of multiple_of (64)" in str(exc)


@pytest.mark.parametrize("shapes, key, fragment", [
    ({"buckets": {"x": {0: [0, 2]}}}, "shapes.buckets.x.0[0]", "integer of 1 or more"),
    ({"buckets": {"x": {-1: [2]}}}, "shapes.buckets.x.-1", "a dimension is an integer of 0 or more"),
    ({"buckets": {"x": {0: {"sizes": [2], "pad_value": "zero"}}}}, "shapes.buckets.x.0.pad_value", "pad_value"),
    ({"buckets": {"x": {0: {"multiple_of": 8}}}}, "shapes.buckets.x.0", "add 'max'"),
    ({"buckets": {"x": {0: [2]}}, "outputs": {0: {0: "seq"}}}, "shapes.outputs.0.0",
     "no input padded along the axis 'seq'"),
    ({"after_warmup": "fail"}, "shapes.after_warmup", "fail_on_recompile"),
    ({"buckets": {"x": {0: {"multiple_of": 1, "max": 20}, 1: {"multiple_of": 1, "max": 20}}}, "warmup": True},
     "shapes.warmup", "warm-up would compile 400 bucket combinations"),
    ({"buckets": {"not a name": {0: [2]}}}, "shapes.buckets.not a name", "not a parameter name"),
])
def test_malformed_shapes_name_the_key(shapes, key, fragment):
    exc = load_error({"name": "p", "extends": "default", "shapes": shapes})
    assert exc.key == key
    assert fragment in str(exc)


# -- serving ---------------------------------------------------------------------------------------

def test_two_hundred_requests_within_the_buckets_never_recompile_after_warmup():
    torch.manual_seed(0)
    model = TinyDecoder().eval()
    compiled = compile_with_plan(model, SERVING)
    rng = random.Random(5)
    with torch.no_grad():
        first = request(rng, 1, 5)
        assert compare(model(*first), compiled(*first)) is None
        comp = compilation_of(compiled)
        assert comp.warmup["combinations"] == 3 * 4
        assert comp.warmup["graphs_compiled"] == 12
        recompiles, graphs = len(comp.recompiles), len(comp.graphs)
        for _ in range(200):
            ids, mask = request(rng, rng.randint(1, 4), rng.randint(1, 64))
            out = compiled(ids, mask)
            assert out.shape == (*ids.shape, 64)
            assert compare(model(ids, mask), out) is None
    assert len(comp.recompiles) == recompiles
    assert len(comp.graphs) == graphs
    assert comp.measurements()["max_recompiles"] == 0


def test_a_length_above_the_largest_bucket_names_input_dimension_size_and_buckets():
    compiled = compile_with_plan(TinyDecoder().eval(), SERVING)
    ids, mask = request(random.Random(0), 1, 65)
    with torch.no_grad(), pytest.raises(ShapeError) as info:
        compiled(ids, mask)
    message = str(info.value)
    for fragment in ("input 'input_ids'", "dimension 1", "size 65", "axis 'seq'", "16, 32, 48, 64"):
        assert fragment in message
    assert compilation_of(compiled).graphs == []   # refused before warm-up compiled anything


def test_padding_uses_the_declared_pad_value_and_positions_index_function_inputs():
    def scale(x, factor):
        return x * factor

    plan = {"name": "p", "extends": "default", "shapes": {"buckets": {0: {0: {"sizes": [4, 8], "pad_value": 7}}}}}
    compiled = compile_with_plan(scale, plan)
    out = compiled(torch.ones(3), torch.tensor(2.0))
    assert out.tolist() == [2.0, 2.0, 2.0, 14.0]   # no outputs declared: returned as computed


def test_outputs_are_cut_back_along_the_declared_axis_only():
    def pair(x):
        return x + 1, x.sum(0, keepdim=True)

    plan = {"name": "p", "extends": "default", "shapes": {
        "axes": {"rows": [4, 8]}, "buckets": {"x": {0: "rows"}}, "outputs": {0: {0: "rows"}}}}
    compiled = compile_with_plan(pair, plan)
    x = torch.randn(5, 3)
    first, total = compiled(x)
    assert compare(x + 1, first) is None
    assert compare(x.sum(0, keepdim=True), total) is None   # padding with 0 does not change a sum


def test_an_output_that_does_not_follow_its_axis_is_an_error():
    def reduce_rows(x):
        return x.sum(0)

    plan = {"name": "p", "extends": "default", "shapes": {
        "axes": {"rows": [4, 8]}, "buckets": {"x": {0: "rows"}}, "outputs": {0: {0: "rows"}}}}
    with pytest.raises(ShapeError, match="output 0 dimension 0 has size 3, but axis 'rows' was padded to 8"):
        compile_with_plan(reduce_rows, plan)(torch.randn(5, 3))


def test_dimensions_sharing_an_axis_must_have_equal_sizes():
    compiled = compile_with_plan(TinyDecoder().eval(), SERVING, shapes={"warmup": False})
    expected = "size 7, but another input's dimension on the same axis 'seq' has size 6"
    with torch.no_grad(), pytest.raises(ShapeError, match=expected):
        compiled(torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 7, dtype=torch.long))


def test_buckets_for_an_input_the_model_does_not_take_are_an_error_unless_ignored():
    plan = {"name": "p", "extends": "default", "shapes": {"buckets": {"tokens": {0: [4]}}}}
    with pytest.raises(ShapeError, match="takes \\(input_ids, attention_mask\\)"):
        compile_with_plan(TinyDecoder(), plan)
    compiled = compile_with_plan(TinyDecoder().eval(), plan, shapes={"unknown_inputs": "ignore"})
    ids = torch.zeros(1, 3, dtype=torch.long)
    with torch.no_grad():
        assert compiled(ids, torch.ones_like(ids)).shape == (1, 3, 64)


def test_explicit_warmup_compiles_every_bucket_ahead_of_the_first_request():
    def double(x):
        return x * 2

    plan = {"name": "p", "extends": "default", "options": {"capture": {"dynamic": False}},
            "shapes": {"buckets": {"x": {0: [2, 4, 8]}}, "outputs": {0: {0: "x.0"}},
                       "after_warmup": "fail_on_recompile"}}
    compiled = compile_with_plan(double, plan)
    record = pipeline.warmup(compiled, torch.randn(3))
    assert (record["combinations"], record["graphs_compiled"]) == (3, 3)
    graphs = len(compilation_of(compiled).graphs)
    for n in (1, 2, 3, 5, 8):
        x = torch.randn(n)
        assert compare(x * 2, compiled(x)) is None
    assert len(compilation_of(compiled).graphs) == graphs


def test_warmup_prints_a_progress_line_per_bucket_with_the_time_left(monkeypatch, capsys):
    monkeypatch.setenv("PIPELINE_PROGRESS", "on")
    monkeypatch.setenv("PIPELINE_PROGRESS_AFTER", "0")

    def double(x):
        return x * 2

    plan = {"name": "p", "extends": "default", "options": {"capture": {"dynamic": False}},
            "shapes": {"buckets": {"x": {0: [2, 4, 8]}}, "outputs": {0: {0: "x.0"}}}}
    pipeline.warmup(compile_with_plan(double, plan), torch.randn(3))
    lines = [line for line in capsys.readouterr().err.splitlines() if "warm-up" in line]
    assert [line.split(" buckets")[0] for line in lines] == [f"pipeline: warm-up {i}/3" for i in (1, 2, 3)]
    assert "(x.0 2)" in lines[0] and "left" in lines[0] and "left" not in lines[-1]


def test_warmup_recompiles_are_not_counted_against_expect_max_recompiles():
    def triple(x):
        return x * 3

    plan = {"name": "p", "extends": "default", "options": {"capture": {"dynamic": False}},
            "expect": {"max_recompiles": 0},
            "shapes": {"buckets": {"x": {0: [2, 4, 8]}}, "outputs": {0: {0: "x.0"}}, "warmup": True}}
    compiled = compile_with_plan(triple, plan)
    assert compare(torch.ones(3) * 3, compiled(torch.ones(3))) is None
    assert len(compilation_of(compiled).recompiles) == 2
    with pytest.raises(pipeline.ExpectationError, match="max_recompiles is 0 but the compile measured 1"):
        compiled(torch.ones(2, 2))   # a new rank is outside the buckets: a real recompile


def test_a_strided_view_of_exactly_a_bucket_size_uses_the_warmed_up_variant():
    def negate(x):
        return -x

    plan = {"name": "p", "extends": "default", "options": {"capture": {"dynamic": False}},
            "shapes": {"buckets": {"x": {0: [4, 8], 1: [4, 8]}}, "outputs": {0: {0: "x.0", 1: "x.1"}},
                       "warmup": True, "after_warmup": "fail_on_recompile"}}
    compiled = compile_with_plan(negate, plan)
    compiled(torch.randn(3, 3))
    base = torch.randn(8, 16)
    view = base[:4, :8]                       # a bucket's shape, but the strides of an (8, 16) tensor
    assert compare(-view, compiled(view)) is None
    assert compilation_of(compiled).warmup["combinations"] == 4


# -- properties ------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3000), st.floats(allow_nan=False),
                     st.sampled_from(["batch", "seq", "x", "x.0", "", "sizes", "max", "axis"]))
_KEYS = st.one_of(st.integers(-2, 3), st.sampled_from(["axes", "buckets", "outputs", "warmup", "sizes",
                                                        "multiple_of", "max", "axis", "pad_value", "x", "batch"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_any_shapes_section_loads_or_is_a_plan_error(shapes):
    try:
        plan = load_plan({"name": "p", "extends": "default", "shapes": shapes})
    except PlanError:
        return
    assert load_plan({"name": "p", "extends": "default", "shapes": plan.shapes.to_data()}) == plan


_AXES = st.dictionaries(st.sampled_from(["batch", "seq", "heads"]), st.one_of(
    st.lists(st.integers(1, 64), min_size=1, max_size=4),
    st.builds(lambda m, k: {"multiple_of": m, "max": m * k}, st.integers(1, 16), st.integers(1, 4))), min_size=1)


@settings(max_examples=100, deadline=None)
@given(_AXES, st.data())
def test_valid_shapes_round_trip_through_resolve(tmp_path_factory, axes, data):
    names = sorted(axes)
    buckets = data.draw(st.dictionaries(st.sampled_from(["x", "y", 0]), st.dictionaries(
        st.integers(0, 2), st.one_of(st.sampled_from(names), st.lists(st.integers(1, 9), min_size=1, max_size=3)),
        min_size=1), min_size=1))
    plan = load_plan({"name": "p", "extends": "default", "shapes": {"axes": axes, "buckets": buckets}})
    path = tmp_path_factory.mktemp("resolved") / "plan.yaml"
    path.write_text(resolve_text(plan))
    assert load_plan(path) == plan


# -- the llm-serving plan ----------------------------------------------------------------------------

ON_CPU = {"target": "cpu", "remove": ["cudagraphs"], "expect": {"cudagraphs": None}}


def test_llm_serving_declares_batch_and_sequence_buckets():
    shapes = load_plan("llm-serving").shapes
    assert shapes.axes["batch"].buckets() == (1, 2, 4, 8, 16)
    assert shapes.axes["seq"].buckets() == (1, 64, 128, 256, 512, 1024, 2048)
    assert {k: {d: b.axis for d, b in dims.items()} for k, dims in shapes.buckets.items()} == {
        "input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    assert shapes.buckets["attention_mask"][1].pad_value == 0
    assert (shapes.warmup, shapes.after_warmup) == (True, "fail_on_recompile")


class DictDecoder(TinyDecoder):
    """The TinyDecoder returning a dict with ``logits``, as Hugging Face models do."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        return {"logits": super().forward(input_ids, attention_mask)}


def test_llm_serving_buckets_pad_hugging_face_inputs_and_cut_logits_back():
    model = DictDecoder().eval()
    small = {"axes": {"batch": [1, 2], "seq": {"sizes": [1], "multiple_of": 8, "max": 16}}}
    compiled = compile_with_plan(model, "llm-serving", shapes=small, **ON_CPU)
    rng = random.Random(1)
    with torch.no_grad():
        for batch, length in ((1, 5), (2, 9), (2, 1), (1, 16)):
            ids, mask = request(rng, batch, length)
            assert compare(model(ids, mask)["logits"], compiled(ids, mask)["logits"]) is None
    assert compilation_of(compiled).warmup["combinations"] == 2 * 3
    assert compilation_of(compiled).measurements()["max_recompiles"] == 0


def test_llm_serving_leaves_a_decode_step_named_otherwise_unpadded_and_locked_after_its_first_call():
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 8)

        def forward(self, ids, pos):
            return self.embed(ids) * (pos + 1)

    model = Step().eval()
    compiled = compile_with_plan(model, "llm-serving", **ON_CPU)
    ids, pos = torch.tensor([[3], [4], [5]]), torch.tensor([2])
    with torch.no_grad():
        assert compare(model(ids, pos), compiled(ids, pos)) is None      # (3, 1): not padded to batch 4
        assert compare(model(ids, pos + 1), compiled(ids, pos + 1)) is None
        with pytest.raises(pipeline.RecompileError, match="size mismatch"):
            compiled(torch.tensor([[3], [4]]), pos)
