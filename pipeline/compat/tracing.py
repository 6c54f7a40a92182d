"""Fake tensors and re-tracing graphs with ``make_fx``: functionalization (with effect tokens),
decomposition tables applied while tracing, and calls kept whole through a re-trace. Part of
:mod:`pipeline.compat`, which re-exports the public names."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch._C import _get_dispatch_mode, _TorchDispatchModeKey


def fake_mode_of(values: Iterable[Any]):
    """The FakeTensorMode the given values belong to (or the active tracing context's), or None."""
    from torch._guards import detect_fake_mode
    return detect_fake_mode(list(values))


def as_fake(values: list, fake_mode=None) -> list:
    """Fake versions of ``values`` in Dynamo's fake mode (memoized, so symbolic sizes are kept)."""
    fake_mode = fake_mode or fake_mode_of(values)
    if fake_mode is None:
        return list(values)
    return [fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) and not is_fake(v) else v
            for v in values]


def example_value(node: torch.fx.Node, values: Callable[[torch.fx.Node], Any] | None = None) -> Any:
    """What a new ``call_function`` node computes, from its arguments' example values
    (``meta['val']``, or what ``values`` gives for a node), in their fake mode: the example value a
    rewrite gives a node it adds."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values or (lambda n: n.meta.get("val")))
    mode = fake_mode_of(torch.utils._pytree.tree_leaves((args, kwargs)))
    with mode if mode is not None else contextlib.nullcontext():
        return node.target(*args, **kwargs)


def backend_inputs(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """The example inputs a Dynamo backend should trace ``gm`` with: tensors as fakes of the
    backend's fake mode (their symbolic sizes kept), and each size placeholder as the symbol
    Dynamo traced it with (Dynamo hands over the real int it saw, which would bake this call's
    size into every graph traced from it)."""
    values = as_fake(list(example_inputs))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(values):
        return values
    out = []
    for node, value in zip(placeholders, values):
        symbol = node.meta.get("example_value", node.meta.get("val"))
        out.append(symbol if isinstance(symbol, (torch.SymInt, torch.SymFloat, torch.SymBool)) else value)
    return out


def is_fake(value: Any) -> bool:
    """True for a fake tensor (metadata only, no storage), as Dynamo and ``make_fx`` hand out."""
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(value, FakeTensor)


def retrace(fn: Callable, example_inputs: list, *, decompositions: dict | None = None,
            functionalize: bool = False, remove: str = "mutations") -> torch.fx.GraphModule:
    """Trace ``fn`` to an ATen-level FX graph with ``make_fx`` on ``example_inputs`` (fake or real),
    optionally through functionalization and a decomposition table. Symbolic sizes of fake
    inputs (and size placeholders given as symbols) stay symbolic in the traced graph.

    Functionalization is torch's Python functionalization (``FunctionalTensorMode``, what
    AOTAutograd runs; ``torch.func.functionalize`` loses symbolic sizes), with the Python
    dispatcher on: then ``native_batch_norm`` (whose schema hides its in-place update of the
    running statistics) traces as ``_native_batch_norm_legit``, whose schema declares it, so the
    update is functionalized instead of being left as a hidden mutation. Writes into inputs
    become one ``copy_`` into the input at the end of the graph. ``remove="mutations_and_views"``
    also turns every view into its ``*_copy`` operator."""
    from torch.fx.experimental.proxy_tensor import make_fx
    target = _keeping_node_meta(fn) if isinstance(fn, torch.fx.GraphModule) else fn
    dispatcher = contextlib.nullcontext()
    if functionalize:
        from torch._dispatch.python import enable_python_dispatcher
        target = _functionalized(target)
        dispatcher = enable_python_dispatcher()
    fake_mode = fake_mode_of(example_inputs)
    if fake_mode is None:
        with dispatcher:
            traced = make_fx(target, decomposition_table=decompositions or {}, tracing_mode="real")(*example_inputs)
    else:
        # Graph constants (folded tensors, buffers kept as attributes) are real tensors; the fake
        # mode converts them on the fly while tracing.
        allowed = fake_mode.allow_non_fake_inputs
        fake_mode.allow_non_fake_inputs = True
        try:
            with fake_mode, dispatcher:
                traced = make_fx(target, decomposition_table=decompositions or {}, tracing_mode="real")(*example_inputs)
        finally:
            fake_mode.allow_non_fake_inputs = allowed
    if functionalize:
        _drop_effect_tokens(traced)
    if functionalize and remove == "mutations_and_views":
        _views_to_copies(traced)
    return traced


def _keeping_node_meta(gm: torch.fx.GraphModule) -> Callable:
    """``gm`` run node by node with each node's metadata current, so that every node a re-trace
    makes from it keeps where it came from in the user's code (``stack_trace``, the module stack),
    as AOTAutograd does: reports and profiles name source lines after any number of passes."""
    from torch.fx import traceback as fx_traceback

    def run(*args: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)
    return run


def tracing_now() -> bool:
    """Whether ``make_fx`` is tracing on this thread (one dispatcher lookup: cheap enough for a
    call that runs on every call of a compiled graph)."""
    return _get_dispatch_mode(_TorchDispatchModeKey.PROXY) is not None


def traced_as_one_call(target: Callable, args: tuple, run: Callable[[], Any]) -> Any:
    """While ``make_fx`` traces (:func:`tracing_now`; a pass re-tracing a graph): record
    ``target(*args)`` as one graph node whose value is what ``run()`` returns, run without
    tracing (its operators do not enter the traced graph)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode, track_tensor_tree
    tracer = get_proxy_mode().tracer
    with disable_proxy_modes_tracing():
        out = run()
    proxy = tracer.create_proxy("call_function", target, tuple(tracer.unwrap_proxy(a) for a in args), {})
    return track_tensor_tree(out, proxy, constant=None, tracer=tracer)


def _functionalized(fn: Callable) -> Callable:
    """``fn`` run under Python functionalization: in-place ops become out-of-place ones, and an
    input that was written is updated with one ``copy_`` of its final value. Operators with a
    declared side effect (``_linalg_check_errors``, ``_print``) are threaded through one effect
    token per effect type, as AOTAutograd does; :func:`_drop_effect_tokens` turns them back into
    plain calls in graph order after tracing."""
    from torch._functorch._aot_autograd.functional_utils import from_fun, has_data_mutation, to_fun
    from torch._higher_order_ops.effects import _EffectType
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    def functional(*args: Any) -> Any:
        tokens = {effect: torch.empty(0) for effect in _EffectType}
        with FunctionalTensorMode() as mode:
            wrapped = [to_fun(a) for a in args]
            mode._tokens.update({effect: to_fun(token) for effect, token in tokens.items()})
            out = fn(*wrapped)
        flat, spec = torch.utils._pytree.tree_flatten(out)
        flat = [from_fun(o) for o in flat]
        for arg, fun in zip(args, wrapped):
            if isinstance(fun, FunctionalTensor):
                torch._sync(fun)
                if has_data_mutation(fun):
                    arg.copy_(from_fun(fun))
        return torch.utils._pytree.tree_unflatten(flat, spec)

    return functional


def _drop_effect_tokens(gm: torch.fx.GraphModule) -> None:
    """Replace every ``with_effects(token, op, *args)`` node by ``op(*args)`` and delete the
    tokens. The graph keeps the calls in program order, and :func:`has_effect` keeps passes from
    removing or moving them."""
    from torch._higher_order_ops.effects import with_effects
    graph = gm.graph
    for node in reversed(list(graph.nodes)):     # last first: a token's only users are later calls
        if node.op != "call_function" or node.target is not with_effects:
            continue
        _token, op, *args = node.args
        with graph.inserting_before(node):
            call = graph.call_function(op, tuple(args), dict(node.kwargs))
        call.meta = {k: v for k, v in node.meta.items() if k != "val"}
        results = len(op._schema.returns)
        for user in list(node.users):
            index = user.args[1]
            if index == 0 or results <= 1:    # a single result (or None) is the call itself
                user.replace_all_uses_with(call)
                graph.erase_node(user)
            else:
                user.args = (call, index - 1)
        graph.erase_node(node)
    for node in reversed(list(graph.nodes)):     # the tokens themselves: empty(0), now unused
        if node.op == "call_function" and not node.users and node.target is torch.ops.aten.empty.memory_format:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()


def has_effect(target: Any) -> bool:
    """True for operators with a declared side effect (an error check, a print): never removed,
    merged or moved past one another."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    from torch._higher_order_ops.effects import _get_effect
    return _get_effect(target) is not None


def _views_to_copies(gm: torch.fx.GraphModule) -> None:
    """Replace every view operator of ``gm`` by its ``*_copy`` counterpart (``view`` by
    ``view_copy``), which materializes its result instead of aliasing."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_view_op(node.target):
            continue
        schema_name = node.target._schema.name.split("::")[-1]
        copy = resolve_op(f"{node.target.namespace}.{schema_name}_copy.{node.target._overloadname}")
        if copy is not None:
            node.target = copy
    gm.recompile()


def tensorify_python_scalars(gm: torch.fx.GraphModule) -> None:
    """torch's pass for Python floats Dynamo lifted into graph inputs (it does not specialize
    floats): arithmetic on them becomes tensor operations where it can, and otherwise it raises
    Dynamo's restart exception (see :func:`restart_exceptions`), after which Dynamo traces again
    with those floats as constants. AOTAutograd runs it on training graphs; inference graphs come
    straight from Dynamo, so the graph passes run it. A graph without a SymFloat is left alone."""
    if not any(isinstance(n.meta.get("val"), torch.SymFloat) for n in gm.graph.nodes):
        return
    values = [n.meta.get("val") for n in gm.graph.nodes]
    mode = fake_mode_of([v for v in values if isinstance(v, torch.Tensor)])
    if mode is None or mode.shape_env is None:
        return
    from torch.fx.passes._tensorify_python_scalars import tensorify_python_scalars as tensorify
    tensorify(gm, mode.shape_env, mode)
    gm.recompile()


def restart_exceptions() -> tuple[type, ...]:
    """Exceptions by which a Dynamo backend asks Dynamo to trace the frame again (with some values
    specialized): a compiler passes these through untouched."""
    from torch._dynamo.exc import RestartAnalysis
    return (RestartAnalysis,)
