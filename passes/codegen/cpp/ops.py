"""The C++ backend's spelling of values: C types, loads, stores, literals, and the :class:`CppEmitter`
that renders the operator rules of ``passes/kernel_ir/rules.py``."""
from __future__ import annotations

import math
from typing import Any

import torch

from passes.kernel_ir.values import BINARY, COMPARE, Emitter, Value, bare

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


class CppEmitter(Emitter):
    """Spells operator rules (passes/kernel_ir/rules.py) in C++: compute types ``float``, ``double``,
    ``int64_t`` and ``bool``, math through the kernel header's ``pp_*`` functions (libmvec's
    vector variants, exp and exp2 written out), selects branch-free (:func:`select`)."""

    FUNCTIONS = {"exp": "pp_exp", "exp2": "pp_exp2", "expm1": "pp_expm1", "log": "pp_log", "log1p": "pp_log1p",
                 "log2": "pp_log2", "sqrt": "std::sqrt", "sin": "pp_sin", "cos": "pp_cos", "tan": "pp_tan",
                 "tanh": "pp_tanh", "atan": "pp_atan", "asin": "pp_asin", "acos": "pp_acos", "sinh": "pp_sinh",
                 "cosh": "pp_cosh", "erf": "pp_erf", "floor": "std::floor", "ceil": "std::ceil",
                 "trunc": "std::trunc", "abs": "std::abs", "pow": "pp_pow", "floordiv": "pp_floordiv",
                 "truncdiv": "pp_truncdiv"}

    def type_name(self, dtype: torch.dtype) -> str:
        return compute_type(dtype)

    def literal(self, value: Any, dtype: torch.dtype) -> str:
        return literal(value, compute_type(dtype))

    def binary(self, v: Value) -> str:
        a, b = self.infix_operand(v, 0), self.infix_operand(v, 1)
        if v.op in COMPARE:
            return f"({a} {COMPARE[v.op]} {b})"
        if v.op in ("and", "or", "xor"):    # C promotes the operands to int: back to the value's type
            return f"(({compute_type(v.dtype)})({a} {BINARY[v.op]} {b}))"
        return f"({a} {BINARY[v.op]} {b})"

    def unary(self, v: Value) -> str:
        x = self.emit(v.args[0])
        if v.op == "neg":
            return f"(-{x})"
        return f"(!{x})" if v.dtype == torch.bool else f"(({compute_type(v.dtype)})(~{x}))"

    def function(self, v: Value) -> str:
        return f"{self.FUNCTIONS[v.op]}({', '.join(bare(self.emit(x)) for x in v.args)})"

    def where(self, v: Value) -> str:
        return select(*(bare(self.emit(x)) for x in v.args), compute_type(v.dtype))

    def cast(self, v: Value) -> str:
        x, source = self.emit(v.args[0]), v.args[0].dtype
        if source == v.dtype:
            return x
        return f"({x} != 0)" if v.dtype == torch.bool else f"(({compute_type(v.dtype)}){x})"

    def round(self, v: Value) -> str:
        return round_to(v.param, self.emit(v.args[0]))

    def formula_gelu_erf(self, v: Value) -> str:
        """GELU's erf: ATen's vectorized CPU GELU's (Abramowitz and Stegun 7.1.26 on ``pp_exp``,
        in the kernel header), faster under GELU than libmvec's erf."""
        return f"pp_gelu_erf({bare(self.emit(v.args[0]))})"

    def formula_cube(self, v: Value) -> str | None:
        """ATen's CPU kernel computes ``x ** 3`` as ``x * x * x`` in the tensor's dtype for
        float32, float64 and bfloat16 (the rule's product, its square rounded under emulation);
        float16 goes through ``std::pow`` in float, rounded once, so it keeps ``pp_pow``. (The
        product is also what keeps the loop fast: libmvec's vector ``powf`` takes a scalar path
        for every negative base.)"""
        return None if v.param == torch.float16 else self.emit(v.args[0])
