"""Which cheap reciprocals of a Welford count equal IEEE division 1/c (tl.div_rn) for every
integer count 1..65536? (a GPU probe; the count of any row a persistent kernel holds is at most
8192)

    python benchmarks/probes/reciprocal_check.py

Prints, for ``1.0 / c`` (div.full), rcp.approx plus one Newton fma step and div.full plus one
Newton fma step, how many counts differ from ``tl.div_rn``. The H200 run of 2026-11-30 (commit
615f8bd) is ``benchmarks/results/gpu-2026-11-30-f/reciprocal-check.txt``.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def recips(C, OUT, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    c = tl.load(C + i, mask=m, other=1.0)
    exact = tl.div_rn(tl.full(c.shape, 1.0, tl.float32), c)
    full = 1.0 / c
    approx = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [c], dtype=tl.float32, is_pure=True, pack=1)
    newton = tl.fma(approx, tl.fma(-c, approx, 1.0), approx)
    full_newton = tl.fma(full, tl.fma(-c, full, 1.0), full)
    tl.store(OUT + i, exact, mask=m)
    tl.store(OUT + n + i, full, mask=m)
    tl.store(OUT + 2 * n + i, newton, mask=m)
    tl.store(OUT + 3 * n + i, full_newton, mask=m)


def main():
    n = 65536
    c = torch.arange(1, n + 1, device="cuda", dtype=torch.float32)
    out = torch.empty(4 * n, device="cuda")
    recips[(n // 1024,)](c, out, n, BLOCK=1024)
    exact, full, newton, full_newton = out.view(4, n)
    ref = (1.0 / c.double()).float()
    print(f"div_rn vs correctly rounded (fp64): {int((exact != ref).sum())} of {n} differ")
    for name, got in (("1.0 / c (div.full)", full), ("rcp.approx + Newton fma", newton),
                      ("div.full + Newton fma", full_newton)):
        bad = (got != exact).nonzero().flatten()
        print(f"{name}: {bad.numel()} of {n} differ from div_rn; first counts: {(bad[:8] + 1).tolist()}; "
              f"within 8192: {int((bad < 8192).sum())}")


if __name__ == "__main__":
    main()
