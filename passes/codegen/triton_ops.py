"""Triton expressions for each fusable ATen operator (the Triton backend's op table).

Mirrors ``cpp_ops.py``: values are computed in a *compute type* (fp32 for fp16/bf16/fp32, fp64,
int64 for integers, int1 for bool), selects are ``tl.where``, and maximum/minimum/relu/clamp
propagate NaN like eager. Only functions the Triton interpreter also has are used (``tl.exp``,
``tl.log``, ``tl.sqrt_rn``, ``tl.math.erf``...); tanh, expm1, log1p, sinh, cosh, atan, asin, acos,
erf and pow are written from those as small ``@triton.jit`` helpers (:data:`HELPERS`) that a
generated module includes when it uses them (erf, for speed: libdevice's fp32 erf costs a third of
a fused layer norm + GELU kernel). Nothing here imports triton: it writes source.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.fx

from pipeline.fused import BITWISE, COMPARISONS, PAD, UNIT_RESHAPES, clamp_bounds, meta_of, packet_name, promoted_dtype, value_dtype

from .triton_welford import WELFORD_HELPERS

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


HALF = (torch.float16, torch.bfloat16)


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
    # rounds to exactly 1. The constants are fitted by benchmarks/fit_erf.py, which measures them
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
    # p, degree 8, is fitted on [0, 3.96875] by benchmarks/fit_erf.py (--gelu), which measures it
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
HELPERS.update(WELFORD_HELPERS)     # row statistics in ATen's order (triton_welford.py)


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


def _one_plus_tanh(name: str, args: list, alpha: Any, ct: str) -> tuple[Any, float, torch.dtype] | None:
    """``(u, 1.0, dtype of tanh(u))`` when the op is ``1 + tanh(u)`` (either order), ``(u, -1.0,
    dtype)`` for ``1 - tanh(u)``.

    Both are written as ``2 * sigmoid(±2u)`` = ``2 / (1 + exp(∓2u))``: one exp and one division
    where ``pp_tanh`` evaluates a polynomial, an exp, a division and two selects. It is the same
    function, more accurate where ``tanh(u)`` is near -1 (no cancellation), and GPT-2's tanh GELU
    (``0.5 * x * (1 + tanh(...))``, written with Python operators) runs on it: on sm_90 the
    kernel's SASS drops from 35 to 24 instructions a value. fp32 compute only. When tanh's result
    is half precision and the kernel emulates eager's rounding, it is ``1 ± half(1 - 2 / (1 +
    exp(2u)))`` instead: eager rounds tanh(u) before the add, and the sigmoid form's extra
    accuracy moved GPT-2's logits 1.23e-2 from eager's (1.14e-2 with that rounding)."""
    if ct != "tl.float32" or alpha != 1 or len(args) != 2:
        return None

    def is_tanh(value: Any) -> bool:
        # tanh computed in this kernel from a value computed here too (a group input's loads
        # are made per consumer, and the add is not one of the input's consumers)
        return isinstance(value, torch.fx.Node) and value.op == "call_function" \
            and packet_name(value.target) == "aten.tanh" and compute_type(meta_of(value).dtype) == "tl.float32" \
            and isinstance(value.args[0], torch.fx.Node) and value.args[0].op == "call_function"

    def is_one(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1

    if name == "aten.add":
        for i in (0, 1):
            if is_tanh(args[i]) and is_one(args[1 - i]):
                return args[i].args[0], 1.0, meta_of(args[i]).dtype
    elif is_one(args[0]) and is_tanh(args[1]):
        return args[1].args[0], -1.0, meta_of(args[1]).dtype
    return None


def pointwise_expr(node, operand: Callable[[Any, str], str], uses: set[str], emulate: bool = True) -> str:
    """Triton expression computing ``node`` in its compute type; ``operand(arg, ct)`` renders an
    argument (graph value or literal) converted to ``ct``; helpers used are added to ``uses``;
    ``emulate``: the kernel rounds every half-precision value as eager does."""
    name = packet_name(node.target)
    out_dtype = meta_of(node).dtype
    ct = compute_type(out_dtype)
    args = list(node.args)
    kw = node.kwargs
    is_float = ct in FLOAT_CT

    def a(i: int, ctype: str = ct) -> str:
        return operand(args[i], ctype)

    def erf(x: str) -> str:
        return f"tl.math.erf({x})" if ct == "tl.float64" else helper("pp_erf", x)

    def helper(fn: str, *values: str) -> str:
        if not is_float:
            raise NotImplementedError(f"{name} on {out_dtype}")
        if ct == "tl.float64" and fn in ("pp_atan", "pp_asin", "pp_acos"):
            raise NotImplementedError(f"{name} in float64 (the Triton helper is fp32-accurate)")
        uses.add(fn)
        return f"{fn}({', '.join(values)})"

    if name in UNIT_RESHAPES or name in ("aten.clone", "aten.alias", PAD):   # PAD: an output pad's value
        return a(0)
    if name in ("aten.add", "aten.sub"):
        alpha = kw.get("alpha", 1)
        shifted = _one_plus_tanh(name, args, alpha, ct)
        if shifted is not None:
            u, sign, tanh_dtype = shifted
            if emulate and tanh_dtype in (torch.float16, torch.bfloat16):
                # eager rounds tanh(u) to half before adding: round the same tanh, 1 - 2 / (1 + e^2u)
                # (its error near u = 0 is far below the half spacing of 1 + tanh)
                t = round_to(tanh_dtype, f"(1.0 - 2.0 / (1.0 + tl.exp(2.0 * {operand(u, ct)})))")
                return f"(1.0 {'+' if sign > 0 else '-'} {t})"
            return f"(2.0 / (1.0 + tl.exp({-2.0 * sign} * {operand(u, ct)})))"
        rhs = a(1) if alpha == 1 else f"({a(1)} * {literal(alpha, ct)})"
        return f"({a(0)} {'+' if name == 'aten.add' else '-'} {rhs})"
    if name == "aten.mul":
        return f"({a(0)} * {a(1)})"
    if name in ("aten.div", "prims.div"):
        return f"({a(0)} / {a(1)})"
    if name in ("aten._to_copy", "prims.convert_element_type"):
        source_ct = compute_type(value_dtype(args[0]))
        value = cast(a(0, source_ct), source_ct, ct)
        # An explicit cast to a half type always rounds (it is the point of the cast).
        return round_to(out_dtype, value) if out_dtype in (torch.float16, torch.bfloat16) else value
    if name == "aten.neg":
        return f"(-{a(0)})"
    float_fns = {"aten.exp": "tl.exp({0})", "aten.exp2": "tl.exp2({0})", "aten.log": "tl.log({0})",
                 "aten.log2": "tl.log2({0})", "aten.sin": "tl.sin({0})", "aten.cos": "tl.cos({0})",
                 "aten.tan": "(tl.sin({0}) / tl.cos({0}))",
                 "aten.sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))",
                 "aten.silu": "({0} / (1.0 + tl.exp(-{0})))", "aten.reciprocal": "(1.0 / {0})"}
    if name in float_fns:
        if not is_float:
            raise NotImplementedError(f"{name} on {out_dtype}")
        x = a(0)
        return float_fns[name].format(x)
    if name in ("aten.sqrt", "aten.rsqrt"):
        if not is_float:
            raise NotImplementedError(f"{name} on {out_dtype}")
        if name == "aten.sqrt":
            return sqrt(a(0), ct)
        # fp32: the hardware reciprocal square root, as ATen's CUDA kernels call rsqrtf (torch.rsqrt
        # and layer norm's statistics): eager's bits, where 1 / sqrt_rn(x) differs in 37 % of values
        return f"tl.math.rsqrt({a(0)})" if ct == "tl.float32" else f"(1.0 / {sqrt(a(0), ct)})"
    helpers = {"aten.expm1": "pp_expm1", "aten.log1p": "pp_log1p", "aten.tanh": "pp_tanh",
               "aten.sinh": "pp_sinh", "aten.cosh": "pp_cosh", "aten.atan": "pp_atan",
               "aten.asin": "pp_asin", "aten.acos": "pp_acos"}
    if name in helpers:
        return helper(helpers[name], a(0))
    if name == "aten.erf":
        return erf(a(0))
    if name in ("aten.floor", "aten.ceil", "aten.trunc"):
        x = a(0)
        if not is_float:
            return x
        if name == "aten.trunc":
            return f"tl.where({x} < 0.0, tl.math.ceil({x}), tl.math.floor({x}))"
        return f"tl.math.{name.split('.')[1]}({x})"
    if name == "aten.sign":
        if ct == "tl.int1":
            return a(0)
        x = a(0)
        one, zero = literal(1, ct), literal(0, ct)
        return f"tl.where({x} > {zero}, {one}, tl.where({x} < {zero}, -{one}, {zero}))"
    if name == "aten.abs":
        return a(0) if ct == "tl.int1" else f"tl.abs({a(0)})"
    if name == "aten.relu":
        x = a(0)
        zero = literal(0, ct)
        keep = f"({x} > {zero}) | ({x} != {x})" if is_float else f"{x} > {zero}"
        return f"tl.where({keep}, {x}, {zero})"
    if name in ("aten.maximum", "aten.minimum"):
        x, y = a(0), a(1)
        op = ">" if name == "aten.maximum" else "<"
        # NaN wins, as in eager: pick x when it is NaN or beats y, else y (NaN in y then stays).
        keep = f"({x} {op} {y}) | ({x} != {x})" if is_float else f"{x} {op} {y}"
        return f"tl.where({keep}, {x}, {y})"
    if name in ("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh"):
        x = a(0)
        lo, hi = clamp_bounds(node)
        expr = x
        # Comparisons with NaN are false, so a NaN input passes through both selects.
        if lo is not None:
            expr = f"tl.where({expr} < {literal(lo, ct)}, {literal(lo, ct)}, {expr})"
        if hi is not None:
            expr = f"tl.where({expr} > {literal(hi, ct)}, {literal(hi, ct)}, {expr})"
        return expr
    if name == "aten.leaky_relu":
        slope = args[1] if len(args) > 1 else 0.01
        x = a(0)
        return f"tl.where({x} > {literal(0, ct)}, {x}, {x} * {literal(slope, ct)})"
    if name == "aten.where":
        expr = f"tl.where({operand(args[0], 'tl.int1')}, {a(1)}, {a(2)})"
        if not any(isinstance(v, torch.fx.Node) for v in args[1:]):
            expr = cast(expr, "?", ct)      # two literals: give the result the node's type
        return expr
    if name in COMPARISONS:
        cmp_ct = compute_type(promoted_dtype(args[:2]))
        op = COMPARISONS[name]
        return f"({operand(args[0], cmp_ct)} {op} {operand(args[1], cmp_ct)})"
    if name in BITWISE:
        if ct == "tl.int1":     # on bool tensors the bitwise ops are the logical ones
            return f"({operand(args[0], 'tl.int1')} {BITWISE[name]} {operand(args[1], 'tl.int1')})"
        return f"({a(0)} {BITWISE[name]} {a(1)})"
    if name == "aten.bitwise_not":
        return f"({operand(args[0], 'tl.int1')} == 0)" if ct == "tl.int1" else f"(~{a(0)})"
    if name == "aten.logical_not":
        return f"({operand(args[0], 'tl.int1')} == 0)"
    if name in ("aten.logical_and", "aten.logical_or"):
        op = "&" if name == "aten.logical_and" else "|"
        return f"({operand(args[0], 'tl.int1')} {op} {operand(args[1], 'tl.int1')})"
    if name == "aten.isnan":
        source_ct = compute_type(value_dtype(args[0]))
        x = operand(args[0], source_ct)
        return f"({x} != {x})"
    if name == "aten.pow":
        return _pow(args, ct, a, operand, helper, out_dtype if emulate else None)
    if name == "aten.gelu":
        x = a(0)
        if not is_float:
            raise NotImplementedError(f"gelu on {out_dtype}")
        if kw.get("approximate", args[1] if len(args) > 1 else "none") == "tanh":
            inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
            return f"(0.5 * {x} * (1.0 + {helper('pp_tanh', inner)}))"
        if ct == "tl.float64":
            return f"(0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476)))"
        return helper("pp_gelu", x)
    raise NotImplementedError(f"no Triton for {name}")


def filled(value: Any, ct: str, like: str) -> str:
    """A block of ``value`` (type ``ct``) shaped like the value ``like`` (NaN-safe)."""
    text = literal(value, ct)
    return f"tl.where({like} == {like}, {text}, {text})"


def _pow(args: list, ct: str, a, operand, helper, rounded: torch.dtype | None) -> str:
    """``rounded``: the dtype eager rounds to after each op when the kernel emulates it. ATen's
    CUDA kernel computes a half-precision ``x ** 3`` as ``x * x * x`` in the half type itself, so
    the square is rounded before the last product (1 value in 4 differs otherwise)."""
    if ct not in FLOAT_CT:
        raise NotImplementedError("integer pow")
    if not isinstance(args[0], torch.fx.Node):
        return helper("pp_pow", filled(args[0], ct, a(1)), a(1))
    if not isinstance(args[1], torch.fx.Node):
        exponent, x = args[1], a(0)
        if isinstance(exponent, bool):
            exponent = int(exponent)
        cube = f"({round_to(rounded, f'({x} * {x})')} * {x})" if rounded in HALF else f"({x} * {x} * {x})"
        simple = {2: f"({x} * {x})", 1: x, 3: cube, 0.5: sqrt(x, ct),
                  -1: f"(1.0 / {x})", -0.5: f"(1.0 / {sqrt(x, ct)})", 0: filled(1.0, ct, x)}
        if exponent in simple:
            return simple[exponent]
        return helper("pp_pow", x, filled(float(exponent), ct, x))
    return helper("pp_pow", a(0), a(1))


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
