"""``partition``: split a training graph (AOTAutograd's joint forward+backward graph) into a forward
and a backward graph, choosing which forward values the backward reads from memory (saved) and
which it computes again (recomputed).

Strategies:

- ``save-all``: the backward reads every forward value it needs; nothing is recomputed. The
  split follows the data flow: the forward is what the forward's outputs and its writes into
  inputs (batch-norm running statistics) need; everything else runs in the backward.
- ``recompute-pointwise`` (this project's own heuristic): start from ``save-all``; for each saved
  value made by a chain of cheap ops (pointwise ops, dtype casts, views), walk back through that
  chain to the first values that are not cheap (matmul outputs, reductions, inputs) and
  recompute the chain in the backward from those instead, when that keeps fewer bytes alive.
  Inputs of the compiled region (parameters, the batch) cost nothing to keep: the caller holds
  them anyway. The recomputed ops land in the backward graph next to the ops that read them, so
  ``fuse`` puts them inside the backward's fused kernels (recomputing them costs no extra
  memory traffic there). Random ops are never recomputed, nor floating-point values an equality
  compares (amax's backward): a recomputation is not always bit-identical.
- ``min-cut``: torch's ``min_cut_rematerialization_partition`` (what Inductor uses).

``memory_budget`` limits the activation bytes (saved tensors that are not inputs of the compiled
region): a value above 1 is bytes, a value in (0, 1] a fraction of what ``save-all`` would save.
``recompute-pointwise`` then recomputes only until the saved bytes fit (biggest savings first)
and notes when even recomputing every profitable chain does not fit; ``min-cut`` passes it to
torch as its ``activation_memory_budget`` (a fraction; bytes are converted to one); ``save-all``
never recomputes and only notes whether it fits.
"""
from __future__ import annotations

import operator
from typing import Any, Literal

import attrs
import torch
import torch.fx

from pipeline import JointGraph, PassContext, SplitPass, compat, option
from pipeline.ir import saved_for_backward, value_bytes

# Views and dtype casts: recomputing them costs (almost) nothing.
_CHEAP = {getattr(torch.ops.aten, name).default for name in (
    "t", "permute", "view", "_unsafe_view", "expand", "unsqueeze", "alias", "clone", "_to_copy")}
_CHEAP |= {torch.ops.aten.transpose.int, torch.ops.aten.squeeze.dim, torch.ops.aten.reshape.default,
           torch.ops.prims.convert_element_type.default}
# Walking back further than this many ops from one saved value is not a "chain" any more.
_MAX_REGION = 48
_CASTS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default}
# Comparisons that need bit-exact operands: max/amax backward tests which inputs equal the maximum.
_EQUALITIES = {torch.ops.aten.eq.Tensor, torch.ops.aten.ne.Tensor, torch.ops.aten.eq.Scalar,
               torch.ops.aten.ne.Scalar}


def _positive_budget(value: Any) -> str | None:
    if value is not None and value <= 0:
        return "must be above 0 (bytes above 1, a fraction of save-all's bytes up to 1)"
    return None


@attrs.frozen
class PartitionOptions:
    strategy: Literal["save-all", "recompute-pointwise", "min-cut"] = option(
        "recompute-pointwise",
        "save-all: the backward reads every forward value it needs; recompute-pointwise: recompute "
        "chains of pointwise ops, casts and views in the backward when that keeps fewer bytes alive "
        "(this project's heuristic); min-cut: torch's min-cut rematerialization partitioner.",
        tune=("save-all", "recompute-pointwise", "min-cut"))
    memory_budget: float | None = option(
        None, "Most activation bytes to keep for the backward: above 1 in bytes, up to 1 as a fraction "
              "of what save-all keeps. Recompute-pointwise stops recomputing once it fits; min-cut gets "
              "it as torch's activation_memory_budget; null: no limit.", check=_positive_budget)
    recompute_input_casts: bool = option(
        False, "recompute-pointwise: also recompute dtype casts (and views) of the compiled region's "
               "inputs, such as autocast's bf16 copy of each weight. Off: they stay saved, since "
               "recomputing one costs a kernel of its own per step for a tensor the backward must "
               "have in memory anyway (a matmul reads it).")


class Partition(SplitPass):
    """Split the joint forward/backward graph: which activations are saved, which recomputed."""

    name = "partition"
    Options = PartitionOptions
    version = "3"
    provides = frozenset({"partitioned"})

    def split(self, joint: JointGraph, context: PassContext) -> tuple[torch.fx.GraphModule,
                                                                      torch.fx.GraphModule]:
        opts = self.options
        if opts.strategy == "min-cut":
            fraction = opts.memory_budget
            if fraction is not None and fraction > 1:
                full = _activation_bytes(_saved(joint, _forward(joint), set()))
                fraction = min(1.0, fraction / full) if full else 1.0
            forward, backward = compat.torch_partition(
                joint.module, joint.example_inputs, num_primals=joint.num_primals,
                num_forward_outputs=joint.num_forward_outputs, strategy="min-cut", memory_budget=fraction)
        else:
            recompute = set()
            if opts.strategy == "recompute-pointwise":
                recompute = _choose_recomputed(joint, opts.memory_budget, context,
                                               input_casts=opts.recompute_input_casts)
            elif opts.memory_budget is not None:
                _note_budget(joint, opts.memory_budget, context)
            forward, backward = split_joint(joint, recompute)
        saved = saved_for_backward(backward)
        context.note(f"{opts.strategy}: {len(saved['tensors'])} saved tensor(s), {saved['total_bytes']} bytes, "
                     f"{saved['activation_bytes']} of them activations")
        return forward, backward


# -- the split ----------------------------------------------------------------------------------
def split_joint(joint: JointGraph, recompute: set[torch.fx.Node]) -> tuple[torch.fx.GraphModule,
                                                                           torch.fx.GraphModule]:
    """Forward and backward graphs of ``joint`` where the backward computes the nodes in
    ``recompute`` again (from the values they are made of) instead of reading them."""
    graph = joint.module.graph
    nodes = list(graph.nodes)
    outputs = list(nodes[-1].args[0])
    forward = _forward(joint)
    needed, saved = _walk_backward(joint, forward, recompute)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tangents = placeholders[joint.num_primals:]
    saved_tensors = [n for n in nodes if n in saved and isinstance(n.meta.get("val"), torch.Tensor)]
    # Plain Python values (an attention kernel's int outputs with static shapes) are not saved:
    # the backward gets them as constants. SymInts and the like are saved after the tensors.
    constants = {n: n.meta["val"] for n in nodes if n in saved and "val" in n.meta
                 and (n.meta["val"] is None or type(n.meta["val"]) in (int, float, bool))}
    saved_symbols = [n for n in nodes if n in saved and n not in saved_tensors and n not in constants]

    fw = torch.fx.Graph()
    env: dict = {}
    for node in nodes:
        if node in forward:
            env[node] = fw.node_copy(node, lambda a: env[a])
    fw_out = [env[x] if isinstance(x, torch.fx.Node) else x for x in outputs[:joint.num_forward_outputs]]
    fw.output(tuple(fw_out + [env[n] for n in saved_tensors + saved_symbols]))

    bw = torch.fx.Graph()
    benv: dict = {}
    benv.update(constants)
    for node in saved_symbols + saved_tensors:   # AOTAutograd hands the backward SymInts first
        benv[node] = bw.placeholder(node.name)
        benv[node].meta = dict(node.meta)
    for node in tangents:
        benv[node] = bw.node_copy(node)
    for node in nodes:
        if node in needed:
            benv[node] = bw.node_copy(node, lambda a: benv[a])
    bw.output(tuple(benv[x] if isinstance(x, torch.fx.Node) else x
                    for x in outputs[joint.num_forward_outputs:]))
    root = joint.module
    return torch.fx.GraphModule(root, fw), torch.fx.GraphModule(root, bw)


def _forward(joint: JointGraph) -> set[torch.fx.Node]:
    """The nodes the forward computes: every primal, and what the forward's outputs and its
    writes into inputs need."""
    nodes = list(joint.module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tangents = set(placeholders[joint.num_primals:])
    roots = [a for a in nodes[-1].args[0][:joint.num_forward_outputs] if isinstance(a, torch.fx.Node)]
    roots += [n for n in nodes if n.op == "call_function" and compat.is_mutating(n.target)]
    roots += placeholders[:joint.num_primals]
    forward: set = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in forward:
            continue
        if node in tangents:
            raise ValueError(f"a forward output or a write into an input depends on {node.name}: the joint "
                             f"graph does not separate into forward and backward")
        forward.add(node)
        stack.extend(node.all_input_nodes)
    # Every output of a multi-output op the forward runs (batch norm's saved statistics) is
    # taken from it in the forward: the backward can only be handed tensors, not the tuple.
    for node in list(forward):
        if node.op == "call_function" and not isinstance(node.meta.get("val"), torch.Tensor):
            forward.update(user for user in node.users if user.target is operator.getitem)
    return forward


def _walk_backward(joint: JointGraph, forward: set, recompute: set) -> tuple[set, set]:
    """(backward nodes, saved nodes): walking from the gradients towards the inputs, a forward
    node that is not recomputed is saved; anything else the backward computes."""
    nodes = list(joint.module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tangents = set(placeholders[joint.num_primals:])
    needed, saved = set(), set()
    stack = [a for a in nodes[-1].args[0][joint.num_forward_outputs:] if isinstance(a, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in needed or node in saved or node in tangents:
            continue
        if node in forward and node not in recompute:
            saved.add(node)
            continue
        needed.add(node)
        stack.extend(node.all_input_nodes)
    return needed, saved


def _saved(joint: JointGraph, forward: set, recompute: set) -> set:
    return _walk_backward(joint, forward, recompute)[1]


# -- the recompute-pointwise heuristic ------------------------------------------------------------
def _is_cheap(node: torch.fx.Node) -> bool:
    """A node the backward may compute again: one output tensor of a pointwise op, cast or view,
    deterministic and not writing anything."""
    if node.op != "call_function" or not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    target = node.target
    if compat.is_mutating(target) or compat.is_nondeterministic(target):
        return False
    return target in _CHEAP or torch.Tag.pointwise in getattr(target, "tags", ())


def _activation_bytes(saved: set) -> int:
    """Bytes of saved values that are not inputs of the compiled region (those the caller keeps)."""
    return sum(_cost(n) for n in saved)


def _cost(node: torch.fx.Node) -> int:
    """Bytes keeping ``node`` for the backward costs: none for inputs of the compiled region."""
    if node.op == "placeholder":
        return 0
    return value_bytes(node.meta.get("val"))


def _compared_exactly(joint: JointGraph) -> set:
    """Floating-point values (and views of them) an equality compares: they are saved, never
    recomputed. A recomputed value is not always bit-identical to the forward's (a C++ loop may
    vectorize differently and call libmvec's expf instead of libm's), and amax's backward compares
    the input with the saved maximum: a mismatch there divides by a count of zero."""
    compared = set()
    for node in joint.module.graph.nodes:
        if node.op != "call_function" or node.target not in _EQUALITIES:
            continue
        stack = [a for a in node.all_input_nodes]
        while stack:
            value = stack.pop()
            meta = value.meta.get("val")
            if value in compared or not isinstance(meta, torch.Tensor) or not meta.dtype.is_floating_point:
                continue
            compared.add(value)
            if value.op == "call_function" and compat.is_view_op(value.target):
                stack.extend(value.all_input_nodes)
    return compared


def _region(node: torch.fx.Node, saved: set, cheap=_is_cheap) -> tuple[set, set] | None:
    """The chain of cheap ops that makes ``node`` and the values it starts from (its frontier:
    inputs, values already saved, results of ops that are not cheap); None when it holds more
    than ``_MAX_REGION`` ops (a whole network of pointwise ops is not a chain worth redoing)."""
    region, frontier = set(), set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in region:
            continue
        region.add(current)
        if len(region) > _MAX_REGION:
            return None
        for arg in current.all_input_nodes:
            if arg in region:
                continue
            if arg.op == "placeholder" or arg in saved or not cheap(arg):
                frontier.add(arg)
            else:
                stack.append(arg)
    return region, frontier


def _is_input_cast(region: set, frontier: set) -> bool:
    """A chain of dtype casts and views of inputs of the compiled region only (a weight's autocast
    copy): recomputing it saves its bytes, but costs a kernel that converts the input again."""
    return all(f.op == "placeholder" for f in frontier) and any(n.target in _CASTS for n in region) and all(
        n.target in _CASTS or compat.is_view_op(n.target) for n in region)


def _choose_recomputed(joint: JointGraph, budget: float | None, context: PassContext, *,
                       input_casts: bool = False) -> set:
    """The cheap forward nodes the backward computes again. Greedy, biggest saved value first:
    recompute a saved value's chain when the values the chain starts from (and are not saved
    already) take fewer bytes than the value; with a budget, stop once the saved bytes fit.
    Casts of the region's inputs are recomputed only with ``input_casts`` (or to meet a budget)."""
    forward = _forward(joint)
    saved = _saved(joint, forward, set())
    full = _activation_bytes(saved)
    limit = None if budget is None else (budget if budget > 1 else budget * full)
    recompute: set = set()
    order = {n: i for i, n in enumerate(joint.module.graph.nodes)}
    exact = _compared_exactly(joint)

    def cheap(node: torch.fx.Node) -> bool:
        return _is_cheap(node) and node not in exact

    candidates = sorted((n for n in saved if cheap(n)), key=lambda n: (-_cost(n), order[n]))
    chains = 0
    for candidate in candidates:
        if limit is not None and _activation_bytes(saved) <= limit:
            break
        if candidate not in saved:
            continue
        found = _region(candidate, saved - {candidate}, cheap)
        if found is None:
            continue
        region, frontier = found
        extra = sum(_cost(f) for f in frontier if f not in saved)
        if extra >= _cost(candidate):
            continue
        if not input_casts and limit is None and _is_input_cast(region, frontier):
            continue
        recompute |= region
        saved = _saved(joint, forward, recompute)
        chains += 1
    after = _activation_bytes(saved)
    context.note(f"recompute-pointwise: {chains} chain(s), {len(recompute)} op(s) recomputed in the "
                 f"backward; estimated activation bytes (views counted apart) {full} -> {after}")
    if limit is not None and after > limit:
        context.note(f"memory_budget {int(limit)} bytes not met: {after} bytes saved after recomputing "
                     f"every chain that saves bytes")
    return recompute


def _note_budget(joint: JointGraph, budget: float, context: PassContext) -> None:
    """save-all never recomputes: only say whether its saved bytes fit the budget."""
    full = _activation_bytes(_saved(joint, _forward(joint), set()))
    limit = budget if budget > 1 else budget * full
    verdict = "fits" if full <= limit else "not met (save-all never recomputes)"
    context.note(f"memory_budget {int(limit)} bytes {verdict}: save-all keeps {full} bytes")
