"""C++ expressions for each fusable ATen operator (the C++ backend's op table)."""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from pipeline.fused import BITWISE, COMPARISONS, PAD, UNIT_RESHAPES, clamp_bounds, meta_of, packet_name, promoted_dtype, value_dtype

C_STORAGE = {torch.float32: "float", torch.float64: "double", torch.float16: "_Float16",
             torch.bfloat16: "uint16_t", torch.int8: "int8_t", torch.uint8: "uint8_t",
             torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t", torch.bool: "bool"}


def compute_type(dtype: torch.dtype) -> str:
    """The C type arithmetic runs in: fp32 for half types (fp32 accumulation), int64 for ints."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "float"
    if dtype == torch.float64:
        return "double"
    if dtype == torch.bool:
        return "bool"
    return "int64_t"


def load_expr(pointer: str, offset: str, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"bf16_to_f({pointer}[{offset}])"
    return f"({compute_type(dtype)}){pointer}[{offset}]"


def store_expr(value: str, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"f_to_bf16({value})"
    return f"({C_STORAGE[dtype]})({value})"


def round_to(dtype: torch.dtype, value: str) -> str:
    """Round a compute value to ``dtype``'s precision, as eager does after every op."""
    if dtype == torch.bfloat16:
        return f"bf16_to_f(f_to_bf16({value}))"
    if dtype == torch.float16:
        return f"(float)(_Float16)({value})"
    return value


def literal(value: Any, ctype: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"(({ctype})INT64_C({value}))"
    if isinstance(value, float):
        if math.isnan(value):
            return f"(({ctype})NAN)"
        if math.isinf(value):
            return f"(({ctype})({'-' if value < 0 else ''}INFINITY))"
        return f"(({ctype}){value!r})"
    raise TypeError(f"unsupported literal {value!r}")




def select(cond: str, a: str, b: str, ctype: str) -> str:
    """Branch-free ``cond ? a : b`` (a plain ternary can stop GCC from vectorizing the loop when
    the arms involve calls)."""
    return f"pp_select<{ctype}>({cond}, {a}, {b})"


def nan_guard(a: str, expr: str, ctype: str) -> str:
    """``expr`` unless ``a`` is NaN (torch propagates NaN through max/min/clamp/relu)."""
    if ctype in ("float", "double"):
        return select(f"({a}) != ({a})", a, expr, ctype)
    return expr


def pointwise_expr(node: torch.fx.Node, operand: Callable[[Any, str], str], emulate: bool = True) -> str:
    """C expression computing ``node`` in its compute type; ``operand(arg, ctype)`` renders an
    argument (graph value or literal) converted to ``ctype``; ``emulate``: the kernel rounds every
    half-precision value as eager does."""
    name = packet_name(node.target)
    out_dtype = meta_of(node).dtype
    ct = compute_type(out_dtype)
    args = list(node.args)
    kw = node.kwargs

    def a(i: int, ctype: str = ct) -> str:
        return operand(args[i], ctype)

    if name in UNIT_RESHAPES:
        return a(0)
    if name in ("aten.add", "aten.sub"):
        alpha = kw.get("alpha", 1)
        rhs = a(1) if alpha == 1 else f"({a(1)} * {literal(alpha, ct)})"
        return f"({a(0)} {'+' if name == 'aten.add' else '-'} {rhs})"
    if name == "aten.mul":
        return f"({a(0)} * {a(1)})"
    if name in ("aten.div", "prims.div"):
        return f"({a(0)} / {a(1)})"
    simple = {"aten.neg": "(-{0})", "aten.exp": "pp_exp({0})", "aten.exp2": "pp_exp2({0})",
              "aten.expm1": "pp_expm1({0})", "aten.log": "pp_log({0})", "aten.log1p": "pp_log1p({0})",
              "aten.log2": "pp_log2({0})", "aten.sqrt": "std::sqrt({0})",
              "aten.rsqrt": "(({t})1 / std::sqrt({0}))", "aten.reciprocal": "(({t})1 / {0})",
              "aten.sin": "pp_sin({0})", "aten.cos": "pp_cos({0})", "aten.tan": "pp_tan({0})",
              "aten.tanh": "pp_tanh({0})", "aten.atan": "pp_atan({0})", "aten.asin": "pp_asin({0})",
              "aten.acos": "pp_acos({0})", "aten.sinh": "pp_sinh({0})", "aten.cosh": "pp_cosh({0})",
              "aten.sigmoid": "(({t})1 / (({t})1 + pp_exp(-{0})))", "aten.erf": "pp_erf({0})",
              "aten.floor": "std::floor({0})", "aten.ceil": "std::ceil({0})", "aten.trunc": "std::trunc({0})",
              "aten.silu": "({0} / (({t})1 + pp_exp(-{0})))", "aten.clone": "{0}", "aten.alias": "{0}",
              PAD: "{0}",   # an output pad's value (pipeline.fused.PAD: the store lands in the padded layout)
              "aten._to_copy": "{0}", "prims.convert_element_type": "{0}"}
    if name in simple:
        source_ct = ct
        if name in ("aten._to_copy", "prims.convert_element_type"):
            source_ct = compute_type(value_dtype(args[0]))
            value = a(0, source_ct)
            if out_dtype == torch.bool:
                return f"({value} != 0)"
            return f"(({ct}){value})"
        return simple[name].format(a(0), t=ct)
    if name == "aten.sign":
        x = a(0)
        if ct == "bool":
            return x
        return nan_guard(x, f"(({ct})({x} > 0) - ({ct})({x} < 0))", ct)
    if name == "aten.abs":
        return f"std::abs({a(0)})" if ct != "bool" else a(0)
    if name == "aten.relu":
        x = a(0)
        return nan_guard(x, select(f"{x} > 0", x, f"({ct})0", ct), ct)
    if name in ("aten.maximum", "aten.minimum"):
        x, y = a(0), a(1)
        op = ">" if name == "aten.maximum" else "<"
        return nan_guard(x, nan_guard(y, select(f"{x} {op} {y}", x, y, ct), ct), ct)
    if name in ("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh"):
        x = a(0)
        lo, hi = clamp_bounds(node)
        expr = x
        if lo is not None:
            expr = select(f"{expr} < {literal(lo, ct)}", literal(lo, ct), expr, ct)
        if hi is not None:
            expr = select(f"{expr} > {literal(hi, ct)}", literal(hi, ct), expr, ct)
        return nan_guard(x, expr, ct)
    if name == "aten.leaky_relu":
        slope = args[1] if len(args) > 1 else 0.01
        x = a(0)
        return select(f"{x} > 0", x, f"{x} * {literal(slope, ct)}", ct)
    if name == "aten.where":
        return select(operand(args[0], "bool"), a(1), a(2), ct)
    if name in COMPARISONS:
        cmp_ct = compute_type(promoted_dtype(args[:2]))
        op = COMPARISONS[name]
        return f"({operand(args[0], cmp_ct)} {op} {operand(args[1], cmp_ct)})"
    if name in BITWISE:
        if ct == "bool":     # on bool tensors the bitwise ops are the logical ones
            return f"((bool)({operand(args[0], 'bool')} {BITWISE[name]} {operand(args[1], 'bool')}))"
        return f"(({ct})({a(0)} {BITWISE[name]} {a(1)}))"
    if name == "aten.bitwise_not":
        return f"(!{operand(args[0], 'bool')})" if ct == "bool" else f"(({ct})(~{a(0)}))"
    if name == "aten.logical_not":
        return f"(!{operand(args[0], 'bool')})"
    if name in ("aten.logical_and", "aten.logical_or"):
        op = "&&" if name == "aten.logical_and" else "||"
        return f"({operand(args[0], 'bool')} {op} {operand(args[1], 'bool')})"
    if name == "aten.isnan":
        x = operand(args[0], compute_type(value_dtype(args[0])))
        return f"({x} != {x})"
    if name == "aten.pow":
        if not isinstance(args[0], torch.fx.Node):
            return f"pp_pow({literal(args[0], ct)}, {a(1)})"
        if not isinstance(args[1], torch.fx.Node):
            exponent = args[1]
            x = a(0)
            if exponent == 2:
                return f"({x} * {x})"
            if exponent == 3 and emulate and out_dtype == torch.bfloat16:
                # ATen's CPU kernel computes a bf16 x ** 3 as x * x * x in bf16: the square is
                # rounded before the last product (fp16 goes through std::pow, rounded once)
                return f"({round_to(out_dtype, f'({x} * {x})')} * {x})"
            if exponent == 1:
                return x
            if exponent == 0.5 and ct in ("float", "double"):
                return f"std::sqrt({x})"
            if ct == "int64_t":
                raise NotImplementedError("integer pow")
            return f"pp_pow({x}, {literal(float(exponent), ct)})"
        return f"pp_pow({a(0)}, {a(1)})"
    if name == "aten.gelu":
        x = a(0)
        if kw.get("approximate", args[1] if len(args) > 1 else "none") == "tanh":
            return (f"(({ct})0.5 * {x} * (({ct})1 + pp_tanh(({ct})0.7978845608028654 * "
                    f"({x} + ({ct})0.044715 * {x} * {x} * {x}))))")
        return f"(({ct})0.5 * {x} * (({ct})1 + pp_gelu_erf({x} * ({ct})0.7071067811865476)))"
    raise NotImplementedError(f"no C++ for {name}")
