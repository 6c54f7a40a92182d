"""``channels-last``: 2-D convolutions read and write channels-last tensors, and so does what lies between them.

cuDNN's convolution kernels on Hopper are NHWC kernels. Handed NCHW tensors (torch's default
layout), ATen's convolution runs cuDNN's own transposing kernels around every call: the input and
the weight into NHWC, the output back (a Stable-Diffusion-style U-Net block spent a fifth of its GPU
time in them). Handed a channels-last input or weight, ATen picks the NHWC path and returns a
channels-last output. Inductor makes the same choice (``layout_optimization``).

This pass gives each 2-D convolution channels-last operands (a ``clone`` to ``channels_last`` of
an input or weight not already so), then recomputes every node's example value in graph order:
elementwise work on a channels-last tensor is channels-last too (TensorIterator's rule, which the
fused kernels follow: they write the layout their example value has), so the next convolution's
input arrives channels-last and its clone is dropped. A ``view`` that the new layout cannot serve
(a group norm's reshape to groups) reads a contiguous copy instead, which fusion makes inside the
kernel that reads it. A graph output whose layout changed is copied back to the layout it had, so
callers see eager's strides. Graphs with ``as_strided`` (layout-dependent by definition) are left
alone, as are graphs whose convolutions are all channels-last already (models converted with
``.to(memory_format=torch.channels_last)``).

The weight's clone is made on every call (a kept copy would miss writes through ``weight.data``,
the trade ``pack-weights`` leaves to the plan); a 1x1 or depthwise weight needs none, its layout
being channels-last already.

Whether channels-last pays depends on the convolution and the machine: oneDNN's channels-last
kernels beat its blocked NCHW path on depthwise and narrow convolutions, and lose (by several
times) where a convolution's weight outweighs the pixels it is applied to (a ResNet's last stages
at a small batch). So by default (``decide: measure``) the pass times each distinct convolution of
the graph in both layouts, weight copies included, on random tensors of its shapes, and converts
only when channels-last saves ``min_gain`` of the total. The default plan lets CPU graphs convert;
CUDA graphs keep their layout unless a plan lists ``cuda``: there the group norms between a U-Net's
convolutions reduce over channels-last tensors a pixel apart, which the timing of convolutions
alone does not see.
"""
from __future__ import annotations

import contextlib
from typing import Literal

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, compat, device_types, non_negative, option, positive
from passes import timing
from passes.kernel_ir.groups import meta_of
from pipeline.ir import finish

aten = torch.ops.aten
LAYOUT_DEPENDENT = (aten.as_strided.default, aten.as_strided_scatter.default)
VIEWS = (aten.view.default, aten._unsafe_view.default)


@attrs.frozen
class ChannelsLastOptions:
    devices: list[str] = option([], "Devices whose convolutions may run channels-last (the default plan lists "
                                    "cpu; see the module's docs).", check=device_types,
                                tune=([], ["cpu", "cuda"]))
    min_channels: int = option(16, "Only graphs with a convolution of at least this many input and output "
                                   "channels (the stem of an image model has 3 and proves nothing).",
                               check=positive)
    decide: Literal["measure", "always"] = option(
        "measure", "measure: time each distinct convolution of the graph in both layouts on random inputs of its "
                   "shapes at compile time (a few milliseconds each; a weight that needs a channels-last copy "
                   "every call is timed with its copy) and convert only when channels-last is faster in total by "
                   "min_gain; always: convert whenever the pass applies.",
        tune=("measure", "always"))
    min_gain: float = option(0.05, "With decide: measure, the fraction of the convolutions' time channels-last "
                                   "must save (it also pays for the layout copies of the graph's inputs and "
                                   "outputs, which are not timed).", check=non_negative)


def _is_channels_last(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_contiguous(
        memory_format=torch.channels_last)


def _conv_operands(node: torch.fx.Node, devices: list[str]) -> tuple | None:
    """``(input, weight)`` of a 2-D convolution on one of ``devices``, else None."""
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return None
    x, w = node.args[0], node.args[1]
    xv, wv = meta_of(x), meta_of(w)
    if not (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor) and xv.dim() == 4 and wv.dim() == 4):
        return None
    if xv.device.type not in devices or xv.dtype == torch.float64:
        return None
    return x, w


class ChannelsLast(Pass):
    """2-D convolutions and the work between them in channels-last layout; outputs keep their layout."""

    name = "channels-last"
    Options = ChannelsLastOptions
    version = "2"
    requires = frozenset({"aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        if context.role != "inference":
            return graph            # a training graph's weight gradients would come back channels-last
        nodes = list(graph.graph.nodes)
        convs = [n for n in nodes if _conv_operands(n, self.options.devices) is not None]
        if not convs:
            return graph
        widest = max(min(meta_of(n.args[1]).shape[:2]) for n in convs)
        if widest < self.options.min_channels:
            context.note(f"convolutions kept in their layout: none has {self.options.min_channels} channels in and out")
            return graph
        if all(_is_channels_last(meta_of(n.args[0])) and _is_channels_last(meta_of(n.args[1])) for n in convs):
            return graph
        layout = _Relayout(nodes, convs)
        if layout.blocker is not None:
            context.note(f"convolutions kept in their layout: {layout.blocker.name} ({layout.blocker.target}) "
                         "depends on or rejects the layout its input would have")
            return graph
        if self.options.decide == "measure":
            verdict = _measured(convs)
            if verdict is None:
                context.note("convolutions kept in their layout: a size has no value to time it at")
                return graph
            as_is, channels_last, distinct = verdict
            timed = (f"{distinct} distinct convolution(s) timed: {as_is * 1e3:.3f} ms as they are, "
                     f"{channels_last * 1e3:.3f} ms channels-last")
            if channels_last > (1.0 - self.options.min_gain) * as_is:
                context.note(f"convolutions kept in their layout: {timed}")
                return graph
            context.note(timed)
        counts = layout.apply(graph.graph)
        context.note(f"{len(convs)} convolution(s) channels-last: {counts[0]} layout copies, {counts[1]} view(s) "
                     f"through a contiguous copy, {counts[2]} output(s) restored")
        return finish(graph)


class _Relayout:
    """The graph's example values with every 2-D convolution reading channels-last operands,
    worked out before anything changes (``blocker`` is the node that forbids it, if any)."""

    def __init__(self, nodes: list, convs: list) -> None:
        self.nodes = nodes
        self.values: dict = {}          # node -> its example value in the new layout (changed ones)
        self.convs = convs              # in graph order
        self.is_conv = set(convs)
        self.dense_views: set = set()   # views that need a contiguous copy of their source
        self.blocker: torch.fx.Node | None = None
        self._propagate()

    def value(self, node: torch.fx.Node) -> object:
        return self.values.get(node, node.meta.get("val"))

    def _propagate(self) -> None:
        changed: set = set()
        for node in self.nodes:
            if node.op != "call_function":
                continue
            if node in self.is_conv:
                operands = {a: _clone(self.value(a), torch.channels_last) for a in node.args[:2]}
                new = compat.example_value(node, lambda n: operands.get(n, self.value(n)))
            elif changed.intersection(node.all_input_nodes):
                if node.target in LAYOUT_DEPENDENT:
                    self.blocker = node
                    return
                try:
                    new = compat.example_value(node, self.value)
                except (RuntimeError, ValueError):     # a view the layout cannot serve
                    if node.target not in VIEWS:
                        self.blocker = node             # an operator that rejects the layout
                        return
                    dense = _clone(self.value(node.args[0]), torch.contiguous_format)
                    new = compat.example_value(node, lambda n: dense if n is node.args[0] else self.value(n))
                    self.dense_views.add(node)
            else:
                continue
            if _strides(new) != _strides(node.meta.get("val")):
                self.values[node] = new
                changed.add(node)

    def apply(self, graph: torch.fx.Graph) -> tuple[int, int, int]:
        """Rewrite the graph to the worked-out layout; returns (layout copies, views through a
        contiguous copy, outputs copied back)."""
        output = next(n for n in reversed(self.nodes) if n.op == "output")
        made: dict = {}
        for conv in self.convs:
            for position in (0, 1):
                operand = conv.args[position]
                if _is_channels_last(self.value(operand)):
                    continue
                if operand not in made:
                    with graph.inserting_before(conv):
                        made[operand] = _call(graph, aten.clone.default, operand, torch.channels_last,
                                              _clone(self.value(operand), torch.channels_last))
                conv.replace_input_with(operand, made[operand])
        for view in self.dense_views:
            source = view.args[0]
            with graph.inserting_before(view):
                dense = _call(graph, aten.clone.default, source, torch.contiguous_format,
                              _clone(self.value(source), torch.contiguous_format))
            view.replace_input_with(source, dense)
        restored = 0
        for node in list(output.all_input_nodes):
            old, new = meta_of(node), self.values.get(node)
            if isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and old.is_contiguous() \
                    and not new.is_contiguous():
                with graph.inserting_before(output):
                    dense = _call(graph, aten.clone.default, node, torch.contiguous_format,
                                  _clone(new, torch.contiguous_format))
                output.replace_input_with(node, dense)
                restored += 1
        for node, value in self.values.items():
            node.meta["val"] = value
        return len(made), len(self.dense_views), restored


def _measured(convs: list) -> tuple[float, float, int] | None:
    """Seconds per call of the graph's convolutions as they are and channels-last (a weight that is
    not channels-last already copied on every call, as the rewritten graph does), each distinct
    convolution timed once on random inputs and counted as often as it occurs; and how many were
    distinct. None when a size has no value to time at."""
    distinct: dict = {}
    for node in convs:
        metas = [meta_of(a) for a in node.args[:3]]
        if not all(m is None or isinstance(m, torch.Tensor) and timing.concrete(m) for m in metas):
            return None
        key = (tuple(_signature(m) for m in metas), repr(node.args[3:]))
        distinct.setdefault(key, [node, 0])[1] += 1
    as_is = channels_last = 0.0
    for node, count in distinct.values():
        device = meta_of(node.args[0]).device
        x, w, *bias = (timing.random_like(meta_of(a), device) if a is not None else None for a in node.args[:3])
        rest = node.args[3:]
        x_cl = x.contiguous(memory_format=torch.channels_last)
        conv = aten.convolution.default
        if _is_channels_last(w):
            converted = lambda: conv(x_cl, w, *bias, *rest)        # noqa: E731
        else:       # the rewritten graph copies the weight on every call
            converted = lambda: conv(x_cl, w.contiguous(memory_format=torch.channels_last), *bias, *rest)  # noqa: E731
        kept, changed = timing.fastest_per_call([lambda: conv(x, w, *bias, *rest), converted], device)
        as_is += count * kept
        channels_last += count * changed
    return as_is, channels_last, len(distinct)


def _signature(meta: torch.Tensor | None) -> tuple | None:
    """Shape, strides (at the values Dynamo saw for symbols) and dtype: what a timing depends on."""
    if meta is None:
        return None
    return tuple(map(compat.size_hint, meta.shape)), tuple(map(compat.size_hint, meta.stride())), meta.dtype


def _clone(value: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """A fake copy of ``value`` in ``memory_format``, in its fake mode."""
    mode = compat.fake_mode_of([value])
    with mode if mode is not None else contextlib.nullcontext():
        return torch.ops.aten.clone.default(value, memory_format=memory_format)


def _call(graph: torch.fx.Graph, target, source: torch.fx.Node, memory_format: torch.memory_format,
          value: torch.Tensor) -> torch.fx.Node:
    node = graph.call_function(target, (source,), {"memory_format": memory_format})
    node.meta["val"] = value
    return node


def _strides(value: object) -> object:
    """The strides of a tensor value, or of each tensor in a tuple of them."""
    if isinstance(value, torch.Tensor):
        return tuple(value.stride())
    if isinstance(value, (tuple, list)):
        return tuple(_strides(v) for v in value)
    return None


__all__ = ["ChannelsLast", "ChannelsLastOptions"]
