"""``numpy-backend``: a third-party code generation backend for plan-pipeline, for debugging.

It reads the same fused-group description as the built-in ``codegen`` pass
(:class:`passes.kernel_ir.groups.FusedGroup`: a subgraph of ATen ops, its domain and reduced axes) and
generates, for each group, a readable Python function that computes it with numpy, by default in
float64. The result is a reference implementation of every fused group that shares no code with
torch's kernels or with the generated C++/Triton ones: when a compiled model disagrees with eager,
compiling it with the ``numpy-reference`` plan tells whether the fused groups themselves are right.

- Every float value is computed in ``compute_dtype`` (float64 by default) and, with
  ``emulate_precision_casts`` (the default), rounded to its own dtype after every op, as eager
  does for float16/bfloat16/float32 values; integers and booleans keep their dtype.
- ``kinds`` selects which groups run through numpy (``pointwise``, ``reduction``); the others
  are left as they are, so a later ``codegen`` pass can compile them: delegating only the
  reductions to numpy is ``numpy-backend: {kinds: [reduction]}`` followed by ``codegen``.
- A group with an op this backend has no rule for keeps running eagerly, with the reason noted.
- Outputs get the strides eager would give them, on the inputs' device; the numpy work itself
  runs on the CPU.

The plan ``numpy-reference`` (``plans/numpy-reference.yaml``) is the default plan with
``codegen`` replaced by this pass and ``verify: final``.

Written only against the public API: ``pipeline`` and ``passes.kernel_ir.groups``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Literal

import attrs
import numpy as np
import torch
import torch.fx

import pipeline
from passes.kernel_ir.groups import CompiledKernel, FusedGroup, packet_name

__version__ = "0.1.0"

PLANS_DIR = Path(__file__).parent / "plans"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Unsupported(Exception):
    """A group this backend cannot express in numpy (the message says which op and why)."""


# -- what each op becomes ------------------------------------------------------------------------
# A rule maps the op's argument expressions (already rendered as Python source) to one numpy
# expression. ``a`` is the positional arguments, ``k`` the keyword arguments.
Rule = Callable[[list, dict], str]


def _unary(fn: str) -> Rule:
    return lambda a, k: f"{fn}({a[0]})"


def _binary(fn: str) -> Rule:
    return lambda a, k: f"{fn}({a[0]}, {a[1]})"


def _add_sub(fn: str) -> Rule:
    def rule(a: list, k: dict) -> str:
        alpha = k.get("alpha", "1")
        other = a[1] if alpha == "1" else f"({alpha} * {a[1]})"
        return f"{fn}({a[0]}, {other})"
    return rule


def _clamp(a: list, k: dict) -> str:
    low = a[1] if len(a) > 1 else k.get("min", "None")
    high = a[2] if len(a) > 2 else k.get("max", "None")
    return f"clamp({a[0]}, {low}, {high})"


def _hardtanh(a: list, k: dict) -> str:
    low = a[1] if len(a) > 1 else k.get("min_val", "-1.0")
    high = a[2] if len(a) > 2 else k.get("max_val", "1.0")
    return f"clamp({a[0]}, {low}, {high})"


def _gelu(a: list, k: dict) -> str:
    approximate = k.get("approximate", a[1] if len(a) > 1 else "'none'")
    return f"gelu_tanh({a[0]})" if approximate == "'tanh'" else f"gelu_erf({a[0]})"


def _leaky_relu(a: list, k: dict) -> str:
    slope = a[1] if len(a) > 1 else k.get("negative_slope", "0.01")
    return f"np.where({a[0]} > 0, {a[0]}, {a[0]} * {slope})"


def _cast(a: list, k: dict) -> str:
    dtype = a[1] if len(a) > 1 else k.get("dtype", "None")
    return a[0] if dtype == "None" else f"cast({a[0]}, {dtype})"


def _sum(a: list, k: dict) -> str:
    dims = a[1] if len(a) > 1 else k.get("dim", "None")
    keepdim = a[2] if len(a) > 2 else k.get("keepdim", "False")
    value = a[0] if k.get("dtype", "None") == "None" else f"cast({a[0]}, {k['dtype']})"
    return f"np.sum({value}, axis=axes({dims}, {a[0]}.ndim), keepdims={keepdim})"


def _prims_sum(a: list, k: dict) -> str:
    return f"np.sum({a[0]}, axis=axes({a[1]}, {a[0]}.ndim))"


def _extremum(fn: str) -> Rule:
    def rule(a: list, k: dict) -> str:
        dims = a[1] if len(a) > 1 else k.get("dim", "()")
        keepdim = a[2] if len(a) > 2 else k.get("keepdim", "False")
        return f"{fn}({a[0]}, axis=axes({dims}, {a[0]}.ndim), keepdims={keepdim})"
    return rule


def _arg_extremum(fn: str) -> Rule:
    def rule(a: list, k: dict) -> str:
        dim = a[1] if len(a) > 1 else k.get("dim", "None")
        keepdim = a[2] if len(a) > 2 else k.get("keepdim", "False")
        return f"arg_extremum({fn}, {a[0]}, {dim}, {keepdim})"
    return rule


def _prod(a: list, k: dict) -> str:
    dims = a[1] if len(a) > 1 else k.get("dim", "None")
    keepdim = a[2] if len(a) > 2 else k.get("keepdim", "False")
    return f"np.prod({a[0]}, axis=axes({dims}, {a[0]}.ndim), keepdims={keepdim})"


def _reshape(a: list, k: dict) -> str:
    return f"np.reshape({a[0]}, {a[1]})"


def _squeeze(a: list, k: dict) -> str:
    if len(a) == 1:
        return f"np.squeeze({a[0]})"
    return f"squeeze({a[0]}, {a[1]})"


def _expand(a: list, k: dict) -> str:
    return f"expand({a[0]}, {a[1]})"


def _broadcast_in_dim(a: list, k: dict) -> str:
    return f"broadcast_in_dim({a[0]}, {a[1]}, {a[2]})"


def _iota(a: list, k: dict) -> str:
    return f"({k.get('start', '0')} + {k.get('step', '1')} * np.arange({a[0]}))"


def _arange(a: list, k: dict) -> str:
    bounds = a if a else [k.get("end", "0")]
    return f"np.arange({', '.join(bounds)}{', ' + k['step'] if 'step' in k else ''})"


RULES: dict[str, Rule] = {
    "aten.add": _add_sub("np.add"), "aten.sub": _add_sub("np.subtract"), "aten.mul": _binary("np.multiply"),
    "aten.div": lambda a, k: f"divide({a[0]}, {a[1]}, {k.get('rounding_mode', 'None')})",
    "prims.div": _binary("np.true_divide"),
    "aten.neg": _unary("np.negative"), "aten.abs": _unary("np.abs"), "aten.exp": _unary("np.exp"),
    "aten.exp2": _unary("np.exp2"), "aten.expm1": _unary("np.expm1"), "aten.log": _unary("np.log"),
    "aten.log1p": _unary("np.log1p"), "aten.log2": _unary("np.log2"), "aten.sqrt": _unary("np.sqrt"),
    "aten.rsqrt": lambda a, k: f"(1.0 / np.sqrt({a[0]}))", "aten.reciprocal": lambda a, k: f"(1.0 / {a[0]})",
    "aten.sin": _unary("np.sin"), "aten.cos": _unary("np.cos"), "aten.tan": _unary("np.tan"),
    "aten.tanh": _unary("np.tanh"), "aten.atan": _unary("np.arctan"), "aten.asin": _unary("np.arcsin"),
    "aten.acos": _unary("np.arccos"), "aten.sinh": _unary("np.sinh"), "aten.cosh": _unary("np.cosh"),
    "aten.sigmoid": _unary("sigmoid"), "aten.silu": lambda a, k: f"({a[0]} * sigmoid({a[0]}))",
    "aten.relu": lambda a, k: f"relu({a[0]})", "aten.erf": _unary("erf"), "aten.gelu": _gelu,
    "aten.leaky_relu": _leaky_relu, "aten.hardtanh": _hardtanh,
    "aten.floor": _unary("np.floor"), "aten.ceil": _unary("np.ceil"), "aten.trunc": _unary("np.trunc"),
    "aten.sign": _unary("sign"), "aten.isnan": _unary("np.isnan"),
    "aten.maximum": _binary("np.maximum"), "aten.minimum": _binary("np.minimum"),
    "aten.clamp": _clamp, "aten.clamp_min": lambda a, k: f"clamp({a[0]}, {a[1]}, None)",
    "aten.clamp_max": lambda a, k: f"clamp({a[0]}, None, {a[1]})",
    "aten.where": lambda a, k: f"np.where({a[0]}, {a[1]}, {a[2]})",
    "aten.gt": _binary("np.greater"), "aten.ge": _binary("np.greater_equal"), "aten.lt": _binary("np.less"),
    "aten.le": _binary("np.less_equal"), "aten.eq": _binary("np.equal"), "aten.ne": _binary("np.not_equal"),
    "aten.logical_not": _unary("np.logical_not"), "aten.logical_and": _binary("np.logical_and"),
    "aten.logical_or": _binary("np.logical_or"), "aten.pow": _binary("np.power"),
    "aten.bitwise_and": _binary("np.bitwise_and"), "aten.bitwise_or": _binary("np.bitwise_or"),
    "aten.bitwise_xor": _binary("np.bitwise_xor"), "aten.bitwise_not": _unary("np.invert"),
    "aten._to_copy": _cast, "prims.convert_element_type": _cast,
    "aten.clone": lambda a, k: a[0], "aten.alias": lambda a, k: a[0],
    "aten.sum": _sum, "prims.sum": _prims_sum, "aten.amax": _extremum("np.max"),
    "aten.amin": _extremum("np.min"), "aten.argmax": _arg_extremum("np.argmax"),
    "aten.argmin": _arg_extremum("np.argmin"), "aten.prod": _prod,
    "aten.view": _reshape, "aten._unsafe_view": _reshape, "aten.reshape": _reshape,
    "aten.unsqueeze": lambda a, k: f"np.expand_dims({a[0]}, {a[1]})", "aten.squeeze": _squeeze,
    "aten.expand": _expand, "prims.broadcast_in_dim": _broadcast_in_dim,
    "aten.full": lambda a, k: f"np.full({a[0]}, {a[1]})", "aten.scalar_tensor": lambda a, k: f"np.array({a[0]})",
    "prims.iota": _iota, "aten.arange": _arange,
    "aten.gather": lambda a, k: f"np.take_along_axis({a[0]}, {a[2]}, axis={a[1]})",
    "aten.constant_pad_nd": lambda a, k: f"constant_pad({a[0]}, {a[1]}, {a[2] if len(a) > 2 else k.get('value', '0')})",
}


# -- helpers the generated code calls ------------------------------------------------------------
def axes(dims: Any, ndim: int) -> tuple | None:
    """ATen's reduction dims (None or [] = all axes, an int, a list) as a numpy axis tuple."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(ndim, 1) for d in dims}))


def arg_extremum(fn: Callable, x: np.ndarray, dim: int | None, keepdim: bool) -> np.ndarray:
    """argmax/argmin with ATen's conventions (dim None flattens; keepdim keeps size-1 axes)."""
    if dim is None:
        index = fn(x.reshape(-1))
        return np.reshape(index, (1,) * x.ndim) if keepdim else np.asarray(index)
    return fn(x, axis=dim % max(x.ndim, 1), keepdims=keepdim)


def clamp(x: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """torch.clamp: NaN in ``x`` stays NaN; either bound may be missing."""
    if low is not None:
        x = np.where(x < low, low, x)
    if high is not None:
        x = np.where(x > high, high, x)
    return x


def relu(x: np.ndarray) -> np.ndarray:
    """torch.relu: NaN stays NaN."""
    return np.where(x < 0, np.zeros_like(x), x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def sign(x: np.ndarray) -> np.ndarray:
    """torch.sign: sign(NaN) is 0, as eager computes it."""
    return np.where(np.isnan(x), np.zeros_like(x), np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return _ERF(x).astype(x.dtype)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def squeeze(x: np.ndarray, dims: Any) -> np.ndarray:
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [d % max(x.ndim, 1) for d in dims if x.shape[d % max(x.ndim, 1)] == 1]
    return np.squeeze(x, axis=tuple(dims)) if dims else x


def expand(x: np.ndarray, sizes: list) -> np.ndarray:
    lead = len(sizes) - x.ndim
    shape = [s if s != -1 else x.shape[i - lead] for i, s in enumerate(sizes)]
    return np.broadcast_to(x, shape)


def divide(x: np.ndarray, y: Any, rounding_mode: str | None) -> np.ndarray:
    """ATen's ``div``: true division, or rounded toward minus infinity (``floor``) or zero (``trunc``)."""
    if rounding_mode == "floor":
        return np.floor_divide(x, y)
    if rounding_mode == "trunc":
        quotient = np.floor_divide(x, y)
        return np.where((np.remainder(x, y) != 0) & ((np.asarray(x) < 0) != (np.asarray(y) < 0)), quotient + 1, quotient)
    return np.true_divide(x, y)


def constant_pad(x: np.ndarray, pad: list, value: Any) -> np.ndarray:
    """ATen's ``constant_pad_nd``: ``pad`` lists (before, after) pairs from the last dim backwards;
    a negative width cuts instead."""
    pairs = [(0, 0)] * (x.ndim - len(pad) // 2) + [(pad[2 * k], pad[2 * k + 1]) for k in reversed(range(len(pad) // 2))]
    cut = tuple(slice(max(-b, 0), x.shape[d] - max(-a, 0)) for d, (b, a) in enumerate(pairs))
    return np.pad(x[cut], [(max(b, 0), max(a, 0)) for b, a in pairs], constant_values=value)


def broadcast_in_dim(x: np.ndarray, shape: list, dims: list) -> np.ndarray:
    placed = [1] * len(shape)
    for axis, size in zip(dims, x.shape):
        placed[axis] = size
    return np.broadcast_to(np.reshape(x, placed), shape)


class _Casts:
    """Casts the generated code applies after every op: to the value's own dtype, computing floats
    in ``compute`` and (``emulate``) rounding them to their own precision first."""

    def __init__(self, compute: np.dtype, emulate: bool):
        self.compute = compute
        self.emulate = emulate

    def __call__(self, x: Any, dtype: torch.dtype) -> np.ndarray:
        x = np.asarray(x)
        if dtype in FLOAT_DTYPES:
            if self.emulate and dtype != torch.float64:
                x = round_to(x, dtype)
            return x.astype(self.compute, copy=False)
        return x.astype(torch.empty((), dtype=dtype).numpy().dtype, copy=False)


def round_to(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``x`` rounded to the precision of ``dtype`` (numpy has no bfloat16: that one rounds
    through torch, the only torch call the numpy kernels make besides moving tensors in and out)."""
    if dtype == torch.float32:
        return x.astype(np.float32)
    if dtype == torch.float16:
        return x.astype(np.float16)
    return torch.from_numpy(np.array(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


# -- the generated kernel ------------------------------------------------------------------------
def _literal(value: Any) -> str:
    """A Python literal as source (dtypes by name, infinities and NaN through numpy)."""
    if isinstance(value, torch.dtype):
        return f"torch.{str(value).removeprefix('torch.')}"
    if isinstance(value, float):
        if math.isnan(value):
            return "np.nan"
        if math.isinf(value):
            return "np.inf" if value > 0 else "-np.inf"
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        return f"[{inner}]"
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    if isinstance(value, torch.device):
        return repr(str(value))
    if isinstance(value, (torch.memory_format, torch.layout)):
        return "None"  # layout arguments of _to_copy: outputs get eager's strides anyway
    raise Unsupported(f"argument {value!r} of type {type(value).__name__}")


def numpy_source(group: FusedGroup) -> str:
    """The Python/numpy source of one fused group: one line per ATen op, each followed by the cast
    to the value's dtype. Raises :class:`Unsupported` for an op without a rule."""
    # Values are named v0, v1, ... (never after their FX node, which could shadow a helper such
    # as ``clamp``); each line ends with the node's name and ATen target.
    names: dict[torch.fx.Node, str] = {}
    params: list[str] = []
    lines: list[str] = []
    for node in group.subgraph.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"v{len(names)}"
            params.append(names[node])
        elif node.op == "call_function":
            op = packet_name(node.target)
            rule = RULES.get(op)
            if rule is None:
                raise Unsupported(f"no numpy rule for {op}")
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor):
                raise Unsupported(f"{node.name} ({op}) has no tensor metadata")
            render = lambda v: names[v] if isinstance(v, torch.fx.Node) else _literal(v)  # noqa: E731
            args = [render(a) for a in node.args]
            kwargs = {k: render(v) for k, v in node.kwargs.items()}
            names[node] = f"v{len(names)}"
            lines.append(f"    {names[node]} = cast({rule(args, kwargs)}, {_literal(value.dtype)})"
                         f"  # {node.name}: {node.target}")
        elif node.op == "output":
            outputs = ", ".join(names[n] for n in node.args[0])
            lines.append(f"    return ({outputs},)")
    head = (f"def {group.name}({', '.join(params)}):\n"
            f"    \"\"\"{group.kind} group over domain {list(group.domain)}, reduced axes {list(group.reduced)}\"\"\"")
    return "\n".join([head, *lines]) + "\n"


class NumpyKernel(CompiledKernel):
    """A fused group run by its generated numpy function: tensors in, numpy in between, tensors
    with eager's dtypes and strides out (on the inputs' device)."""

    backend = "numpy"

    def __init__(self, group: FusedGroup, source: str, compute_dtype: str, emulate: bool):
        super().__init__(group, source)
        self.compute = np.dtype(compute_dtype)
        casts = _Casts(self.compute, emulate)
        namespace: dict[str, Any] = {
            "np": np, "torch": torch, "cast": casts, "axes": axes, "arg_extremum": arg_extremum,
            "clamp": clamp, "relu": relu, "sigmoid": sigmoid, "sign": sign, "erf": erf,
            "gelu_erf": gelu_erf, "gelu_tanh": gelu_tanh, "squeeze": squeeze, "expand": expand,
            "broadcast_in_dim": broadcast_in_dim, "constant_pad": constant_pad, "divide": divide,
        }
        exec(compile(source, f"<numpy kernel {group.name}>", "exec"), namespace)  # noqa: S102 - our own generated source
        self.function = namespace[group.name]
        outputs = [n for n in group.subgraph.graph.nodes if n.op == "output"][0].args[0]
        self.outputs = [(tuple(o.meta["val"].shape), tuple(o.meta["val"].stride()), o.meta["val"].dtype)
                        for o in outputs]

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cpu"))
        arrays = [self._to_numpy(t) for t in inputs]
        with np.errstate(all="ignore"):
            results = self.function(*arrays)
        outs = []
        for value, (shape, stride, dtype) in zip(results, self.outputs):
            out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            array = np.array(np.broadcast_to(value, shape), order="C")  # a writable copy
            # An expanded output (stride 0 along a size > 1) holds one element per broadcast line:
            # write that element (torch refuses a copy into overlapping memory).
            first = tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for n, st in zip(shape, stride))
            out[first].copy_(torch.from_numpy(np.array(array[first])).to(dtype))
            outs.append(out)
        return tuple(outs)

    def _to_numpy(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        value = value.detach().cpu()
        if value.dtype in FLOAT_DTYPES:
            return value.to(torch.float64).numpy().astype(self.compute, copy=False)
        return value.numpy()


# -- the pass ------------------------------------------------------------------------------------
Kind = Literal["pointwise", "reduction"]


@attrs.frozen
class NumpyBackendOptions:
    compute_dtype: Literal["float64", "float32"] = pipeline.option(
        "float64", "numpy dtype every floating-point value is computed in.")
    emulate_precision_casts: bool = pipeline.option(
        True, "Round every float value to its own dtype (float16, bfloat16, float32) after each op, "
              "as eager does; false keeps compute_dtype precision throughout the group.")
    kinds: list[Kind] = pipeline.option(
        ["pointwise", "reduction"], "Which fused groups run through numpy; the others are left for "
                                    "a later codegen pass (or run eagerly).")


class NumpyBackend(pipeline.Pass):
    """Run fused groups through generated numpy code (float64 by default): a reference backend for
    debugging the fused groups and the code generators.

    Put it where ``codegen`` goes (after ``fuse``), or before ``codegen`` with ``kinds`` to hand
    only some groups to numpy. Every group it takes is counted as a kernel of the graph; a group
    with an op it has no rule for keeps running eagerly, with the reason in the compile record.
    """

    name = "numpy-backend"
    Options = NumpyBackendOptions
    version = "1"
    requires = frozenset({"fused"})
    provides = frozenset({"codegen"})

    def run(self, graph: torch.fx.GraphModule, context: pipeline.PassContext) -> torch.fx.GraphModule:
        taken, kept = 0, 0
        for node in graph.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, FusedGroup):
                continue
            group = node.target
            if group.kind not in self.options.kinds:
                kept += 1
                continue
            try:
                source = numpy_source(group)
            except Unsupported as exc:
                context.note(f"{group.name}: runs eagerly: {exc}")
                continue
            node.target = NumpyKernel(group, source, self.options.compute_dtype,
                                      self.options.emulate_precision_casts)
            taken += 1
        context.note(f"{taken} numpy kernel(s) ({self.options.compute_dtype})"
                     + (f"; {kept} group(s) of other kinds left for a later pass" if kept else ""))
        graph.recompile()
        return graph


@pipeline.hookimpl
def pipeline_register_passes() -> list[type]:
    return [NumpyBackend]


@pipeline.hookimpl
def pipeline_register_plans() -> list[str]:
    return [str(PLANS_DIR)]


__all__ = ["NumpyBackend", "NumpyBackendOptions", "NumpyKernel", "numpy_source", "RULES"]
