"""The emulation of ATen's layer-norm Welford tree with real warp shuffles (on the GPU).

As welford_cost.py's ln_exact, but the [rows, 128] per-"thread" states are laid out one column
per thread (4 warps), the intra-warp tree is PTX shfl.sync.down (what ATen's WARP_SHFL_DOWN is),
and only the 4 warp partials go through reshapes. Checks bits against eager and times it.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def shfl_down(x, OFFSET: tl.constexpr):
    return tl.inline_asm_elementwise(f"shfl.sync.down.b32 $0, $1, {OFFSET}, 0x1f, 0xffffffff;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


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
def halve(m, s, c, R: tl.constexpr, H: tl.constexpr):
    m0, m1 = tl.split(tl.permute(tl.reshape(m, [R, 2, H]), (0, 2, 1)))
    s0, s1 = tl.split(tl.permute(tl.reshape(s, [R, 2, H]), (0, 2, 1)))
    c0, c1 = tl.split(tl.permute(tl.reshape(c, [R, 2, H]), (0, 2, 1)))
    return combine(m0, s0, c0, m1, s1, c1)


@triton.jit
def ln_fast_exact(X, W, B, Y, N: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
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
        m_o = shfl_down(mean, 16 >> h)
        s_o = shfl_down(m2, 16 >> h)
        c_o = shfl_down(cnt, 16 >> h)
        mean, m2, cnt = combine(mean, m2, cnt, m_o, s_o, c_o)
    lane0 = (t % 32) == 0
    wm = tl.sum(tl.reshape(tl.where(lane0, mean, 0.0), [XB, 4, 32]), 2)
    ws = tl.sum(tl.reshape(tl.where(lane0, m2, 0.0), [XB, 4, 32]), 2)
    wc = tl.sum(tl.reshape(tl.where(lane0, cnt, 0.0), [XB, 4, 32]), 2)
    wm, ws, wc = halve(wm, ws, wc, XB, 2)
    wm, ws, wc = halve(wm, ws, wc, XB, 1)
    mean = tl.reshape(wm, [XB, 1])
    var = tl.div_rn(tl.reshape(ws, [XB, 1]), tl.full([XB, 1], N, tl.float32))
    rstd = tl.math.rsqrt(var + 1e-5)
    rr = tl.arange(0, RB)[None, :]
    m = rr < N
    x = tl.load(X + xo * N + rr, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + rr, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + rr, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + xo * N + rr, (w * (rstd * (x - mean)) + b).to(tl.bfloat16), mask=m)


@triton.jit
def ln_two_pass(X, W, B, Y, N: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
    xo = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    rr = tl.arange(0, RB)[None, :]
    m = rr < N
    x = tl.load(X + xo * N + rr, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, 1, keep_dims=True) / N
    d = tl.where(m, x - mean, 0.0)
    rstd = tl.math.rsqrt(tl.sum(d * d, 1, keep_dims=True) / N + 1e-5)
    w = tl.load(W + rr, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + rr, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + xo * N + rr, (w * (rstd * d) + b).to(tl.bfloat16), mask=m)


torch.manual_seed(0)
for M, N, XB, RB in ((8192, 4096, 1, 4096), (32768, 768, 4, 1024), (4096, 768, 4, 1024), (4096, 3072, 1, 4096),
                     (4096, 1000, 4, 1024)):
    x = (torch.randn(M, N, device="cuda") * 0.05 + torch.randn(M, 1, device="cuda") * 0.01).to(torch.bfloat16)
    w, b = torch.randn(N, device="cuda").to(torch.bfloat16), torch.randn(N, device="cuda").to(torch.bfloat16)
    ya, yb = torch.empty_like(x), torch.empty_like(x)
    grid = (M // XB,)
    expected = torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)
    ln_fast_exact[grid](x, w, b, yb, N=N, XB=XB, RB=RB, num_warps=4)
    ln_two_pass[grid](x, w, b, ya, N=N, XB=XB, RB=RB, num_warps=4)
    ta = triton.testing.do_bench(lambda: ln_two_pass[grid](x, w, b, ya, N=N, XB=XB, RB=RB, num_warps=4))
    tb = triton.testing.do_bench(lambda: ln_fast_exact[grid](x, w, b, yb, N=N, XB=XB, RB=RB, num_warps=4))
    copy = triton.testing.do_bench(lambda: ya.copy_(x))
    print(f"M {M} N {N}: two-pass {ta * 1e3:.1f} us, fast exact {tb * 1e3:.1f} us, copy {copy * 1e3:.1f} us; "
          f"values differing from eager: two-pass {int((ya != expected).sum())}, fast exact "
          f"{int((yb != expected).sum())} of {x.numel()}")
