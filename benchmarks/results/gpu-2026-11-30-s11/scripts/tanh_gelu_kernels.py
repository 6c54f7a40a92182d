import triton, triton.language as tl
@triton.jit
def tanh_div(x):
    a = tl.abs(x)
    z = x * x
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
              + 1.33314422036e-1) * z - 3.33332819422e-1) * z * x + x
    big = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    return tl.where(a < 0.625, small, tl.where(x < 0.0, -big, big))
@triton.jit
def tanh_fdiv(x):
    a = tl.abs(x)
    z = x * x
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
              + 1.33314422036e-1) * z - 3.33332819422e-1) * z * x + x
    big = 1.0 - tl.fdiv(2.0, tl.exp(2.0 * a) + 1.0)
    return tl.where(a < 0.625, small, tl.where(x < 0.0, -big, big))
@triton.jit
def k_div(X, Y, N: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    if FAST:
        t = tanh_fdiv(inner)
    else:
        t = tanh_div(inner)
    tl.store(Y + offs, (0.5 * x * (1.0 + t)).to(tl.bfloat16))
@triton.jit
def k_sig(X, Y, N: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    s = 1.0 / (1.0 + tl.exp(-2.0 * inner))
    tl.store(Y + offs, (0.5 * x * (2.0 * s)).to(tl.bfloat16))
@triton.jit
def k_emul(X, Y, N: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(tl.float32)
    inner = (0.7978845608028654 * (x + 0.044715 * x * x * x)).to(tl.bfloat16).to(tl.float32)
    t = (1.0 - 2.0 / (1.0 + tl.exp(2.0 * inner))).to(tl.bfloat16).to(tl.float32)
    s = (1.0 + t).to(tl.bfloat16).to(tl.float32)
    tl.store(Y + offs, (0.5 * x * s).to(tl.bfloat16))
@triton.jit
def k_div2(X, Y, N: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(tl.float32)
    inner = (0.7978845608028654 * (x + 0.044715 * x * x * x)).to(tl.bfloat16).to(tl.float32)
    t = tanh_div(inner).to(tl.bfloat16).to(tl.float32)
    s = (1.0 + t).to(tl.bfloat16).to(tl.float32)
    tl.store(Y + offs, (0.5 * x * s).to(tl.bfloat16))
