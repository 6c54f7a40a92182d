"""``decompose``: rewrite operators into simpler ones with torch's decomposition tables.

``table: core-aten`` uses torch's core-ATen table (about 940 entries), ``none`` starts empty and
``custom`` means exactly the ops listed in ``add``. ``keep`` removes ops from the table (they stay
as they are, e.g. ``aten.addmm`` for an extern matmul); ``add`` adds ops from torch's registry.
``keep_on`` keeps ops per device type: their decomposition still applies to calls on other
devices (a call's device is its first tensor argument's). With the core-ATen table,
``one_pixel_convs_as_linear`` adds the project's own rule for convolutions: a 1x1 convolution of a
1x1 image becomes a linear layer, any other stays a convolution."""
from __future__ import annotations

import difflib
from typing import Literal

import attrs
import torch

from pipeline import Pass, PassContext, device_types, option
from pipeline import compat

aten = torch.ops.aten


def _known_ops_on(per_device: dict) -> str | None:
    """Check for ``keep_on``: device types to lists of operator names."""
    bad = device_types(list(per_device or {}))
    if bad:
        return bad
    for names in (per_device or {}).values():
        problem = _known_ops(names) if isinstance(names, list) else f"expected a list of operators, got {names!r}"
        if problem:
            return problem
    return None


def _known_ops(names: list[str]) -> str | None:
    for name in names:
        if compat.resolve_op(name) is None:
            hint = ""
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "aten":
                close = difflib.get_close_matches(parts[1], dir(torch.ops.aten), n=1)
                hint = f"; did you mean 'aten.{close[0]}'?" if close else ""
            return f"unknown operator '{name}' (write it as aten.name or aten.name.overload){hint}"
    return None


@attrs.frozen
class DecomposeOptions:
    table: Literal["core-aten", "none", "custom"] = option(
        "core-aten", "Starting table: torch's core-ATen decompositions, none, or custom (only 'add').")
    keep: list[str] = option([], "Operators never decomposed (e.g. aten.addmm stays an extern call).",
                             check=_known_ops)
    add: list[str] = option([], "Operators decomposed with torch's registered decomposition.",
                            check=_known_ops)
    keep_on: dict[str, list[str]] = option(
        {"cpu": ["aten.native_group_norm_backward"],
         "cuda": ["aten._native_batch_norm_legit_functional", "aten.native_batch_norm_backward"]},
        "Per device type, operators not decomposed when called on that device (decomposed elsewhere). "
        "On the CPU a group norm's backward stays ATen's one kernel: decomposed, it is per-channel and "
        "per-group reductions and the input gradient, five to seven C++ kernels, whose calls cost more "
        "than fusing saves at the image sizes CPU training sees. On CUDA a training batch norm stays "
        "ATen's: its statistics reduce every image's pixels to one value per channel, which a fused "
        "Triton reduction with its normalized output (two passes, so never split) computes with one "
        "program per few channels.",
        check=_known_ops_on)
    one_pixel_convs_as_linear: bool = option(
        True, "With the core-aten table: a 1x1 convolution of a 1x1 image (a squeeze-and-excitation layer, a "
              "pooled head) is a matrix "
              "product: linear(x.reshape(N, C), weight.reshape(O, C), bias), reshaped back. oneDNN and cuDNN "
              "spend most of such a call preparing the weight; a GEMM reads it as it is (and pack-weights can "
              "keep it packed).", tune=(True, False))


class Decompose(Pass):
    """Apply a decomposition table by re-tracing the ATen graph."""

    name = "decompose"
    Options = DecomposeOptions
    version = "4"
    requires = frozenset({"aten"})
    provides = frozenset({"decomposed"})

    @classmethod
    def provided(cls, options: DecomposeOptions) -> frozenset[str]:
        tags = set(cls.provides)
        if options.table == "core-aten" and not options.keep and not any((options.keep_on or {}).values()):
            tags.add("core-aten")
        return frozenset(tags)

    def table(self) -> dict:
        opts = self.options
        table = compat.core_aten_table() if opts.table == "core-aten" else {}
        if opts.add:
            table.update(compat.decompositions_for([compat.resolve_op(n) for n in opts.add]))
        for name in opts.keep:
            for overload in compat.overloads_of(compat.resolve_op(name)):
                table.pop(overload, None)
        for overload, positions in MIXED_PRECISION_NORMS.items():
            if overload in table:
                table[overload] = _in_parameter_precision(table[overload], positions)
        kept_on: dict = {}
        for device, names in (opts.keep_on or {}).items():
            for name in names:
                for overload in compat.overloads_of(compat.resolve_op(name)):
                    kept_on.setdefault(overload, set()).add(device)
        for overload, devices in kept_on.items():
            if overload in table:
                table[overload] = _unless_on(table[overload], frozenset(devices))
        if opts.table == "core-aten" and opts.one_pixel_convs_as_linear and aten.convolution.default not in table:
            table[aten.convolution.default] = one_pixel_convolution_as_linear
        return table

    def run(self, graph: torch.fx.GraphModule, context: PassContext) -> torch.fx.GraphModule:
        table = self.table()
        if not table:
            context.note("empty decomposition table: graph unchanged")
            return graph
        with torch.no_grad():
            return compat.retrace(graph, context.example_inputs, decompositions=table)


#: Normalizations ATen computes in float32 for float16/bfloat16 activations with float32 weights
#: (CPU autocast runs them so), returning float32 statistics and weight gradients: operator ->
#: (positions of the activations, positions of the weights). torch's decompositions compute in
#: the activations' type instead, so a decomposed forward saved bfloat16 statistics for a backward
#: that ATen (kept by ``keep_on``) then refused, and decomposed backwards summed weight gradients
#: from rounded values.
MIXED_PRECISION_NORMS = {
    aten.native_layer_norm.default: ((0,), (2, 3)),
    aten.native_group_norm.default: ((0,), (1, 2)),
    aten.native_batch_norm.default: ((0,), (1, 2)),
    aten._native_batch_norm_legit.default: ((0,), (1, 2)),
    aten._native_batch_norm_legit.no_stats: ((0,), (1, 2)),
    aten._native_batch_norm_legit_functional.default: ((0,), (1, 2)),
    aten._native_batch_norm_legit_no_training.default: ((0,), (1, 2)),
    aten.native_layer_norm_backward.default: ((0, 1), (5, 6)),
    aten.native_group_norm_backward.default: ((0, 1), (4,)),
    aten.native_batch_norm_backward.default: ((0, 1), (2,)),
}


def _in_parameter_precision(decomposition, positions: tuple):
    """``decomposition`` of a normalization (or its backward), run on the activations converted to
    float32 when they are float16/bfloat16 and the weights float32, with its first result (the
    output, or the input's gradient) converted back, as ATen computes it."""
    activations, weights = positions

    def decompose_in_parameter_precision(*args, **kwargs):
        low = [args[p] for p in activations if isinstance(args[p], torch.Tensor)]
        given = [args[p] for p in weights if p < len(args) and isinstance(args[p], torch.Tensor)]
        if not (low and given and all(a.dtype in (torch.float16, torch.bfloat16) for a in low)
                and all(w.dtype == torch.float32 for w in given)):
            return decomposition(*args, **kwargs)
        dtype = low[0].dtype
        out = decomposition(*[a.float() if i in activations and isinstance(a, torch.Tensor) else a
                              for i, a in enumerate(args)], **kwargs)
        if out is NotImplemented:       # the decomposition declines: traced as the operator
            return out
        first = out[0].to(dtype) if isinstance(out[0], torch.Tensor) else out[0]
        return (first, *out[1:])
    return decompose_in_parameter_precision


def _unless_on(decomposition, devices: frozenset):
    """``decomposition``, except for calls on ``devices``: those trace as the operator itself
    (``make_fx`` takes a table entry's ``NotImplemented`` as "do not decompose")."""
    def decompose_unless_kept(*args, **kwargs):
        if _device_type(list(args) + list(kwargs.values())) in devices:
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decompose_unless_kept


def one_pixel_convolution_as_linear(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                                    groups):
    """A 2-D 1x1 convolution (groups 1, no padding) of a 1x1 image as a linear layer on the
    ``[N, C]`` matrix of its pixels; ``NotImplemented`` (left as it is) for any other convolution."""
    if transposed or groups != 1 or x.dim() != 4 or weight.dim() != 4 or any(p != 0 for p in padding):
        return NotImplemented
    if not (weight.shape[2] == 1 and weight.shape[3] == 1 and x.shape[2] == 1 and x.shape[3] == 1):
        return NotImplemented
    batch, channels, out = x.shape[0], x.shape[1], weight.shape[0]
    matrix = aten.t.default(aten.reshape.default(weight, [out, channels]))
    pixels = aten.reshape.default(x, [batch, channels])
    product = aten.mm.default(pixels, matrix) if bias is None else aten.addmm.default(bias, pixels, matrix)
    return aten.reshape.default(product, [batch, out, 1, 1])


def _device_type(values: list) -> str | None:
    """The device type of the first tensor among ``values`` (or in a list or tuple among them)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            return value.device.type
        if isinstance(value, (list, tuple)):
            found = _device_type(list(value))
            if found is not None:
                return found
    return None


def core_aten_check(gm: torch.fx.GraphModule) -> str | None:
    """Invariant 'core-aten': no operator left that the core-ATen table would decompose."""
    table = compat.core_aten_table()
    left = sorted({compat.op_name(n.target) for n in gm.graph.nodes
                   if n.op == "call_function" and n.target in table})
    return f"operators still decomposable: {', '.join(left)}" if left else None
