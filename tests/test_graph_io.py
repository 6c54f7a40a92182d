"""Reproducer graphs as data: any graph of the supported op set, as captured or after fusion,
writes to JSON (+ tensor constants) and loads back to a graph that computes the same thing."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from pipeline.cache.graph_io import UnsupportedGraph, data_to_graph, graph_to_data
from pipeline.testing import FLOAT_DTYPES, graphs
from pipeline.testing.assertions import prelude_for, run_passes
from pipeline.verification import run_and_compare
from pipeline import get_registry

FAST = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def round_trip(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    data, constants = graph_to_data(gm)
    return data_to_graph(json.loads(json.dumps(data)), constants)


@FAST
@given(graphs(dtypes=FLOAT_DTYPES + (torch.int32,), mutation=True, max_ops=10))
def test_captured_graphs_round_trip_and_compute_the_same(case):
    loaded = round_trip(case.gm)
    assert [n.name for n in loaded.graph.nodes] == [n.name for n in case.gm.graph.nodes]
    assert run_and_compare(case.gm, loaded, case.make_inputs()) is None


@FAST
@given(graphs(max_ops=8))
def test_fused_graphs_round_trip_with_their_groups(case):
    registry = get_registry()
    fuse = registry.passes["fuse"].cls()
    inputs = case.make_inputs()
    tags: set = {"captured"}
    before = run_passes(prelude_for(fuse, registry), case.gm, inputs, registry=registry, tags=tags)
    fused = run_passes([fuse], before, inputs, registry=registry, tags=tags)
    loaded = round_trip(fused)
    assert loaded.code == fused.code
    assert run_and_compare(fused, loaded, inputs) is None


def test_stack_traces_round_trip_each_stored_once():
    """A graph from the compile cache still names the user's lines in reports and profiles."""
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() + 1).cos())
    ops = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    for node in ops:
        node.meta["stack_trace"] = 'File "model.py", line 3, in forward\n    return (x.sin() + 1).cos()'
    data, _ = graph_to_data(gm)
    assert len(data["traces"]) == 1
    loaded = round_trip(gm)
    assert [n.meta.get("stack_trace") for n in loaded.graph.nodes] == [n.meta.get("stack_trace") for n in gm.graph.nodes]


def test_graph_constants_are_saved_apart_from_the_graph():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(3, 2))
    data, constants = graph_to_data(gm)
    assert set(constants) == {"weight", "bias"}
    assert "weight" not in json.dumps(data).replace('"weight"', "")


def test_a_graph_calling_an_unnamed_object_is_refused_naming_the_node():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(lambda v: v, (x,)))
    with pytest.raises(UnsupportedGraph, match=r"node \S+ calls <function .*>, which cannot be looked up by name"):
        graph_to_data(torch.fx.GraphModule(torch.nn.Module(), graph))
