"""Symbolic sizes in generated kernels: sizes that stay kernel arguments, and the decisions taken
about them.

A group Dynamo captured with symbolic sizes (``s0`` for the batch) can be generated once for a
whole *size class*. Its loop nest is analyzed and its source written with :class:`Dim` values in
place of the symbolic sizes: a ``Dim`` carries the size's expression in the symbols and its value
at one *binding* (the sizes of the call that asked for the kernel). Arithmetic on a ``Dim`` builds
the expression; every comparison, truth test or use as a plain int is answered from the binding's
value and recorded in the :class:`Decisions` shared by the nest (``768*s0 >= 131072``,
``s0 != 1``). The generated source spells sizes as expressions of the kernel's size arguments
(``ks0``), so it holds for every binding for which those recorded facts hold: that set is the
kernel's size class, and :meth:`Decisions.predicate` checks a new binding against it without
generating anything.

Any use of a ``Dim`` this module does not model raises ``TypeError`` (the group is then generated
for the one binding, as a static kernel) or, where Python needs a plain int (``range``, hashing),
records that the size equals its value at the binding: the kernel is then specialized on that
value, which is still correct. So a kernel generated from ``Dim`` sizes is never used outside the
facts it was generated under.
"""
from __future__ import annotations

import contextlib
import contextvars
import operator
import re
from typing import Any, Callable, Iterator

import attrs
import sympy

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_ARITHMETIC = re.compile(r"[A-Za-z0-9_\s()+\-*/%<>=!,]*")
_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">=": operator.ge}
_NEGATION = {"==": "!=", "!=": "==", "<": ">=", ">=": "<"}


class FloorDiv(sympy.Function):
    """Floor division of non-negative integer sizes (``a // b``)."""

    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        if a.could_extract_minus_sign():
            return -CeilDiv(-a, b)
        return None


class CeilDiv(sympy.Function):
    """Ceiling division of non-negative integer sizes (``-(-a // b)``: a launch grid)."""

    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(-(-int(a) // int(b)))
        if b == 1:
            return a
        return None


def symbol_name(symbol: sympy.Symbol) -> str:
    """The kernel argument a size symbol is passed as (``s0`` -> ``ks0``)."""
    return f"k{symbol}"


def render(expr: Any, language: str = "py") -> str:
    """``expr`` (an int, a :class:`Dim` or a sympy integer expression of size symbols) as source
    in ``language`` (``py``: Python and Triton; ``c``: C++ on ``int64_t`` arguments). Compound
    expressions come parenthesized; an expression outside integer arithmetic, floor and ceiling
    division, remainders, maxima and minima raises ``TypeError``."""
    if isinstance(expr, Dim):
        expr = expr.expr
    if isinstance(expr, bool):
        raise TypeError(f"a truth value is no size: {expr}")
    if isinstance(expr, int):
        return _integer(expr, language)
    return _render(sympy.sympify(expr), language)


def _integer(value: int, language: str) -> str:
    if language == "c":
        return f"INT64_C({value})"
    return str(value) if value >= 0 else f"({value})"


def _render(expr: sympy.Basic, language: str) -> str:
    if expr.is_Integer:
        return _integer(int(expr), language)
    if expr.is_Symbol:
        return symbol_name(expr)
    name = type(expr).__name__
    if expr.is_Add:
        return "(" + " + ".join(_render(a, language) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(_render(a, language) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([_render(expr.base, language)] * int(expr.exp)) + ")"
    division = "/" if language == "c" else "//"
    if name == "FloorDiv" or name == "CleanDiv":
        a, b = (_render(x, language) for x in expr.args)
        return f"({a} {division} {b})"
    if name == "CeilDiv":
        a, b = (_render(x, language) for x in expr.args)
        return f"(({a} + {b} - 1) {division} {b})"
    if name in ("Mod", "PythonMod"):
        a, b = (_render(x, language) for x in expr.args)
        return f"({a} % {b})"
    if name in ("Max", "Min"):      # a stride of a dim that may be empty: Max(1, s)
        args = [_render(x, language) for x in expr.args]
        if language != "c":
            return f"{name.lower()}({', '.join(args)})"
        pick = ">" if name == "Max" else "<"
        out = args[0]
        for arg in args[1:]:
            out = f"({out} {pick} {arg} ? {out} : {arg})"
        return out
    raise TypeError(f"size expression {expr} ({name}) has no {language} spelling here")


class Decisions:
    """The binding a nest is generated at (``{symbol: value}``) and the facts about its symbolic
    sizes that generating it relied on: each a sympy expression compared with 0 (``==``, ``!=``,
    ``<``, ``>=``), true at the binding."""

    def __init__(self, binding: dict):
        self.binding = {s: int(v) for s, v in binding.items()}
        # By name: a symbol parsed from stored data has the name of Dynamo's, perhaps not its object.
        self._named = {str(s): sympy.Integer(v) for s, v in self.binding.items()}
        self.facts: dict[tuple, None] = {}      # (expression, op) in the order first decided
        self.exact: list[str] = []              # why a size was taken at its binding's value

    @property
    def symbols(self) -> tuple:
        """The bound symbols in argument order (by name)."""
        return tuple(sorted(self.binding, key=str))

    def value(self, expr: Any) -> int:
        """``expr`` at the binding (TypeError when it has symbols the binding does not give)."""
        if isinstance(expr, int):
            return expr
        expr = sympy.sympify(expr)
        result = expr.xreplace({s: self._named[s.name] for s in expr.free_symbols if s.name in self._named})
        if not result.is_Integer:
            raise TypeError(f"size {expr} is not determined by the bound sizes {self.spelled()}")
        return int(result)

    def dim(self, size: Any) -> "Dim | int":
        """A :class:`Dim` for a symbolic size (a ``torch.SymInt`` or a sympy expression); ints
        stay ints."""
        if isinstance(size, int):
            return int(size)
        expr = size.node.expr if hasattr(size, "node") else sympy.sympify(size)
        if expr.is_Integer:
            return int(expr)
        return Dim(expr, self.value(expr), self)

    def compare(self, difference: sympy.Basic, op: str) -> bool:
        """``difference op 0`` at the binding, recorded unless it holds for every value of the
        symbols."""
        difference = sympy.expand(difference)
        if difference.is_Integer:
            return _OPS[op](int(difference), 0)
        known = _known(difference, op)
        if known is not None:
            return known
        result = _OPS[op](self.value(difference), 0)
        self.facts.setdefault((difference, op if result else _NEGATION[op]), None)
        return result

    def take_exact(self, dim: "Dim", why: str) -> int:
        """``dim``'s value at the binding, recording that the kernel holds for it alone."""
        if self.compare(dim.expr - dim.value, "=="):
            note = f"{dim.expr} = {dim.value} ({why})"
            if note not in self.exact:
                self.exact.append(note)
        return dim.value

    def spelled(self) -> str:
        return ", ".join(f"{s}={v}" for s, v in sorted(self.binding.items(), key=lambda b: str(b[0])))

    def predicate(self) -> Callable[..., bool]:
        """A function of the symbols' values (in :attr:`symbols` order) that is true exactly when
        every recorded fact holds."""
        names = [symbol_name(s) for s in self.symbols]
        tests = [f"{render(expr)} {op} 0" for expr, op in self.facts] or ["True"]
        text = f"lambda {', '.join(names)}: " + " and ".join(tests)
        return eval(compile(text, "<size class>", "eval"), {})   # noqa: S307 - text made from sympy above

    def describe(self) -> list[str]:
        """The recorded facts as readable relations (``768*s0 >= 131072``)."""
        return [f"{expr} {op} 0" for expr, op in self.facts]


def _known(difference: sympy.Basic, op: str) -> bool | None:
    """Whether ``difference op 0`` holds for every value of its (positive integer) symbols, as far
    as sympy's assumptions tell; None when it depends on them."""
    if op in ("==", "!="):
        zero = difference.is_zero
        return None if zero is None else (zero if op == "==" else not zero)
    negative = difference.is_negative
    if negative is None:
        return None
    return negative if op == "<" else not negative


class Dim:
    """A symbolic size during kernel generation: its expression, its value at the binding, and the
    :class:`Decisions` every comparison is recorded in. See the module docstring."""

    __slots__ = ("expr", "value", "decisions")

    def __init__(self, expr: sympy.Basic, value: int, decisions: Decisions):
        self.expr = expr
        self.value = value
        self.decisions = decisions

    def _other(self, other: Any) -> tuple | None:
        if isinstance(other, Dim):
            return other.expr, other.value
        if isinstance(other, int) and not isinstance(other, bool):
            return sympy.Integer(other), other
        return None

    def _make(self, expr: sympy.Basic, value: int) -> "Dim | int":
        return int(expr) if expr.is_Integer else Dim(expr, value, self.decisions)

    def _arith(self, other: Any, expr_op: Callable, value_op: Callable, reverse: bool = False) -> Any:
        parts = self._other(other)
        if parts is None:
            return NotImplemented
        (a, va), (b, vb) = ((parts, (self.expr, self.value)) if reverse else ((self.expr, self.value), parts))
        return self._make(expr_op(a, b), value_op(va, vb))

    def __add__(self, other):
        return self._arith(other, operator.add, operator.add)

    def __radd__(self, other):
        return self._arith(other, operator.add, operator.add, reverse=True)

    def __sub__(self, other):
        return self._arith(other, operator.sub, operator.sub)

    def __rsub__(self, other):
        return self._arith(other, operator.sub, operator.sub, reverse=True)

    def __mul__(self, other):
        return self._arith(other, operator.mul, operator.mul)

    def __rmul__(self, other):
        return self._arith(other, operator.mul, operator.mul, reverse=True)

    def __floordiv__(self, other):
        return self._arith(other, FloorDiv, operator.floordiv)

    def __rfloordiv__(self, other):
        return self._arith(other, FloorDiv, operator.floordiv, reverse=True)

    def __mod__(self, other):
        return self._arith(other, sympy.Mod, operator.mod)

    def __rmod__(self, other):
        return self._arith(other, sympy.Mod, operator.mod, reverse=True)

    def __neg__(self):
        return self._make(-self.expr, -self.value)

    def __pos__(self):
        return self

    def __abs__(self):
        return self if self.decisions.compare(self.expr, ">=") else -self

    def _compare(self, other: Any, op: str, swap: bool = False) -> Any:
        parts = self._other(other)
        if parts is None:
            return NotImplemented
        a, b = (parts[0], self.expr) if swap else (self.expr, parts[0])
        return self.decisions.compare(a - b, op)

    def __eq__(self, other):
        return self._compare(other, "==")

    def __ne__(self, other):
        return self._compare(other, "!=")

    def __lt__(self, other):
        return self._compare(other, "<")

    def __ge__(self, other):
        return self._compare(other, ">=")

    def __gt__(self, other):
        return self._compare(other, "<", swap=True)

    def __le__(self, other):
        return self._compare(other, ">=", swap=True)

    def __bool__(self):
        return self.decisions.compare(self.expr, "!=")

    def __index__(self):
        return self.decisions.take_exact(self, "used as a plain int")

    __int__ = __index__

    def __float__(self):
        return float(self.decisions.take_exact(self, "used as a float"))

    def __hash__(self):
        return hash(self.decisions.take_exact(self, "hashed"))

    def bit_length(self) -> int:
        """``int.bit_length`` of the value, recording the power-of-two range it lies in."""
        bits = self.value.bit_length()
        self.decisions.compare(self.expr - (1 << bits), "<")
        if bits:
            self.decisions.compare(self.expr - (1 << (bits - 1)), ">=")
        return bits

    def __repr__(self) -> str:
        return render(self)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if spec:
            return format(self.decisions.take_exact(self, "formatted"), spec)
        return render(self)


@attrs.frozen
class SizeClass:
    """What a kernel generated from symbolic sizes needs at run time: its size arguments (the
    symbols, by name, in argument order), the facts a binding must satisfy to use it
    (:meth:`Decisions.predicate`), and the layouts of its inputs and outputs as expressions of
    the symbols. Everything is text, so a class is stored as plain data and rebuilt as is."""

    symbols: tuple[str, ...]
    facts: tuple[str, ...]           # Python expressions of the k<symbol> arguments
    exact: tuple[str, ...] = ()      # sizes the kernel holds for one value only, and why
    layout: str = "((), (), ())"     # (input strides, (output shape, output stride) pairs, launch values)
    _fits: Callable = attrs.field(init=False, repr=False, eq=False)
    _layout: Callable = attrs.field(init=False, repr=False, eq=False)

    @classmethod
    def of(cls, decisions: Decisions, inputs: list, outputs: list, launch: tuple = ()) -> "SizeClass":
        """The class of a kernel generated under ``decisions``, whose inputs and outputs have
        the example values ``inputs`` and ``outputs`` (fake tensors with symbolic sizes), and
        whose launch needs the values ``launch`` (ints, :class:`Dim` values or expressions
        already rendered for Python: a Triton grid)."""
        def spelled(values) -> str:
            return "(" + "".join((v if isinstance(v, str) else render(decisions.dim(v) if not isinstance(v, (int, Dim))
                                                                      else v)) + ", " for v in values) + ")"
        ins = "(" + "".join(spelled(v.stride()) + ", " for v in inputs) + ")"
        outs = "(" + "".join(f"({spelled(v.shape)}, {spelled(v.stride())}), " for v in outputs) + ")"
        return cls(tuple(str(s) for s in decisions.symbols),
                   tuple(f"{render(expr)} {op} 0" for expr, op in decisions.facts),
                   tuple(decisions.exact), f"({ins}, {outs}, {spelled(launch)})")

    def _compiled(self, body: str) -> Callable:
        names = ", ".join(f"k{s}" for s in self.symbols)
        return eval(compile(f"lambda {names}: {body}", "<size class>", "eval"), {})  # noqa: S307 - see of()

    def __attrs_post_init__(self) -> None:
        for text in (*self.facts, self.layout):     # arithmetic of the size arguments (max, min), nothing else
            words = set(_NAME.findall(text)) - {"and", "True", "max", "min"} - {f"k{s}" for s in self.symbols}
            if words or not _ARITHMETIC.fullmatch(text):
                raise ValueError(f"size class text {text!r} is not arithmetic of its sizes {self.symbols}")
        object.__setattr__(self, "_fits", self._compiled(" and ".join(self.facts) or "True"))
        object.__setattr__(self, "_layout", self._compiled(self.layout))

    def values(self, binding: dict) -> tuple[int, ...]:
        """The size arguments for ``binding`` (``{symbol or its name: value}``)."""
        named = {str(k): v for k, v in binding.items()}
        return tuple(int(named[s]) for s in self.symbols)

    def fits(self, values: tuple) -> bool:
        """Whether the kernel holds for these size arguments."""
        return bool(self._fits(*values))

    def layouts(self, values: tuple) -> tuple:
        """``(input strides, [(output shape, output stride)], launch values)`` at these size
        arguments."""
        return self._layout(*values)

    def to_data(self) -> dict:
        return {"symbols": list(self.symbols), "facts": list(self.facts), "exact": list(self.exact),
                "layout": self.layout}

    @classmethod
    def from_data(cls, data: dict) -> "SizeClass":
        return cls(tuple(data["symbols"]), tuple(data["facts"]), tuple(data["exact"]), data["layout"])


_FUNCTIONS = {"FloorDiv": FloorDiv, "CeilDiv": CeilDiv, "Mod": sympy.Mod, "PythonMod": sympy.Mod,
              "CleanDiv": FloorDiv}


def size_data(size: Any) -> int | str:
    """A size (an int, a ``torch.SymInt``, a sympy expression or a :class:`Dim`) as data: the int,
    or its expression's text (:func:`parse` reads it back)."""
    if isinstance(size, int):
        return int(size)
    expr = size.expr if isinstance(size, Dim) else size.node.expr if hasattr(size, "node") else size
    expr = sympy.sympify(expr)
    return int(expr) if expr.is_Integer else str(expr)


def parse(text: int | str) -> Any:
    """The size :func:`size_data` wrote: an int, or a sympy expression whose symbols are positive
    integers (as Dynamo's are, so they equal the symbols of the graph being compiled)."""
    if isinstance(text, int):
        return text
    names = {n: _FUNCTIONS.get(n) or sympy.Symbol(n, integer=True, positive=True) for n in _NAME.findall(text)}
    return sympy.sympify(text, locals=names)


def is_dim(value: Any) -> bool:
    return isinstance(value, Dim)


def has_dims(values: Any) -> bool:
    """True when some value of ``values`` (nested tuples and lists) is a :class:`Dim`."""
    if isinstance(values, (tuple, list)):
        return any(has_dims(v) for v in values)
    return isinstance(values, Dim)


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("pp_size_decisions", default=None)


@contextlib.contextmanager
def binding(decisions: Decisions | None) -> Iterator[Decisions | None]:
    """Within: symbolic sizes read through :func:`sizes` become :class:`Dim` values of
    ``decisions`` (nothing changes with None)."""
    token = _ACTIVE.set(decisions)
    try:
        yield decisions
    finally:
        _ACTIVE.reset(token)


def active() -> Decisions | None:
    """The :class:`Decisions` of the enclosing :func:`binding`, if any."""
    return _ACTIVE.get()


def sizes(values: Any) -> tuple:
    """``values`` (sizes or strides) as a tuple, symbolic ones as :class:`Dim` values inside a
    :func:`binding` (as they are outside one)."""
    decisions = _ACTIVE.get()
    if decisions is None:
        return tuple(values)
    return tuple(v if isinstance(v, (int, Dim)) else decisions.dim(v) for v in values)


__all__ = ["Dim", "Decisions", "SizeClass", "size_data", "parse", "FloorDiv", "CeilDiv", "render", "symbol_name", "binding", "active", "sizes",
           "is_dim", "has_dims"]
