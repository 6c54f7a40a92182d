"""Can a Triton kernel reproduce ATen's CUDA layer-norm statistics bit for bit? (a GPU probe)

    python benchmarks/probes/welford_probe.py

ATen's vectorized_layer_norm_kernel: each of T threads runs Welford's online update over 4-wide
vectors (thread t reads vectors t, t + T, ...), then a shuffle-down tree within each warp and a
shared-memory tree across warps combine the states. This emulates that with variants of the
details (threads per block, which product an fma contracts) and counts the rows whose mean and
rstd differ from torch.native_layer_norm's. Also checks fp32 division and rsqrt against eager.
"""
import itertools

import torch
import triton
import triton.language as tl


@triton.jit
def combine(m_own, s_own, c_own, m_oth, s_oth, c_oth, MEAN_FMA: tl.constexpr, S2_FMA: tl.constexpr):
    delta = m_own - m_oth
    count = c_oth + c_own
    coef = tl.div_rn(tl.full(count.shape, 1.0, tl.float32), tl.where(count > 0, count, 1.0))
    n_a = c_oth * coef
    n_b = c_own * coef
    if MEAN_FMA == 0:
        mean = tl.fma(n_a, m_oth, n_b * m_own)
    else:
        mean = tl.fma(n_b, m_own, n_a * m_oth)
    if S2_FMA == 0:
        s2 = tl.fma(delta * delta * c_oth, n_b, s_oth + s_own)
    else:
        s2 = tl.fma(delta, delta * c_oth * n_b, s_oth + s_own)
    return tl.where(count > 0, mean, 0.0), tl.where(count > 0, s2, 0.0), count


@triton.jit
def halve(m, s, c, ROWS: tl.constexpr, A: tl.constexpr, H: tl.constexpr, MEAN_FMA: tl.constexpr, S2_FMA: tl.constexpr):
    # [ROWS, A, 2, H]: element (a, 0, h) combines with (a, 1, h)
    m0, m1 = tl.split(tl.permute(tl.reshape(m, [ROWS, A, 2, H]), (0, 1, 3, 2)))
    s0, s1 = tl.split(tl.permute(tl.reshape(s, [ROWS, A, 2, H]), (0, 1, 3, 2)))
    c0, c1 = tl.split(tl.permute(tl.reshape(c, [ROWS, A, 2, H]), (0, 1, 3, 2)))
    m, s, c = combine(m0, s0, c0, m1, s1, c1, MEAN_FMA, S2_FMA)
    return tl.reshape(m, [ROWS, A * H]), tl.reshape(s, [ROWS, A * H]), tl.reshape(c, [ROWS, A * H])


@triton.jit
def stats_kernel(X, MEAN, RSTD, N: tl.constexpr, T: tl.constexpr, WARPS: tl.constexpr, EPS: tl.constexpr,
                 MEAN_FMA: tl.constexpr, S2_FMA: tl.constexpr, APPROX_RSQRT: tl.constexpr):
    row = tl.program_id(0)
    t = tl.arange(0, T)[None, :]
    mean = tl.zeros([1, T], tl.float32)
    m2 = tl.zeros([1, T], tl.float32)
    cnt = tl.zeros([1, T], tl.float32)
    for c in tl.static_range((N // 4 + T - 1) // T):
        for j in tl.static_range(4):
            vec = c * T + t
            valid = vec < N // 4
            v = tl.load(X + row * N + vec * 4 + j, mask=valid, other=0.0).to(tl.float32)
            delta = v - mean
            nc = cnt + 1.0
            nm = tl.fma(delta, tl.div_rn(tl.full(nc.shape, 1.0, tl.float32), nc), mean)
            ns = tl.fma(delta, v - nm, m2)
            mean = tl.where(valid, nm, mean)
            m2 = tl.where(valid, ns, m2)
            cnt = tl.where(valid, nc, cnt)
    # thread index t = lane + 32 * warp: lanes halve first (offsets 16..1), then warps
    mean, m2, cnt = halve(mean, m2, cnt, 1, WARPS, 16, MEAN_FMA, S2_FMA)
    mean, m2, cnt = halve(mean, m2, cnt, 1, WARPS, 8, MEAN_FMA, S2_FMA)
    mean, m2, cnt = halve(mean, m2, cnt, 1, WARPS, 4, MEAN_FMA, S2_FMA)
    mean, m2, cnt = halve(mean, m2, cnt, 1, WARPS, 2, MEAN_FMA, S2_FMA)
    mean, m2, cnt = halve(mean, m2, cnt, 1, WARPS, 1, MEAN_FMA, S2_FMA)
    W: tl.constexpr = WARPS
    if W == 8:
        mean, m2, cnt = halve(mean, m2, cnt, 1, 1, 4, MEAN_FMA, S2_FMA)
    if W >= 4:
        mean, m2, cnt = halve(mean, m2, cnt, 1, 1, 2, MEAN_FMA, S2_FMA)
    if W >= 2:
        mean, m2, cnt = halve(mean, m2, cnt, 1, 1, 1, MEAN_FMA, S2_FMA)
    var = tl.div_rn(m2, tl.full(m2.shape, N, tl.float32)) + EPS
    if APPROX_RSQRT:
        rstd = tl.math.rsqrt(var)
    else:
        rstd = tl.div_rn(tl.full(var.shape, 1.0, tl.float32), tl.sqrt_rn(var))
    tl.store(MEAN + row + tl.arange(0, 1)[None, :], mean)
    tl.store(RSTD + row + tl.arange(0, 1)[None, :], rstd)


@triton.jit
def elementwise(A, B, DIV, DIV_RN, RSQ, RSQ_PRECISE, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    a = tl.load(A + i, mask=m, other=1.0)
    b = tl.load(B + i, mask=m, other=1.0)
    tl.store(DIV + i, a / b, mask=m)
    tl.store(DIV_RN + i, tl.div_rn(a, b), mask=m)
    tl.store(RSQ + i, tl.math.rsqrt(b), mask=m)
    tl.store(RSQ_PRECISE + i, 1.0 / tl.sqrt_rn(b), mask=m)


torch.manual_seed(0)
n = 1 << 22
a, b = torch.randn(n, device="cuda"), torch.rand(n, device="cuda") * 10 + 0.01
outs = [torch.empty_like(a) for _ in range(4)]
elementwise[(n // 1024,)](a, b, *outs, n, BLOCK=1024)
print("fp32 a / b:     Triton '/' differs from eager in", int((outs[0] != a / b).sum()), "of", n,
      "; tl.div_rn in", int((outs[1] != a / b).sum()))
print("fp32 rsqrt(b):  tl.math.rsqrt differs from eager in", int((outs[2] != torch.rsqrt(b)).sum()),
      "; 1/sqrt_rn in", int((outs[3] != torch.rsqrt(b)).sum()))

for N in (768, 4096, 1024, 3072, 2304, 512, 100 * 4):
    x = (torch.randn(4096, N, device="cuda") * 0.05 + torch.randn(4096, 1, device="cuda") * 0.01).to(torch.bfloat16)
    _, mean_e, rstd_e = torch.native_layer_norm(x, (N,), None, None, 1e-5)
    mean_e, rstd_e = mean_e.reshape(-1), rstd_e.reshape(-1)
    results = []
    for T, mf, sf, ar in itertools.product((128, 256), (0, 1), (0, 1), (1, 0)):
        mean, rstd = torch.empty(4096, device="cuda"), torch.empty(4096, device="cuda")
        stats_kernel[(4096,)](x, mean, rstd, N=N, T=T, WARPS=T // 32, EPS=1e-5, MEAN_FMA=mf, S2_FMA=sf,
                              APPROX_RSQRT=ar, num_warps=4)
        results.append((int((mean != mean_e).sum()), int((rstd != rstd_e).sum()), T, mf, sf, ar))
    results.sort()
    print(f"N {N}: best (mean rows differing, rstd rows differing, threads, mean_fma, s2_fma, approx_rsqrt):",
          results[:3])
