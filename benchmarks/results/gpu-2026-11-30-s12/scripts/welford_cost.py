"""What does computing layer-norm statistics as ATen's CUDA kernel does cost? (on the GPU)

Two persistent Triton layer-norm kernels over bf16 rows: A computes mean and variance in two
passes over the row tile (as the Triton backend does now); B computes them with the emulation of
ATen's Welford tree (strided per-"thread" loads, online updates, shuffle/shared-memory tree) and
normalizes the row tile. Times against a device copy of the same bytes.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def combine(m_own, s_own, c_own, m_oth, s_oth, c_oth):
    delta = m_own - m_oth
    count = c_oth + c_own
    coef = tl.div_rn(tl.full(count.shape, 1.0, tl.float32), tl.where(count > 0, count, 1.0))
    n_a = c_oth * coef
    n_b = c_own * coef
    mean = tl.fma(n_a, m_oth, n_b * m_own)
    s2 = tl.fma(delta * delta * c_oth, n_b, s_oth + s_own)
    return tl.where(count > 0, mean, 0.0), tl.where(count > 0, s2, 0.0), count


@triton.jit
def halve(m, s, c, R: tl.constexpr, A: tl.constexpr, H: tl.constexpr):
    m0, m1 = tl.split(tl.permute(tl.reshape(m, [R, A, 2, H]), (0, 1, 3, 2)))
    s0, s1 = tl.split(tl.permute(tl.reshape(s, [R, A, 2, H]), (0, 1, 3, 2)))
    c0, c1 = tl.split(tl.permute(tl.reshape(c, [R, A, 2, H]), (0, 1, 3, 2)))
    m, s, c = combine(m0, s0, c0, m1, s1, c1)
    return tl.reshape(m, [R, A * H]), tl.reshape(s, [R, A * H]), tl.reshape(c, [R, A * H])


@triton.jit
def ln_two_pass(X, W, B, Y, N: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
    xo = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    rr = tl.arange(0, RB)[None, :]
    m = rr < N
    x = tl.load(X + xo * N + rr, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, 1, keep_dims=True) / N
    d = tl.where(m, x - mean, 0.0)
    var = tl.sum(d * d, 1, keep_dims=True) / N
    rstd = tl.math.rsqrt(var + 1e-5)
    w = tl.load(W + rr, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + rr, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + xo * N + rr, (d * rstd * w + b).to(tl.bfloat16), mask=m)


@triton.jit
def ln_exact(X, W, B, Y, N: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
    xo = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    t = tl.arange(0, 128)[None, :]
    mean = tl.zeros([XB, 128], tl.float32)
    m2 = tl.zeros([XB, 128], tl.float32)
    cnt = tl.zeros([XB, 128], tl.float32)
    for c in tl.static_range((N // 4 + 127) // 128):
        for j in tl.static_range(4):
            vec = c * 128 + t
            valid = vec < N // 4
            v = tl.load(X + xo * N + vec * 4 + j, mask=valid, other=0.0).to(tl.float32)
            delta = v - mean
            nm = tl.fma(delta, 1.0 / (c * 4 + j + 1), mean)
            ns = tl.fma(delta, v - nm, m2)
            mean = tl.where(valid, nm, mean)
            m2 = tl.where(valid, ns, m2)
            cnt = tl.where(valid, cnt + 1.0, cnt)
    for h in tl.static_range(5):
        mean, m2, cnt = halve(mean, m2, cnt, XB, 4, 16 >> h)
    mean, m2, cnt = halve(mean, m2, cnt, XB, 1, 2)
    mean, m2, cnt = halve(mean, m2, cnt, XB, 1, 1)
    var = tl.div_rn(m2, tl.full(m2.shape, N, tl.float32))
    rstd = tl.math.rsqrt(var + 1e-5)
    rr = tl.arange(0, RB)[None, :]
    m = rr < N
    x = tl.load(X + xo * N + rr, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + rr, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + rr, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + xo * N + rr, (w * (rstd * (x - mean)) + b).to(tl.bfloat16), mask=m)


torch.manual_seed(0)
for M, N, XB, RB, warps in ((8192, 4096, 1, 4096, 8), (32768, 768, 4, 1024, 4), (4096, 768, 4, 1024, 4)):
    x = torch.randn(M, N, device="cuda").to(torch.bfloat16)
    w, b = torch.randn(N, device="cuda").to(torch.bfloat16), torch.randn(N, device="cuda").to(torch.bfloat16)
    ya, yb = torch.empty_like(x), torch.empty_like(x)
    grid = (M // XB,)
    ta = triton.testing.do_bench(lambda: ln_two_pass[grid](x, w, b, ya, N=N, XB=XB, RB=RB, num_warps=warps))
    tb = triton.testing.do_bench(lambda: ln_exact[grid](x, w, b, yb, N=N, XB=XB, RB=RB, num_warps=warps))
    tb4 = triton.testing.do_bench(lambda: ln_exact[grid](x, w, b, yb, N=N, XB=XB, RB=RB, num_warps=4))
    copy = triton.testing.do_bench(lambda: ya.copy_(x))
    expected = torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)
    print(f"M {M} N {N}: two-pass {ta * 1e3:.1f} us, exact-stats {tb * 1e3:.1f} us ({warps} warps), "
          f"{tb4 * 1e3:.1f} us (4 warps), copy {copy * 1e3:.1f} us; differing from eager: two-pass "
          f"{int((ya != expected).sum())}, exact {int((yb != expected).sum())} of {x.numel()}")
