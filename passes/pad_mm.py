"""``pad-mm``: pad matrix multiplications whose sizes are not multiples of 8 elements.

cuBLAS picks slow legacy kernels when a leading dimension is misaligned (GPT-2's 50257-word
vocabulary sends its LM head to an sm75-era kernel). This pass
zero-pads the K and N dimensions of ``mm``/``addmm``/``bmm`` to a multiple and slices the result
back. A transposed weight (``linear``'s ``weight.t()``) is padded in its own layout, then transposed:
a dense copy, where padding the transposed view would be a much slower transposing copy.
A transposed left operand (``grad_out.t() @ x``, a weight gradient) has M as its leading
dimension: a misaligned M is padded the same way (in the source's layout) and the extra rows of
the result are sliced off. Identical pads of one tensor are made once and shared.
A matmul result that is itself a graph output is made contiguous; a result reshaped on its way out
keeps the padded row stride (as Inductor's padded matmuls do), saving a copy of the whole output.
"""
from __future__ import annotations

import attrs
import torch
import torch.fx

from pipeline import Pass, PassContext, device_types, option, positive
from passes.kernel_ir.groups import meta_of
from pipeline.ir import finish

aten = torch.ops.aten


@attrs.frozen
class PadMmOptions:
    multiple: int = option(8, "Pad K and N (and M of a transposed left operand) up to a multiple of this "
                                "many elements.", check=positive, tune=(8, 16, 64))
    min_size: int = option(1024, "Only pad matmuls whose N (or K) is at least this large.", check=positive)
    devices: list[str] = option(["cuda"], "Devices whose matmuls are padded (cuBLAS is what needs it).",
                                check=device_types)


def _pad_amount(size, multiple: int) -> int:
    return (-size) % multiple if isinstance(size, int) else 0


class PadMatmul(Pass):
    """Zero-pad misaligned K/N of mm, addmm and bmm so the vendor library picks its fast kernels."""

    name = "pad-mm"
    Options = PadMmOptions
    version = "7"
    requires = frozenset({"aten"})

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        opts = self.options
        padded = 0
        pads: dict = {}
        outputs = {a for a in next(n for n in graph.graph.nodes if n.op == "output").all_input_nodes}
        for node in list(graph.graph.nodes):
            if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default,
                                                                  aten.bmm.default):
                continue
            out = meta_of(node)
            if not isinstance(out, torch.Tensor) or out.device.type not in opts.devices:
                continue
            has_bias = node.target is aten.addmm.default
            a, b = (node.args[1], node.args[2]) if has_bias else (node.args[0], node.args[1])
            m, k, n = meta_of(a).shape[-2], meta_of(a).shape[-1], meta_of(b).shape[-1]
            pad_k = self._pad(k)
            pad_n = self._pad(n)
            pad_m = self._pad(m) if (node.target is aten.mm.default
                                     and _transposed_source(a) is not None) else 0
            if not (pad_k or pad_n or pad_m):
                continue
            first_made = node.prev
            with graph.graph.inserting_before(node):
                a = _pad_left(graph.graph, a, pad_m, pad_k, pads)
                b = _pad_operand(graph.graph, b, pad_k, pad_n, pads)
                if has_bias:
                    bias = node.args[0]
                    if pad_n:
                        bias_meta = meta_of(bias)
                        if bias_meta.dim() == 1 or bias_meta.shape[-1] == n:
                            bias = graph.graph.call_function(aten.constant_pad_nd.default, (bias, [0, pad_n]))
                        else:
                            # -1 keeps the bias's leading sizes (it broadcasts over the rows)
                            bias = graph.graph.call_function(aten.expand.default,
                                                             (bias, [-1] * (out.dim() - 1) + [n + pad_n]))
                    product = graph.graph.call_function(aten.addmm.default, (bias, a, b), dict(node.kwargs))
                else:
                    product = graph.graph.call_function(node.target, (a, b))
                result = product
                if pad_m:
                    result = graph.graph.call_function(aten.slice.Tensor, (result, 0, 0, m))
                if pad_n:
                    result = graph.graph.call_function(aten.slice.Tensor, (result, out.dim() - 1, 0, n))
                if (pad_n or pad_m) and node in outputs:
                    result = graph.graph.call_function(aten.clone.default, (result,),
                                                       {"memory_format": torch.contiguous_format})
            trace = node.meta.get("stack_trace")
            if trace is not None:      # the pads and the padded matmul are still the user's line (reports, profiles)
                made = first_made.next
                while made is not node:
                    made.meta.setdefault("stack_trace", trace)
                    made = made.next
            node.replace_all_uses_with(result)
            graph.graph.erase_node(node)
            padded += 1
            context.note(f"{node.name}: padded M by {pad_m}, K by {pad_k} and N by {pad_n} to multiples of "
                         f"{opts.multiple}")
        if not padded:
            return graph
        graph = finish(graph)
        return _with_metadata(graph, context)


    def _pad(self, size) -> int:
        """Elements to add to ``size`` (0 when it is aligned, symbolic or under ``min_size``)."""
        if not isinstance(size, int) or size < self.options.min_size:
            return 0
        return _pad_amount(size, self.options.multiple)


def _padded(graph: torch.fx.Graph, source: torch.fx.Node, pad: list, pads: dict) -> torch.fx.Node:
    """``constant_pad_nd(source, pad)``, made once per (source, pad) in a graph. A graph input
    (a weight) is padded as ``constant_pad_nd(clone(source))``: ``fuse`` makes the clone a kernel
    whose output pad it writes (one copy kernel, plus a fill of the padding rows only, where the
    bare operator fills the whole padded buffer and then copies the weight into it: GPT-2's tied
    50257 x 768 LM-head weight took 0.041 + 0.024 ms that way on the H200)."""
    key = (source, tuple(pad))
    if key not in pads:
        copied = graph.call_function(aten.clone.default, (source,)) if source.op == "placeholder" else source
        pads[key] = graph.call_function(aten.constant_pad_nd.default, (copied, list(pad)))
    return pads[key]


def _pad_left(graph: torch.fx.Graph, a: torch.fx.Node, pad_m: int, pad_k: int, pads: dict) -> torch.fx.Node:
    """``a`` (M x K) zero-padded by ``pad_m`` rows and ``pad_k`` columns; a transposed ``a`` is
    padded in its source's layout (see :func:`_pad_operand`)."""
    if not (pad_m or pad_k):
        return a
    a = _without_double_transposes(a)
    source = _transposed_source(a)
    if source is not None:
        pad = [0, pad_m] if not pad_k else [0, pad_m, 0, pad_k]
        return graph.call_function(aten.permute.default, (_padded(graph, source, pad, pads), [1, 0]))
    return _padded(graph, a, [0, pad_k], pads)


def _transposed_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """``w`` when ``node`` is the transpose of a 2-D ``w`` (a linear layer's ``weight.t()``)."""
    if node.op != "call_function" or meta_of(node) is None or meta_of(node).dim() != 2:
        return None
    if node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0]) \
            or (node.target is aten.transpose.int and sorted(a % 2 for a in node.args[1:3]) == [0, 1]):
        return node.args[0]
    return None


def _without_double_transposes(node: torch.fx.Node) -> torch.fx.Node:
    """``w`` for ``w.t().t()`` (the backward of a tied weight's ``linear`` reads one): the value
    is ``w`` itself, in ``w``'s layout, so it is padded as ``w`` (a dense copy), not as the
    transposed view in between (a transposing copy, many times slower)."""
    while True:
        inner = _transposed_source(node)
        source = _transposed_source(inner) if inner is not None else None
        if source is None or meta_of(source) is None or meta_of(source).dim() != 2:
            return node
        node = source


def _pad_operand(graph: torch.fx.Graph, b: torch.fx.Node, pad_k: int, pad_n: int, pads: dict) -> torch.fx.Node:
    """``b`` (K x N) zero-padded by ``pad_k`` rows and ``pad_n`` columns. A transposed weight is
    padded in its own layout and transposed again: a dense copy the size of the weight, where
    padding the transposed view would be a slow transposing copy."""
    if not (pad_k or pad_n):
        return b
    b = _without_double_transposes(b)
    source = _transposed_source(b)
    if source is not None:
        pad = [0, pad_k] if not pad_n else [0, pad_k, 0, pad_n]
        return graph.call_function(aten.permute.default, (_padded(graph, source, pad, pads), [1, 0]))
    return _padded(graph, b, [0, pad_n] if not pad_k else [0, pad_n, 0, pad_k], pads)


def _with_metadata(graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
    """Re-trace so every new node carries example values for the passes after this one."""
    from pipeline import compat
    with torch.no_grad():
        return compat.retrace(graph, context.example_inputs)
