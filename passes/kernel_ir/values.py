"""The expressions operator rules are written in (:class:`Value`) and the :class:`Emitter` that
spells them in one backend's source. See :mod:`passes.kernel_ir.rules`."""
from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

HALF = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, torch.float64)          # compute types that are floating point


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: fp32 for half types (as eager's kernels accumulate), fp64,
    bool, and int64 for every integer type."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return torch.float32
    if dtype in (torch.float64, torch.bool):
        return dtype
    return torch.int64


# Primitive operations of the expression tree, by kind (an Emitter method renders each kind).
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^"}
COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
UNARY = {"neg", "invert"}
# Precedence of the arithmetic operators, the same in C and Python (used to leave out parentheses).
ARITHMETIC = {"add": 1, "sub": 1, "mul": 2, "div": 2}
FUNCTIONS = {"exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "sin", "cos", "tan", "tanh", "atan",
             "asin", "acos", "sinh", "cosh", "erf", "floor", "ceil", "trunc", "abs", "pow", "floordiv", "truncdiv"}


@attrs.frozen(eq=False)
class Value:
    """One node of an operator's expression: ``op`` applied to ``args`` (Values), computed in
    ``dtype`` (a compute type, see :func:`compute_dtype`).

    Leaves are ``operand`` (``param`` is a graph value or a literal argument of the node) and
    ``literal`` (``param`` is a Python scalar). ``cast`` converts to ``dtype``; ``round`` rounds to
    the half type ``param``; a formula (``otherwise`` set) is computed as ``otherwise`` unless the
    emitter spells ``op`` itself. Values compare by identity, so ``x.eq(y)`` is the elementwise
    comparison, and they have no truth value (a rule that branches on data writes :func:`where`).
    """

    op: str
    args: tuple = ()
    dtype: torch.dtype = torch.float32
    param: Any = None
    otherwise: "Value | None" = None

    def _binary(self, op: str, other: Any, reverse: bool = False) -> "Value":
        other = lift(other, self.dtype)
        a, b = (other, self) if reverse else (self, other)
        return Value(op, (a, b), torch.bool if op in COMPARE else a.dtype)

    def __add__(self, other: Any) -> "Value":
        return self._binary("add", other)

    def __radd__(self, other: Any) -> "Value":
        return self._binary("add", other, reverse=True)

    def __sub__(self, other: Any) -> "Value":
        return self._binary("sub", other)

    def __rsub__(self, other: Any) -> "Value":
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other: Any) -> "Value":
        return self._binary("mul", other)

    def __rmul__(self, other: Any) -> "Value":
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other: Any) -> "Value":
        return self._binary("div", other)

    def __rtruediv__(self, other: Any) -> "Value":
        return self._binary("div", other, reverse=True)

    def __and__(self, other: Any) -> "Value":
        return self._binary("and", other)

    def __or__(self, other: Any) -> "Value":
        return self._binary("or", other)

    def __xor__(self, other: Any) -> "Value":
        return self._binary("xor", other)

    def __lt__(self, other: Any) -> "Value":
        return self._binary("lt", other)

    def __le__(self, other: Any) -> "Value":
        return self._binary("le", other)

    def __gt__(self, other: Any) -> "Value":
        return self._binary("gt", other)

    def __ge__(self, other: Any) -> "Value":
        return self._binary("ge", other)

    def eq(self, other: Any) -> "Value":
        """Elementwise ``==`` (bool)."""
        return self._binary("eq", other)

    def ne(self, other: Any) -> "Value":
        """Elementwise ``!=`` (bool)."""
        return self._binary("ne", other)

    def __neg__(self) -> "Value":
        return Value("neg", (self,), self.dtype)

    def __invert__(self) -> "Value":
        """Bitwise not; on bool values the logical not."""
        return Value("invert", (self,), self.dtype)

    def __bool__(self) -> bool:
        raise TypeError("a Value is an expression, not a number: select with where(), branch on the node instead")

    def to(self, dtype: torch.dtype) -> "Value":
        """This value converted to ``dtype``'s compute type (to bool: nonzero)."""
        return Value("cast", (self,), compute_dtype(dtype))

    def rounded(self, dtype: torch.dtype) -> "Value":
        """This value rounded to ``dtype``'s precision (a no-op unless ``dtype`` is fp16/bf16)."""
        return Value("round", (self,), self.dtype, dtype) if dtype in HALF else self

    def isnan(self) -> "Value":
        """True where this value is NaN."""
        return self.ne(self)


def lift(value: Any, dtype: torch.dtype) -> Value:
    """``value`` as a Value: itself when it is one, else a literal of compute type ``dtype``."""
    return value if isinstance(value, Value) else Value("literal", dtype=dtype, param=value)


def _elementary(name: str, doc: str) -> Callable[[Value], Value]:
    def function(x: Value) -> Value:
        return Value(name, (x,), x.dtype)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function


exp = _elementary("exp", "e ** x.")
exp2 = _elementary("exp2", "2 ** x.")
expm1 = _elementary("expm1", "e ** x - 1, accurate near 0.")
log = _elementary("log", "The natural logarithm.")
log1p = _elementary("log1p", "log(1 + x), accurate near 0.")
log2 = _elementary("log2", "The base-2 logarithm.")
sqrt = _elementary("sqrt", "The correctly rounded square root.")
sin = _elementary("sin", "Sine.")
cos = _elementary("cos", "Cosine.")
tan = _elementary("tan", "Tangent.")
tanh = _elementary("tanh", "Hyperbolic tangent.")
atan = _elementary("atan", "Arc tangent.")
asin = _elementary("asin", "Arc sine.")
acos = _elementary("acos", "Arc cosine.")
sinh = _elementary("sinh", "Hyperbolic sine.")
cosh = _elementary("cosh", "Hyperbolic cosine.")
erf = _elementary("erf", "The error function.")
floor = _elementary("floor", "Rounded toward -inf (floating point values).")
ceil = _elementary("ceil", "Rounded toward +inf (floating point values).")
trunc = _elementary("trunc", "Rounded toward 0 (floating point values).")
absolute = _elementary("abs", "|x|.")


def power(x: Value | float, y: Value | float) -> Value:
    """x ** y, with torch's signs and special values (either side may be a literal)."""
    dtype = (x if isinstance(x, Value) else y).dtype
    return Value("pow", (lift(x, dtype), lift(y, dtype)), dtype)


def integer_division(x: Value | int, y: Value | int, rounding: str) -> Value:
    """``x / y`` of integers rounded toward minus infinity (``floor``: Python's ``//``) or toward zero
    (``trunc``: C's ``/``), as torch's ``div(..., rounding_mode=...)`` computes integers."""
    dtype = (x if isinstance(x, Value) else y).dtype
    return Value("floordiv" if rounding == "floor" else "truncdiv", (lift(x, dtype), lift(y, dtype)), dtype)


def where(condition: Value, a: Value | float, b: Value | float) -> Value:
    """``a`` where ``condition`` holds, else ``b`` (at least one of them a Value)."""
    dtype = (a if isinstance(a, Value) else b).dtype
    return Value("where", (condition, lift(a, dtype), lift(b, dtype)), dtype)


def formula(name: str, *args: Value, otherwise: Value, param: Any = None) -> Value:
    """A spot where a backend may compute differently: ``otherwise`` unless the emitter has a
    method ``formula_<name>`` that spells it (it receives this Value, with ``args`` and ``param``,
    and may still return None for the default)."""
    return Value(name, args, otherwise.dtype, param, otherwise)


def keep_nan(x: Value, value: Value) -> Value:
    """``value``, except NaN where ``x`` is NaN (as eager's max/min/relu propagate NaN)."""
    if x.dtype not in FLOATS:
        return value
    return formula("keep_nan", x, value, otherwise=where(x.isnan(), x, value))


# -- emitters -------------------------------------------------------------------------------------
def bare(text: str) -> str:
    """``text`` without one pair of parentheses around all of it (an argument of a call needs none)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for position, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and position < len(text) - 1:
            return text         # "(a) + (b)": the first group closes early
    return text[1:-1]


class Emitter:
    """Spells Values in one backend's source. A backend subclasses it with one method per kind of
    primitive, each given the Value (whose ``args`` it renders with :meth:`emit`):

    ``literal(value, dtype)``, ``operand(arg, dtype)``, ``binary(v)`` (:data:`BINARY` and
    :data:`COMPARE`), ``unary(v)`` (neg, invert), ``function(v)`` (:data:`FUNCTIONS`), ``where(v)``,
    ``cast(v)`` (``v.args[0]`` to ``v.dtype``), ``round(v)`` (to ``v.param``); optionally
    ``formula_<name>(v)`` for a :func:`formula` it spells its own way.

    ``operand(arg, ctype)``, given by the kernel writer, renders a graph value or literal
    argument converted to the backend's compute type ``ctype``. ``emulate``: the kernel rounds
    half-precision values as eager does."""

    def __init__(self, operand: Callable[[Any, str], str], emulate: bool = True):
        self._operand = operand
        self.emulate = emulate
        self._done: dict[int, tuple[Value, str]] = {}

    def type_name(self, dtype: torch.dtype) -> str:
        """The backend's name of a compute type."""
        raise NotImplementedError

    def operand(self, arg: Any, dtype: torch.dtype) -> str:
        """A graph value (or literal argument) in compute type ``dtype``."""
        return self._operand(arg, self.type_name(dtype))

    def emit(self, value: Value) -> str:
        """The source of ``value`` (each Value rendered once per emitter)."""
        key = id(value)
        if key in self._done:
            return self._done[key][1]
        text = self._emit(value)
        self._done[key] = (value, text)     # keeps value alive, so its id is not reused
        return text

    def infix_operand(self, v: Value, index: int) -> str:
        """The source of ``v.args[index]`` as an operand of the infix operation ``v``, without
        parentheses that arithmetic precedence makes redundant (``a + b * c``, ``a * b * c``:
        the evaluation order stays the one the parentheses gave)."""
        child = v.args[index]
        text = self.emit(child)
        if child.otherwise is None and child.op in ARITHMETIC and v.op in ARITHMETIC:
            inner, outer = ARITHMETIC[child.op], ARITHMETIC[v.op]
            if inner > outer or (inner == outer and index == 0):
                return bare(text)
        return text

    def _emit(self, v: Value) -> str:
        if v.otherwise is not None:
            spell = getattr(self, f"formula_{v.op}", None)
            text = spell(v) if spell is not None else None
            return text if text is not None else self.emit(v.otherwise)
        if v.op == "literal":
            return self.literal(v.param, v.dtype)
        if v.op == "operand":
            return self.operand(v.param, v.dtype)
        if v.op in BINARY or v.op in COMPARE:
            return self.binary(v)
        if v.op in UNARY:
            return self.unary(v)
        if v.op in FUNCTIONS:
            return self.function(v)
        kind = {"where": self.where, "cast": self.cast, "round": self.round}.get(v.op)
        if kind is None:
            raise NotImplementedError(f"{type(self).__name__} cannot spell {v.op!r}")
        return kind(v)

    def literal(self, value: Any, dtype: torch.dtype) -> str:
        """A Python scalar in compute type ``dtype``."""
        raise NotImplementedError

    def binary(self, v: Value) -> str:
        """An infix operation or comparison of ``v.args``."""
        raise NotImplementedError

    def unary(self, v: Value) -> str:
        """Negation or bitwise (on bool: logical) not."""
        raise NotImplementedError

    def function(self, v: Value) -> str:
        """An elementary function of ``v.args``."""
        raise NotImplementedError

    def where(self, v: Value) -> str:
        """``v.args[1]`` where ``v.args[0]`` holds, else ``v.args[2]``."""
        raise NotImplementedError

    def cast(self, v: Value) -> str:
        """``v.args[0]`` converted to compute type ``v.dtype``."""
        raise NotImplementedError

    def round(self, v: Value) -> str:
        """``v.args[0]`` rounded to the half type ``v.param``."""
        raise NotImplementedError
