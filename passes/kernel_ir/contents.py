"""What a compiled graph calls: generated kernels (with their source), fused groups left to run
eagerly, and extern operator calls. Read from the final graph of every compile for the compile
report, ``explain`` and the ``codegen``/``fusion`` logs; it knows the shared
:class:`~passes.kernel_ir.groups.FusedGroup` / :class:`~passes.kernel_ir.groups.CompiledKernel` types, no pass."""
from __future__ import annotations

import operator
from collections import Counter

import torch.fx

from pipeline import compat
from .groups import CompiledKernel, FusedGroup, packet_name

# Calls that only unpack or pass values along: neither kernels nor extern work.
_PLUMBING = {operator.getitem}


def group_summary(group: FusedGroup) -> dict:
    """Name, kind, domain and operators of one fused group."""
    ops = [packet_name(n.target) for n in group.subgraph.graph.nodes if n.op == "call_function"]
    return {"name": group.name, "kind": group.kind, "domain": [str(d) for d in group.domain],
            "reduced": list(group.reduced), "ops": ops}


def graph_contents(gm: torch.fx.GraphModule) -> dict:
    """``kernels`` (generated, with backend and source), ``eager_groups`` (fused groups without a
    kernel) and ``extern_calls`` (operator name to call count) of a compiled graph."""
    kernels, eager, extern = [], [], Counter()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target = node.target
            inner = getattr(target, "wrapped_graph", None)
            if isinstance(inner, torch.fx.GraphModule):        # e.g. a CUDA-graph runner
                contents = graph_contents(inner)
                kernels += contents["kernels"]
                eager += contents["eager_groups"]
                extern.update(contents["extern_calls"])
            elif isinstance(target, CompiledKernel):
                kernels.append({**group_summary(target.group), "backend": target.backend,
                                "kernel": target.__name__, "source": target.source})
            elif isinstance(target, FusedGroup):
                eager.append(group_summary(target))
            elif target not in _PLUMBING:
                extern[compat.op_name(target)] += 1
        elif node.op in ("call_method", "call_module"):
            extern[f"{node.op}:{node.target}"] += 1
    return {"kernels": kernels, "eager_groups": eager, "extern_calls": dict(sorted(extern.items()))}


__all__ = ["graph_contents", "group_summary"]
