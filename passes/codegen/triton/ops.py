"""The Triton backend's spelling of values: types, loads, stores, literals, the :class:`TritonEmitter`
that renders the operator rules of ``passes/kernel_ir/rules.py``, and the code of reductions.

Values are computed in a *compute type* (fp32 for fp16/bf16/fp32, fp64, int64 for integers, int1
for bool); selects are ``tl.where``. Only functions the Triton interpreter also has are used
(``tl.exp``, ``tl.log``, ``tl.sqrt_rn``, ``tl.math.erf``...); tanh, expm1, log1p, sinh, cosh,
atan, asin, acos, erf, GELU and pow are written from those as small ``@triton.jit`` helpers
(:data:`HELPERS`) that a generated module includes when it uses them. fp32 erf and GELU are
helpers for speed too: libdevice's erf made a fused layer norm + GELU kernel issue-bound
(docs/architecture.md, "Exact GELU"). Nothing here imports triton: it writes source.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx

from passes.kernel_ir.groups import meta_of, packet_name
from passes.kernel_ir.values import BINARY, COMPARE, Emitter, Value, bare, where

from .welford import WELFORD_HELPERS

TL_STORAGE = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
              torch.bfloat16: "tl.bfloat16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
              torch.int16: "tl.int16", torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1"}
# Pointer types of a kernel signature (what triton.compile needs without a launch).
SIGNATURE_TYPES = {torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16",
                   torch.bfloat16: "*bf16", torch.int8: "*i8", torch.uint8: "*u8", torch.int16: "*i16",
                   torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1"}
FLOAT_CT = ("tl.float32", "tl.float64")
BIG = 2147483647                # "no index yet" in argmax/argmin


def compute_type(dtype: torch.dtype) -> str:
    """The Triton type arithmetic runs in: fp32 for half types, int64 for ints, int1 for bool."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    if dtype == torch.float64:
        return "tl.float64"
    if dtype == torch.bool:
        return "tl.int1"
    return "tl.int64"


def wrap(expr: str) -> str:
    """``expr`` in parentheses unless it already is one operand (names, calls, attributes and
    parenthesized groups only, outside parentheses)."""
    depth = 0
    for ch in expr:
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and not (ch.isalnum() or ch in "_.()"):
            return f"({expr})"
    return expr


def cast(expr: str, source_ct: str, target_ct: str) -> str:
    if source_ct == target_ct:
        return expr
    if target_ct == "tl.int1":
        return f"({expr} != 0)"
    return f"{wrap(expr)}.to({target_ct})"


def load_cast(expr: str, dtype: torch.dtype) -> str:
    """A loaded value (storage type) converted to its compute type."""
    storage, ct = TL_STORAGE[dtype], compute_type(dtype)
    return expr if storage == ct else f"{expr}.to({ct})"


def store_cast(value: str, dtype: torch.dtype) -> str:
    storage = TL_STORAGE[dtype]
    return value if storage == compute_type(dtype) else f"{wrap(value)}.to({storage})"


def round_to(dtype: torch.dtype, value: str) -> str:
    """Round a compute value to ``dtype``'s precision, as eager does after every op."""
    if dtype in (torch.float16, torch.bfloat16):
        return f"{wrap(value)}.to({TL_STORAGE[dtype]}).to(tl.float32)"
    return value


def literal(value: Any, ct: str) -> str:
    """A Python scalar as a Triton operand of compute type ``ct`` (fp64 constants are exact)."""
    if isinstance(value, bool):
        value = int(value)
    if ct == "tl.int1":
        return "True" if value else "False"
    if ct == "tl.int64":
        if isinstance(value, float) and not math.isfinite(value):
            raise NotImplementedError(f"non-finite literal {value} in an integer op")
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        text = 'float("nan")'
    elif math.isinf(value):
        text = 'float("inf")' if value > 0 else '-float("inf")'
    else:
        text = repr(value)
    if ct == "tl.float64":
        return f"tl.full([], {text}, tl.float64)"
    return text


def sqrt(x: str, ct: str) -> str:
    return f"tl.sqrt_rn({x})" if ct == "tl.float32" else f"tl.sqrt({x})"


# Helper device functions, by name: (source, helpers it calls). Written only from functions the
# interpreter has, accurate to a few fp32 ulps (fp64 inputs: exp/log based ones keep fp64 accuracy).
HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pp_expm1": ('''
@triton.jit
def pp_expm1(x):
    # Kahan: exact where exp(x) rounds to 1, relative error of a few ulps elsewhere.
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, um1 * x / tl.log(u))
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)
''', ()),
    "pp_log1p": ('''
@triton.jit
def pp_log1p(x):
    u = 1.0 + x
    d = u - 1.0
    r = tl.where(d == 0.0, x, tl.log(u) * x / d)
    return tl.where(u == float("inf"), u, r)
''', ()),
    "pp_tanh": ('''
@triton.jit
def pp_tanh(x):
    # fp32: Cephes tanhf (odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1)): one exp and
    # one division. fp64: from expm1, which keeps fp64 accuracy.
    a = tl.abs(x)
    if x.dtype == tl.float32:
        z = x * x
        small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
                  + 1.33314422036e-1) * z - 3.33332819422e-1) * z * x + x
        big = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
        return tl.where(a < 0.625, small, tl.where(x < 0.0, -big, big))
    else:
        t = pp_expm1(-2.0 * a)
        y = -t / (2.0 + t)
        return tl.where(x < 0.0, -y, y)
''', ("pp_expm1",)),
    "pp_erf": ('''
@triton.jit
def pp_erf(x):
    # fp32 only (fp64 calls libdevice's erf). Branch-free: 17 instructions a value on sm_90 (9 FFMA,
    # one MUFU.EX2, the select folded into a predicated LOP3) where libdevice's erff takes about 26
    # (it moves one of two coefficient sets into registers per value). |x| < 0.45: x * q(x*x),
    # accurate relative to x. Above:
    # 1 - exp2(p(t)) with p(t) ~ log2(erfc(t)) and t = |x| clamped to 3.96875, where 1 - exp2(p)
    # rounds to exactly 1. The constants are fitted by benchmarks/probes/fit_erf.py, which measures them
    # in fp32 over every float in [2**-12, 4]: absolute error <= 1e-7, relative <= 2e-7 below 0.5
    # (plus <= 1.3e-7 absolute from a GPU's approximate exp2). NaN takes the small side and stays
    # NaN; -0.0 stays -0.0.
    a = tl.abs(x)
    s = x * x
    small = x * (((-0.0248397142 * s + 0.112584323) * s - 0.376116127) * s + 1.12837911)
    t = tl.minimum(a, 3.96875)
    p = (((((0.000321845495 * t - 0.00475024851) * t + 0.0334043726) * t - 0.152519926) * t
          - 0.916539371) * t - 1.62838387) * t + 5.0467901e-05
    big = 1.0 - tl.exp2(p)          # > 0, so ORing in x's sign bit is copysign (one LOP3)
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    big = (big.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(a >= 0.45, big, small)
''', ()),
    "pp_gelu": ('''
@triton.jit
def pp_gelu(x):
    # Exact (erf) GELU in fp32 as x * Phi(x), Phi the normal CDF: with t = |x| / sqrt(2) and
    # h = erfc(t) / 2 = exp2(p(t)), Phi is 1 - h for x >= 0 and h below. One polynomial and one
    # MUFU.EX2, about 14 instructions a value on sm_90 where 0.5 * x * (1 + pp_erf(...)) takes 20.
    # p, degree 8, is fitted on [0, 3.96875] by benchmarks/probes/fit_erf.py (--gelu), which measures it
    # in fp32 over every float of |x| in [2**-12, 16]: within 0.45 of the error the tests allow
    # (1e-7 * |x| + 3e-7 * |gelu(x)|). p decreases past the fit and is below -150 from t = 7.4, so
    # t clamped to 8 gives h = 0: gelu(-inf) is NaN as eager's is, and 1 - h is exactly 1 for
    # large x. NaN stays NaN. (The C++ backend keeps 0.5 * x * (1 + erf): written out with its
    # pp_exp2, this form measured slower there than libmvec's vector erf.)
    t = tl.minimum(tl.abs(x) * 0.7071067811865476, 8.0)
    p = (((((((-4.01542857e-05 * t + 0.000402140751) * t - 0.00134651223) * t - 0.0010133679) * t
            + 0.0284687988) * t - 0.148584381) * t - 0.918392658) * t - 1.62791073) * t - 0.99999994
    h = tl.exp2(p)
    return x * tl.where(x >= 0.0, 1.0 - h, h)
''', ()),
    "pp_sinh": ('''
@triton.jit
def pp_sinh(x):
    a = tl.abs(x)
    t = pp_expm1(a)
    half = tl.where(a > 88.0, tl.exp(a - 0.6931471805599453), 0.5 * tl.exp(a))
    y = tl.where(a < 1.0, 0.5 * (t + t / (t + 1.0)), half - 0.25 / half)
    return tl.where(x < 0.0, -y, y)
''', ("pp_expm1",)),
    "pp_cosh": ('''
@triton.jit
def pp_cosh(x):
    a = tl.abs(x)
    half = tl.where(a > 88.0, tl.exp(a - 0.6931471805599453), 0.5 * tl.exp(a))
    return half + 0.25 / half
''', ()),
    "pp_atan": ('''
@triton.jit
def pp_atan(x):
    # Cephes atanf: reduce to |z| <= tan(pi/8), then an odd polynomial (fp32 accuracy).
    a = tl.abs(x)
    big = a > 2.414213562373095
    mid = a > 0.41421356237309503
    z = tl.where(big, -1.0 / a, tl.where(mid, (a - 1.0) / (a + 1.0), a))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    z2 = z * z
    p = (((8.05374449538e-2 * z2 - 1.38776856032e-1) * z2 + 1.99777106478e-1) * z2
         - 3.33329491539e-1) * z2 * z + z
    r = base + p
    return tl.where(x < 0.0, -r, r)
''', ()),
    "pp_asin": ('''
@triton.jit
def pp_asin(x):
    return pp_atan(x / tl.sqrt_rn((1.0 - x) * (1.0 + x)))
''', ("pp_atan",)),
    "pp_acos": ('''
@triton.jit
def pp_acos(x):
    return 2.0 * pp_atan(tl.sqrt_rn((1.0 - x) / (1.0 + x)))
''', ("pp_atan",)),
    "pp_pow": ('''
@triton.jit
def pp_pow(x, y):
    # exp2(y * log2|x|) in fp64 (fp32 would lose digits for large results), signs and specials as torch.
    r = tl.exp2(y.to(tl.float64) * tl.log2(tl.abs(x).to(tl.float64))).to(x.dtype)
    whole = tl.math.floor(y) == y
    odd = whole & (tl.math.floor(y * 0.5) * 2.0 != y)
    negative = (x < 0.0) | ((x == 0.0) & (1.0 / x < 0.0))      # -0.0 counts as negative
    r = tl.where(negative & odd, -r, r)
    r = tl.where((x < 0.0) & (tl.math.floor(y) != y), float("nan"), r)
    return tl.where((y == 0.0) | (x == 1.0), 1.0, r)
''', ()),
    "pp_mul": ('''
@triton.jit
def pp_mul(a, b):
    return a * b
''', ()),
}
HELPERS.update(WELFORD_HELPERS)     # row statistics in ATen's order (triton/welford.py)


def helper_source(names: set[str]) -> str:
    """Source of the helpers named (and the ones they call), callees first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for dep in HELPERS[name][1]:
            visit(dep)
        ordered.append(name)

    for name in sorted(names):
        visit(name)
    return "".join(HELPERS[n][0] for n in ordered)


class TritonEmitter(Emitter):
    """Spells operator rules (passes/kernel_ir/rules.py) in Triton: compute types ``tl.float32``,
    ``tl.float64``, ``tl.int64`` and ``tl.int1``, selects ``tl.where``, math from functions the
    interpreter also has, or the :data:`HELPERS` it writes from them (added to ``uses``)."""

    LIBRARY = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2", "sin": "tl.sin",
               "cos": "tl.cos", "floor": "tl.math.floor", "ceil": "tl.math.ceil", "abs": "tl.abs"}
    CALLS = {"expm1": "pp_expm1", "log1p": "pp_log1p", "tanh": "pp_tanh", "sinh": "pp_sinh", "cosh": "pp_cosh",
             "atan": "pp_atan", "asin": "pp_asin", "acos": "pp_acos"}
    FP32_ONLY = ("pp_atan", "pp_asin", "pp_acos")

    def __init__(self, operand: Callable[[Any, str], str], uses: set[str], emulate: bool = True):
        super().__init__(operand, emulate)
        self.uses = uses

    def type_name(self, dtype: torch.dtype) -> str:
        return compute_type(dtype)

    def literal(self, value: Any, dtype: torch.dtype) -> str:
        return literal(value, compute_type(dtype))

    def helper(self, fn: str, v: Value, *values: str) -> str:
        """A call of the helper device function ``fn`` (:data:`HELPERS`), computing ``v``."""
        if fn in self.FP32_ONLY and v.dtype == torch.float64:
            raise NotImplementedError(f"{v.op} in float64 (the Triton helper is fp32-accurate)")
        self.uses.add(fn)
        return f"{fn}({', '.join(values)})"

    def binary(self, v: Value) -> str:
        a, b = self.infix_operand(v, 0), self.infix_operand(v, 1)
        return f"({a} {COMPARE.get(v.op) or BINARY[v.op]} {b})"

    def unary(self, v: Value) -> str:
        x = self.emit(v.args[0])
        if v.op == "neg":
            return f"(-{x})"
        return f"({x} == 0)" if v.dtype == torch.bool else f"(~{x})"

    def function(self, v: Value) -> str:
        ct = compute_type(v.dtype)
        if v.op in ("floordiv", "truncdiv"):    # Triton's // and % on integers round toward zero, as C's
            a, b = (self.emit(x) for x in v.args)
            quotient = f"({a} // {b})"
            if v.op == "truncdiv":
                return quotient
            return f"tl.where((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0)), {quotient} - 1, {quotient})"
        if v.op != "abs" and ct not in FLOAT_CT:
            raise NotImplementedError(f"{v.op} on {v.dtype}")
        if v.op == "pow":
            return self.power(v)
        x = bare(self.emit(v.args[0]))
        if v.op in self.LIBRARY:
            return f"{self.LIBRARY[v.op]}({x})"
        if v.op in self.CALLS:
            return self.helper(self.CALLS[v.op], v, x)
        if v.op == "sqrt":
            return sqrt(x, ct)
        if v.op == "tan":
            return f"(tl.sin({x}) / tl.cos({x}))"
        if v.op == "trunc":
            return f"tl.where({wrap(x)} < 0.0, tl.math.ceil({x}), tl.math.floor({x}))"
        assert v.op == "erf", v.op
        return f"tl.math.erf({x})" if ct == "tl.float64" else self.helper("pp_erf", v, x)

    def power(self, v: Value) -> str:
        """``pp_pow`` (fp64 exp2/log2, so dear): constant exponents with an exact shorter form skip
        it (-1, -0.5, 0); a literal side becomes a block, as the helper reads its dtype."""
        ct = compute_type(v.dtype)
        base, exponent = v.args
        if exponent.op == "literal":
            k, x = exponent.param, self.emit(base)
            shortcuts = {-1: f"(1.0 / {x})", -0.5: f"(1.0 / {sqrt(bare(x), ct)})", 0: filled(1.0, ct, x)}
            if k in shortcuts:
                return shortcuts[k]
            return self.helper("pp_pow", v, bare(x), filled(float(k), ct, x))
        if base.op == "literal":
            y = self.emit(exponent)
            return self.helper("pp_pow", v, filled(base.param, ct, y), bare(y))
        return self.helper("pp_pow", v, bare(self.emit(base)), bare(self.emit(exponent)))

    def where(self, v: Value) -> str:
        condition, a, b = (bare(self.emit(x)) for x in v.args)
        expr = f"tl.where({condition}, {a}, {b})"
        if all(arm.op == "literal" for arm in v.args[1:]):
            expr = cast(expr, "?", compute_type(v.dtype))      # two literals: give the result its type
        return expr

    def cast(self, v: Value) -> str:
        return cast(self.emit(v.args[0]), compute_type(v.args[0].dtype), compute_type(v.dtype))

    def round(self, v: Value) -> str:
        return round_to(v.param, self.emit(v.args[0]))

    def formula_keep_nan(self, v: Value) -> str | None:
        """``where(c, x, y)`` keeping x's NaN is one select: ``where(c | isnan(x), x, y)``."""
        x, value = v.args
        if value.op == "where" and value.args[1] is x:
            condition, _, other = value.args
            return self.emit(where(condition | x.isnan(), x, other))
        return None

    def formula_rsqrt(self, v: Value) -> str | None:
        """fp32: the hardware reciprocal square root, as ATen's CUDA kernels call rsqrtf (torch.rsqrt
        and layer norm's statistics), so the kernel gives eager's bits where ``1 / sqrt_rn(x)``
        differs in many values (see docs/architecture.md, "Eager's bits in half precision")."""
        return f"tl.math.rsqrt({bare(self.emit(v.args[0]))})" if v.dtype == torch.float32 else None

    def formula_gelu(self, v: Value) -> str | None:
        """fp32: ``pp_gelu``, x * Phi(x) from one fitted polynomial and one exp2 (fewer instructions
        than ``0.5 * x * (1 + pp_erf(x / sqrt 2))``)."""
        if v.dtype != torch.float32:
            return None
        return self.helper("pp_gelu", v, bare(self.emit(v.args[0])))

    def formula_cube(self, v: Value) -> str:
        """ATen's CUDA kernel computes ``x ** 3`` as ``x * x * x`` in the tensor's dtype: the rule's
        product."""
        return self.emit(v.args[0])

    def formula_one_plus_tanh(self, v: Value) -> str:
        """``pp_tanh`` costs a polynomial, an exp, a division and two selects: take the rule's
        sigmoid form of ``1 ± tanh(u)``."""
        return self.emit(v.args[0])


def filled(value: Any, ct: str, like: str) -> str:
    """A block of ``value`` (type ``ct``) shaped like the value ``like`` (NaN-safe)."""
    text = literal(value, ct)
    return f"tl.where({like} == {like}, {text}, {text})"


# -- reductions: code over [XBLOCK, RBLOCK] tiles, reduced along axis 1 ---------------------------
def work_type(node) -> str:
    """Sums and products accumulate in the output's compute type (fp32 for half types); max/min
    and arg* compare in the source's (bool as int32)."""
    if packet_name(node.target) in ("aten.sum", "prims.sum", "aten.prod"):
        return compute_type(meta_of(node).dtype)
    ct = compute_type(meta_of(node.args[0]).dtype)
    return "tl.int32" if ct == "tl.int1" else ct


def lowest(node, largest: bool) -> str:
    """The value no element beats: -inf/+inf for floats, the integer extremes otherwise."""
    ct = work_type(node)
    if ct in FLOAT_CT:
        return '-float("inf")' if largest else 'float("inf")'
    if ct == "tl.int32":
        return "0" if largest else "1"
    return "-9223372036854775808" if largest else "9223372036854775807"


def reduce_tile(node, value: str, var: str, *, index: str, valid: str | None, nan_flags: str | None,
                emulate: bool, uses: set) -> list[str]:
    """Lines reducing the tile ``value`` (``valid`` marks real elements, ``index`` holds each
    element's reduced index, ``nan_flags`` NaN flags kept by a looped max/min) to ``var``, shaped
    [XBLOCK, 1]. NaN propagates through max/min (tl.max skips it on the GPU) and wins arg*; ties
    take the first index."""
    name = packet_name(node.target)
    ct = work_type(node)
    is_float = ct in FLOAT_CT
    out_ct = compute_type(meta_of(node).dtype)
    only = (lambda cond: f"{cond} & {valid}" if valid else cond)
    if name in ("aten.sum", "prims.sum", "aten.prod"):
        tile = f"tl.where({valid}, {value}, {literal(int(name == 'aten.prod'), ct)})" if valid else value
        if name == "aten.prod":
            uses.add("pp_mul")
            expr = f"tl.reduce({tile}, 1, pp_mul, keep_dims=True)"
        else:
            expr = f"tl.sum({tile}, 1, keep_dims=True)"
        return [f"{var} = {round_to(meta_of(node).dtype, expr) if emulate else expr}"]
    largest = name in ("aten.amax", "aten.argmax")
    fn = "tl.max" if largest else "tl.min"
    if name in ("aten.amax", "aten.amin"):
        tile = f"tl.where({valid}, {value}, {lowest(node, largest)})" if valid else value
        lines = [f"{var} = {fn}({tile}, 1, keep_dims=True)"]
        if is_float:
            flags = nan_flags or f"({only(f'({value} != {value})')}).to(tl.int32)"
            lines.append(f"{var} = tl.where(tl.max({flags}, 1, keep_dims=True) > 0, float('nan'), {var})")
        if ct != out_ct:
            lines.append(f"{var} = {cast(var, ct, out_ct)}")
        return lines
    lines, ok = [], valid
    stem = node.name
    if is_float:
        lines.append(f"nan_{stem} = tl.min(tl.where({only(f'({value} != {value})')}, {index}, {BIG}), 1, "
                     "keep_dims=True)")
        ok = only(f"({value} == {value})")
    tile = f"tl.where({ok}, {value}, {lowest(node, largest)})" if ok else value
    hit = f"({value} == best_{stem})" + (f" & {ok}" if ok else "")
    lines += [f"best_{stem} = {fn}({tile}, 1, keep_dims=True)",
              f"first_{stem} = tl.min(tl.where({hit}, {index}, {BIG}), 1, keep_dims=True)"]
    if is_float:
        lines.append(f"first_{stem} = tl.where(nan_{stem} < {BIG}, nan_{stem}, first_{stem})")
    return lines + [f"{var} = tl.where(first_{stem} == {BIG}, 0, first_{stem}).to(tl.int64)"]


def accumulator_init(node) -> list[str]:
    """Lines starting the [XBLOCK, RBLOCK] accumulators of a looped reduction."""
    name, ct, n = packet_name(node.target), work_type(node), node.name
    if name in ("aten.sum", "prims.sum", "aten.prod"):
        return [f"acc_{n} = tl.full([XBLOCK, RBLOCK], {int(name == 'aten.prod')}, {ct})"]
    lines = [f"acc_{n} = tl.full([XBLOCK, RBLOCK], {lowest(node, name in ('aten.amax', 'aten.argmax'))}, {ct})"]
    if name in ("aten.amax", "aten.amin") and ct in FLOAT_CT:
        lines.append(f"nan_{n} = tl.zeros([XBLOCK, RBLOCK], tl.int32)")
    if name in ("aten.argmax", "aten.argmin"):
        lines.append(f"idx_{n} = tl.full([XBLOCK, RBLOCK], {BIG}, tl.int32)")
    return lines


def accumulator_update(node, value: str, mask: str | None) -> list[str]:
    """Lines folding one chunk (``value``, a tile; ``mask`` marks real elements) into the
    accumulators; arg* keep, per lane, the first best index seen (NaN beats everything)."""
    name, ct, n = packet_name(node.target), work_type(node), node.name
    acc = f"acc_{n}"
    if name in ("aten.sum", "prims.sum", "aten.prod"):
        op = "*" if name == "aten.prod" else "+"
        tile = f"tl.where({mask}, {value}, {literal(int(op == '*'), ct)})" if mask else value
        return [f"{acc} = {acc} {op} {tile}"]
    if name in ("aten.amax", "aten.amin"):
        fn = "tl.maximum" if name == "aten.amax" else "tl.minimum"
        tile = f"tl.where({mask}, {value}, {lowest(node, name == 'aten.amax')})" if mask else value
        lines = [f"{acc} = {fn}({acc}, {tile})"]
        if ct in FLOAT_CT:
            nan = f"({value} != {value})" + (f" & {mask}" if mask else "")
            lines.append(f"nan_{n} = nan_{n} | ({nan}).to(tl.int32)")
        return lines
    take = f"(idx_{n} == {BIG}) | ({value} {'>' if name == 'aten.argmax' else '<'} {acc})"
    if ct in FLOAT_CT:
        take += f" | (({value} != {value}) & ({acc} == {acc}))"
    if mask:
        take = f"({take}) & {mask}"
    return [f"take_{n} = {take}", f"{acc} = tl.where(take_{n}, {value}, {acc})",
            f"idx_{n} = tl.where(take_{n}, rr, idx_{n})"]
