"""Operator rules: one entry per fusable pointwise ATen operator, which every backend renders.

A rule computes its operator from the node's operands as :class:`Value` s, expressions built with
Python operators (``x + y``, ``x * 0.5``, ``x > 0``) and the functions below (:func:`exp`,
:func:`where`, :func:`keep_nan`...). Rendering (:func:`render`) hands the expression to a backend's
:class:`Emitter`, which only knows how to spell each primitive: C++ in ``passes/codegen/cpp/ops.py``,
Triton in ``passes/codegen/triton/ops.py``. So what an operator computes, the type its operands are
converted to and where it rounds half-precision values are written once, here.

Where the backends deliberately compute something differently, the rule names the spot as a
:func:`formula`: a named sub-expression with a default that an emitter may spell its own way
(Triton's GELU and rsqrt, C++'s GELU erf, how eager forms ``x ** 3`` on each device, the sigmoid
form of ``1 + tanh(u)``). The difference then lives in one emitter method, not in a second copy
of the operator.

Rounding: values are computed in a *compute type* (fp32 for fp16/bf16/fp32, fp64, int64 for
integers, bool), and a half-precision result is rounded to its dtype after every operator when the
kernel emulates eager (``codegen.emulate_precision_casts``), or always for a rule declared
``rounding="always"`` (an explicit cast). A rule that rounds inside itself, as eager's kernels do
for ``x ** 3``, writes :meth:`Value.rounded` at that spot.

``fuse`` fuses exactly the operators with a rule (:func:`pointwise`, :func:`problem`). A plugin adds
one by importing this module and decorating a function with :func:`rule`; both backends then
generate it.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from typing import Any, Callable, Literal

import attrs
import torch
import torch.fx

from .nodes import PAD, UNIT_RESHAPES, meta_of, packet_name, promoted_dtype, value_dtype
from .values import (HALF, Emitter, Value, absolute, acos, asin, atan, ceil, compute_dtype, cos, cosh, erf, exp,
                     exp2, expm1, floor, formula, integer_division, keep_nan, lift, log, log1p, log2, power, sin,
                     sinh, sqrt, tan, tanh, trunc, where)

# What a rule (a plugin's too) is written with: the registry, and the expression vocabulary.
__all__ = ["rule", "Rule", "RULES", "Operands", "render", "pointwise", "problem", "transcendental", "fingerprint", "cache_material",
           "Emitter", "Value", "compute_dtype", "formula", "keep_nan", "lift", "where", "power", "absolute", "exp",
           "exp2", "expm1", "log", "log1p", "log2", "sqrt", "sin", "cos", "tan", "tanh", "atan", "asin", "acos",
           "sinh", "cosh", "erf", "floor", "ceil", "trunc"]


class Operands:
    """What a rule computes from: the node's operands as Values, its parameters, its dtype.

    ``op[i]`` is operand ``i`` converted to the rule's operand type (``Rule.operands``: the
    output's compute type, the promotion of the operands, or each operand's own); ``op.at(i,
    dtype)`` converts it to ``dtype``'s compute type instead."""

    def __init__(self, node: torch.fx.Node, operands: str, emulate: bool):
        self.node = node
        self.name = packet_name(node.target)
        self.args = list(node.args)
        self.dtype: torch.dtype = meta_of(node).dtype      # the output's
        self.compute = compute_dtype(self.dtype)
        self.emulate = emulate                              # the kernel rounds half values as eager
        self._operands = operands

    def __getitem__(self, index: int) -> Value:
        if self._operands == "own":
            return self.value(self.args[index], value_dtype(self.args[index]))
        if self._operands == "promoted":
            return self.at(index, promoted_dtype(self.args[:2]))
        return self.at(index, self.dtype)

    def at(self, index: int, dtype: torch.dtype) -> Value:
        """Operand ``index`` converted to ``dtype``'s compute type."""
        return self.value(self.args[index], dtype)

    def value(self, arg: Any, dtype: torch.dtype) -> Value:
        """A graph value (or Python scalar) converted to ``dtype``'s compute type; a graph value
        other than an operand must be one the kernel computes (a group input is loaded per
        consumer)."""
        dtype = compute_dtype(dtype)
        if isinstance(arg, torch.fx.Node):
            return Value("operand", dtype=dtype, param=arg)
        return Value("literal", dtype=dtype, param=arg)

    def param(self, index: int, keyword: str, default: Any = None) -> Any:
        """A non-tensor argument: positional ``index``, else keyword ``keyword``, else ``default``."""
        if index < len(self.args):
            return self.args[index]
        return self.node.kwargs.get(keyword, default)


@attrs.frozen
class Rule:
    """How one ATen operator (``name``, an overload packet such as ``aten.add``) is computed.

    - ``compute(op)``: the operator's value from :class:`Operands`, as a :class:`Value`;
    - ``operands``: the type ``op[i]`` converts operands to: ``output`` (the output's compute
      type), ``promoted`` (torch's promotion of the first two operands: comparisons) or ``own``
      (each its own: casts, isnan);
    - ``rounding``: ``emulated`` (a half-precision result rounds when the kernel emulates eager)
      or ``always`` (it always rounds: an explicit cast);
    - ``problem(node)``: why this node cannot be generated (kwargs or dtypes no backend handles),
      or None; ``fuse`` leaves such a node out of every group;
    - ``transcendental``: it evaluates an exp/log/trig/erf-like function, so a kernel would rather
      keep its value than compute it again (the C++ backend's row buffers).
    """

    name: str
    compute: Callable[[Operands], Value]
    operands: Literal["output", "promoted", "own"] = "output"
    rounding: Literal["emulated", "always"] = "emulated"
    problem: Callable[[torch.fx.Node], str | None] | None = None
    transcendental: bool = False


RULES: dict[str, Rule] = {}


def rule(*names: str, operands: Literal["output", "promoted", "own"] = "output",
         rounding: Literal["emulated", "always"] = "emulated",
         problem: Callable[[torch.fx.Node], str | None] | None = None,
         transcendental: bool = False, replace: bool = False) -> Callable:
    """Register the decorated function as the rule of each operator in ``names`` (see
    :class:`Rule` for the options). An operator that already has a rule is an error naming both
    functions, unless ``replace``."""
    def register(compute: Callable[[Operands], Value]) -> Callable[[Operands], Value]:
        for name in names:
            if name in RULES and not replace:
                old = RULES[name].compute
                raise ValueError(f"{name} already has an operator rule ({old.__module__}.{old.__qualname__}); "
                                 f"{compute.__module__}.{compute.__qualname__} would replace it: pass "
                                 "replace=True to mean that")
            RULES[name] = Rule(name, compute, operands, rounding, problem, transcendental)
        return compute
    return register


def pointwise(name: str) -> bool:
    """Whether the operator ``name`` (``aten.add``) has a rule: ``fuse`` may put it in a group."""
    return name in RULES


def transcendental(name: str) -> bool:
    """Whether the operator's rule evaluates an expensive function (see :class:`Rule`)."""
    return name in RULES and RULES[name].transcendental


def problem(node: torch.fx.Node) -> str | None:
    """Why ``node`` cannot be computed by a rule (no rule, or its rule refuses it), or None."""
    name = packet_name(node.target)
    if name not in RULES:
        return f"{name} has no operator rule"
    check = RULES[name].problem
    return check(node) if check is not None else None


def fingerprint() -> str:
    """A hash of the rule table: each operator with its options and the module, name and source
    of its functions (what a cache of generated code must tell apart when a plugin adds or
    replaces rules)."""
    digest = hashlib.sha256()
    for name in sorted(RULES):
        found = RULES[name]
        digest.update(f"{name}\0{found.operands}\0{found.rounding}\0{found.transcendental}\0".encode())
        for function in (found.compute, found.problem):
            digest.update(_described(function).encode() + b"\0")
    return digest.hexdigest()[:32]


def cache_material(self: Any) -> str:
    """``Pass.cache_material`` of the passes whose output follows the rule table (fuse, codegen,
    matmul-template): the table's :func:`fingerprint`."""
    return fingerprint()


@functools.lru_cache(maxsize=None)
def _described(function: Callable | None) -> str:
    """A rule function's name and source (read once per function: every cache key needs them)."""
    if function is None:
        return ""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        source = ""
    return f"{function.__module__}.{function.__qualname__}\n{source}"


# Values that are their input inside a group: reshapes of size-1 axes, and an output pad (the
# store lands in the padded layout: passes.kernel_ir.groups.PAD). fuse admits them by shape.
PASSTHROUGH = UNIT_RESHAPES | {PAD}
_PASSTHROUGH = Rule("passthrough", lambda op: op[0])


def render(node: torch.fx.Node, emitter: Emitter) -> str:
    """The source computing ``node`` in its compute type: its rule's expression, a half-precision
    result rounded as the rule says, spelled by ``emitter``. Raises NotImplementedError (the
    group then runs eagerly) for a node no rule computes or one its emitter cannot spell."""
    if packet_name(node.target) in PASSTHROUGH:
        found = _PASSTHROUGH
    else:
        why = problem(node)
        if why is not None:
            raise NotImplementedError(why)
        found = RULES[packet_name(node.target)]
    value = found.compute(Operands(node, found.operands, emitter.emulate))
    if emitter.emulate or found.rounding == "always":
        value = value.rounded(meta_of(node).dtype)
    return emitter.emit(value)


# -- the built-in rules ---------------------------------------------------------------------------
def _one_plus_tanh(op: Operands) -> tuple[torch.fx.Node, float, torch.dtype] | None:
    """``(u, 1.0, dtype of tanh(u))`` when the node is ``1 + tanh(u)`` (either order), ``(u, -1.0,
    dtype)`` for ``1 - tanh(u)``, with tanh and u computed in this kernel in fp32 (a group input's
    loads are made per consumer, and the add is not one of the input's consumers)."""
    args = op.args
    if op.compute != torch.float32 or op.node.kwargs.get("alpha", 1) != 1 or len(args) != 2:
        return None

    def is_tanh(value: Any) -> bool:
        return isinstance(value, torch.fx.Node) and value.op == "call_function" \
            and packet_name(value.target) == "aten.tanh" and compute_dtype(meta_of(value).dtype) == torch.float32 \
            and isinstance(value.args[0], torch.fx.Node) and value.args[0].op == "call_function"

    def is_one(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1

    if op.name == "aten.add":
        for i in (0, 1):
            if is_tanh(args[i]) and is_one(args[1 - i]):
                return args[i].args[0], 1.0, meta_of(args[i]).dtype
    elif is_one(args[0]) and is_tanh(args[1]):
        return args[1].args[0], -1.0, meta_of(args[1]).dtype
    return None


@rule("aten.add", "aten.sub")
def add_sub(op: Operands) -> Value:
    """``x + alpha * y`` (``x - alpha * y``).

    ``1 ± tanh(u)`` is also ``2 * sigmoid(±2u)`` = ``2 / (1 + exp(∓2u))``: one exp and a division,
    and more accurate where tanh(u) is near -1 (no cancellation); GPT-2's tanh GELU, written with
    Python operators, runs on it. An emitter whose tanh is dear takes that form (formula
    ``one_plus_tanh``). When tanh's result is half precision and the kernel emulates eager, eager
    rounds tanh(u) before the add, so the form is ``1 ± half(1 - 2 / (1 + exp(2u)))`` instead
    (the sigmoid form's extra accuracy moved GPT-2's logits away from eager's)."""
    x, y = op[0], op[1]
    alpha = op.node.kwargs.get("alpha", 1)
    if alpha != 1:
        y = y * alpha
    plain = x + y if op.name == "aten.add" else x - y
    shifted = _one_plus_tanh(op)
    if shifted is None:
        return plain
    node, sign, tanh_dtype = shifted
    u = op.value(node, torch.float32)
    if op.emulate and tanh_dtype in HALF:
        t = (1.0 - 2.0 / (1.0 + exp(2.0 * u))).rounded(tanh_dtype)
        sigmoid_form = 1.0 + t if sign > 0 else 1.0 - t
    else:
        sigmoid_form = 2.0 / (1.0 + exp(-2.0 * sign * u))
    return formula("one_plus_tanh", sigmoid_form, otherwise=plain)


@rule("aten.mul")
def mul(op: Operands) -> Value:
    """``x * y``."""
    return op[0] * op[1]


def _division_problem(node: torch.fx.Node) -> str | None:
    rounding = node.kwargs.get("rounding_mode")
    floating = meta_of(node).dtype.is_floating_point
    if rounding is not None and (floating or rounding not in ("floor", "trunc")):
        return f"div with rounding_mode={rounding!r} of floating point values"
    if rounding is not None and (type(node.args[1]) is not int or node.args[1] == 0):
        return "integer division by a tensor (eager raises on a zero divisor; a kernel cannot)"
    if rounding is None and not floating:
        return "integer division"
    return None


@rule("aten.div", "prims.div", problem=_division_problem)
def div(op: Operands) -> Value:
    """True division of floating point values; integers divided by a nonzero integer literal with
    ``rounding_mode`` floor or trunc (an index's ``i // k``)."""
    rounding = op.node.kwargs.get("rounding_mode")
    if rounding is not None:
        return integer_division(op[0], op[1], rounding)
    return op[0] / op[1]


@rule("aten.neg")
def neg(op: Operands) -> Value:
    """``-x``."""
    return -op[0]


@rule("aten.abs")
def abs_(op: Operands) -> Value:
    """``|x|`` (a bool is its own)."""
    return op[0] if op.compute == torch.bool else absolute(op[0])


_ELEMENTARY = {"aten.exp": exp, "aten.exp2": exp2, "aten.expm1": expm1, "aten.log": log, "aten.log1p": log1p,
               "aten.log2": log2, "aten.sin": sin, "aten.cos": cos, "aten.tan": tan, "aten.tanh": tanh,
               "aten.atan": atan, "aten.asin": asin, "aten.acos": acos, "aten.sinh": sinh, "aten.cosh": cosh,
               "aten.erf": erf}


def _elementary_rule(name: str, function: Callable[[Value], Value]) -> None:
    def compute(op: Operands) -> Value:
        return function(op[0])
    compute.__name__ = compute.__qualname__ = function.__name__
    compute.__doc__ = f"{name}: {function.__doc__}"
    rule(name, transcendental=True)(compute)


for _name, _function in _ELEMENTARY.items():
    _elementary_rule(_name, _function)


@rule("aten.sqrt")
def sqrt_(op: Operands) -> Value:
    """The correctly rounded square root."""
    return sqrt(op[0])


@rule("aten.rsqrt")
def rsqrt(op: Operands) -> Value:
    """``1 / sqrt(x)`` (formula ``rsqrt``: Triton's fp32 kernels take the hardware approximation,
    as ATen's CUDA kernels call ``rsqrtf``)."""
    x = op[0]
    return formula("rsqrt", x, otherwise=1.0 / sqrt(x))


@rule("aten.reciprocal")
def reciprocal(op: Operands) -> Value:
    """``1 / x``."""
    return 1.0 / op[0]


@rule("aten.sigmoid", transcendental=True)
def sigmoid(op: Operands) -> Value:
    """``1 / (1 + exp(-x))``."""
    return 1.0 / (1.0 + exp(-op[0]))


@rule("aten.silu", transcendental=True)
def silu(op: Operands) -> Value:
    """``x * sigmoid(x)``, written ``x / (1 + exp(-x))``."""
    x = op[0]
    return x / (1.0 + exp(-x))


@rule("aten.floor", "aten.ceil", "aten.trunc")
def integral(op: Operands) -> Value:
    """Round to an integral value (integers are their own)."""
    x = op[0]
    if op.compute not in (torch.float32, torch.float64):
        return x
    return {"aten.floor": floor, "aten.ceil": ceil, "aten.trunc": trunc}[op.name](x)


@rule("aten.sign")
def sign(op: Operands) -> Value:
    """``(x > 0) - (x < 0)``: -1, 0 or 1, and 0 for NaN, as eager's kernels compute it (a bool is
    its own)."""
    x = op[0]
    if op.compute == torch.bool:
        return x
    return (x > 0).to(op.dtype) - (x < 0).to(op.dtype)


@rule("aten.relu")
def relu(op: Operands) -> Value:
    """``max(x, 0)``, NaN propagating."""
    x = op[0]
    return keep_nan(x, where(x > 0, x, 0))


@rule("aten.maximum", "aten.minimum")
def maximum_minimum(op: Operands) -> Value:
    """The larger (smaller) operand; NaN wins, as in eager: x where x is NaN, else the select
    (which picks y when y is NaN)."""
    x, y = op[0], op[1]
    return keep_nan(x, where(x > y if op.name == "aten.maximum" else x < y, x, y))


def _clamp_bounds(node: torch.fx.Node) -> tuple[Any, Any]:
    """(low, high) bounds of a clamp-like node; None where a side is unbounded."""
    name = packet_name(node.target)
    args, kw = list(node.args), node.kwargs
    if name == "aten.clamp_min":
        return args[1], None
    if name == "aten.clamp_max":
        return None, args[1]
    if name == "aten.hardtanh":
        return (args[1] if len(args) > 1 else kw.get("min_val", -1.0),
                args[2] if len(args) > 2 else kw.get("max_val", 1.0))
    return (args[1] if len(args) > 1 else kw.get("min"),
            args[2] if len(args) > 2 else kw.get("max"))


def _clamp_problem(node: torch.fx.Node) -> str | None:
    if any(isinstance(bound, torch.fx.Node) for bound in _clamp_bounds(node)):
        return f"{packet_name(node.target).split('.')[-1]} with tensor bounds"
    return None


@rule("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh", problem=_clamp_problem)
def clamp(op: Operands) -> Value:
    """x limited to literal bounds. Comparisons with NaN are false, so NaN passes both selects."""
    low, high = _clamp_bounds(op.node)
    out = op[0]
    if low is not None:
        out = where(out < low, low, out)
    if high is not None:
        out = where(out > high, high, out)
    return out


@rule("aten.leaky_relu")
def leaky_relu(op: Operands) -> Value:
    """x where positive, else ``x * negative_slope``."""
    x = op[0]
    return where(x > 0, x, x * op.param(1, "negative_slope", 0.01))


@rule("aten.where")
def where_(op: Operands) -> Value:
    """``a`` where the condition holds, else ``b``."""
    return where(op.at(0, torch.bool), op[1], op[2])


_COMPARISONS = {"aten.gt": Value.__gt__, "aten.ge": Value.__ge__, "aten.lt": Value.__lt__, "aten.le": Value.__le__,
                "aten.eq": Value.eq, "aten.ne": Value.ne}


@rule(*_COMPARISONS, operands="promoted")
def comparison(op: Operands) -> Value:
    """A comparison, in the type torch promotes its operands to."""
    return _COMPARISONS[op.name](op[0], op[1])


_BITWISE = {"aten.bitwise_and": Value.__and__, "aten.bitwise_or": Value.__or__, "aten.bitwise_xor": Value.__xor__}


@rule(*_BITWISE)
def bitwise(op: Operands) -> Value:
    """``&``, ``|``, ``^`` (on bool values the logical operators)."""
    return _BITWISE[op.name](op[0], op[1])


@rule("aten.bitwise_not")
def bitwise_not(op: Operands) -> Value:
    """``~x`` (on bool values the logical not)."""
    return ~op[0]


@rule("aten.logical_not")
def logical_not(op: Operands) -> Value:
    """Not x (nonzero is true)."""
    return ~op.at(0, torch.bool)


@rule("aten.logical_and", "aten.logical_or")
def logical(op: Operands) -> Value:
    """x and (or) y (nonzero is true)."""
    x, y = op.at(0, torch.bool), op.at(1, torch.bool)
    return x & y if op.name == "aten.logical_and" else x | y


@rule("aten.isnan", operands="own")
def isnan(op: Operands) -> Value:
    """True where x is NaN."""
    return op[0].isnan()


def _copy_problem(node: torch.fx.Node) -> str | None:
    if packet_name(node.target) != "aten._to_copy":
        return None
    extra = set(node.kwargs) - {"dtype", "layout", "device", "memory_format"}
    if extra or meta_of(node).device != meta_of(node.args[0]).device:
        return "_to_copy that changes more than the dtype"
    return None


@rule("aten._to_copy", "prims.convert_element_type", operands="own", rounding="always", problem=_copy_problem)
def convert(op: Operands) -> Value:
    """x converted to the node's dtype; a cast to a half type always rounds (it is the point of
    the cast)."""
    return op[0].to(op.dtype)


@rule("aten.clone", "aten.alias")
def copy(op: Operands) -> Value:
    """x itself."""
    return op[0]


def _pow_problem(node: torch.fx.Node) -> str | None:
    base, exponent = node.args[0], node.args[1]
    if compute_dtype(meta_of(node).dtype) in (torch.float32, torch.float64):
        return None
    if isinstance(base, torch.fx.Node) and not isinstance(exponent, torch.fx.Node) and exponent in (1, 2):
        return None
    return "integer pow (other than x ** 1 and x ** 2)"


@rule("aten.pow", problem=_pow_problem, transcendental=True)
def pow_(op: Operands) -> Value:
    """x ** y. Constant exponents 1, 2 and 0.5 are a copy, a product and a square root. ``x ** 3``
    is a product where eager's kernel on the backend's device computes it as ``x * x * x`` in the
    tensor's own dtype (formula ``cube``): the square is then rounded to a half dtype before the
    last product, as eager rounds it."""
    base, exponent = op.args[0], op.args[1]
    if isinstance(exponent, torch.fx.Node) or not isinstance(base, torch.fx.Node):
        return power(op[0], op[1])
    exponent = int(exponent) if isinstance(exponent, bool) else exponent
    x = op[0]
    if exponent == 1:
        return x
    if exponent == 2:
        return x * x
    if exponent == 0.5:
        return sqrt(x)
    if exponent == 3:
        square = (x * x).rounded(op.dtype) if op.emulate else x * x
        return formula("cube", square * x, otherwise=power(x, 3.0), param=op.dtype)
    return power(x, float(exponent))


@rule("aten.gelu", transcendental=True)
def gelu(op: Operands) -> Value:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"`` ``0.5 * x * (1 +
    tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``. The erf form is formula ``gelu`` (Triton's
    fp32 kernels compute x * Phi(x) from one fitted polynomial), and its erf formula ``gelu_erf``
    (the C++ kernels use the erf of ATen's vectorized CPU GELU)."""
    x = op[0]
    if op.param(1, "approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    u = x * 0.7071067811865476
    return formula("gelu", x, otherwise=0.5 * x * (1.0 + formula("gelu_erf", u, otherwise=erf(u))))
