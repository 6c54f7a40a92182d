"""Fit the constants of the Triton backend's branch-free fp32 erf (``pp_erf`` in
``passes/codegen/triton/ops.py``) and of its exact GELU (``pp_gelu``), and measure
them in fp32 arithmetic.

    python benchmarks/probes/fit_erf.py            # erf
    python benchmarks/probes/fit_erf.py --gelu     # GELU

GELU is computed as x * Phi(x) with h = erfc(|x| / sqrt(2)) / 2 = exp2(p(t)), t = |x| / sqrt(2):
Phi = 1 - h for x >= 0, h below. p (degree 8) is fitted on [0, GELU_FIT_HI] weighted so that its
error, carried into GELU, is at most a fraction of the tests' bound 1e-7 * |x| + 3e-7 * |gelu(x)|
(for x < 0 an error e in p moves gelu by |x| * h * e * ln 2). The measurement evaluates the helper
in fp32 over every float of |x| in [2**-12, 16] and prints the largest error as a fraction of that
bound, and where p falls below -150 (t clamped there or beyond makes h exactly 0).

The form, for t = |x|:

    t <  SPLIT:  erf(x) = x * q(x*x)                          q of degree 3 (relative error)
    t >= SPLIT:  erf(x) = sign(x) * (1 - exp2(p(min(t, CLAMP))))   p(t) ~ log2(erfc(t)), degree 6

Each polynomial is a float64 weighted least-squares fit on a dense grid, iterated toward minimax
(Lawson's reweighting) in a Chebyshev basis, then converted to Horner coefficients and rounded to
fp32. p is weighted by erfc(t) * ln 2, the derivative of erf's absolute error by p's error; q is
fitted for erf's relative error. The reference is ``torch.special.erf``/``erfc`` in float64.
The measurement then evaluates the helper exactly as written, in numpy float32 (each Horner step
once with an fp32 multiply and add, once as a fused multiply-add, as a GPU contracts it), over
every fp32 value in [2**-12, 4] and a sample below, and prints the largest absolute error and
the largest relative error below 0.5 (where the result is a normal fp32 number). GPUs' exp2 (MUFU.EX2) is off by up to ~2 ulp; the last
line bounds what that adds.
"""
from __future__ import annotations

import math

import numpy as np
import torch

SPLIT = 0.45             # below: the odd polynomial; above: 1 - exp2(p)
CLAMP = 3.96875          # erfc(CLAMP) < 2**-25, so 1 - exp2(p(CLAMP)) rounds to exactly 1.0
Q_DEGREE, P_DEGREE = 3, 6


def erf64(x: np.ndarray) -> np.ndarray:
    return torch.special.erf(torch.from_numpy(np.asarray(x, np.float64))).numpy()


def erfc64(x: np.ndarray) -> np.ndarray:
    return torch.special.erfc(torch.from_numpy(np.asarray(x, np.float64))).numpy()


def minimax(u: np.ndarray, target: np.ndarray, weight: np.ndarray, degree: int) -> np.polynomial.Chebyshev:
    """Chebyshev series in u in [-1, 1] minimizing max |weight * (series - target)| (Lawson)."""
    basis = np.polynomial.chebyshev.chebvander(u, degree)
    lawson = np.full(len(u), 1.0 / len(u))
    for _ in range(400):
        root = np.sqrt(lawson) * weight
        coef = np.linalg.lstsq(basis * root[:, None], target * root, rcond=None)[0]
        err = np.abs(weight * (basis @ coef - target))
        lawson *= err / err.max() + 1e-12
        lawson /= lawson.sum()
    return np.polynomial.Chebyshev(coef)


def horner_coefficients(series: np.polynomial.Chebyshev, lo: float, hi: float) -> np.ndarray:
    """fp32 coefficients, highest power first, of the series as a polynomial of the original variable."""
    mapped = np.polynomial.Chebyshev(series.coef, domain=[lo, hi])      # v in [lo, hi] -> u in [-1, 1]
    mono = mapped.convert(kind=np.polynomial.Polynomial).coef
    return mono[::-1].astype(np.float32)


def fit() -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(0.0, SPLIT, 20001)[1:]
    ratio = erf64(x) / x                                 # erf(x) = x * q(x*x)
    q = minimax(2 * (x * x) / SPLIT**2 - 1, ratio, 1.0 / ratio, Q_DEGREE)
    t = np.linspace(SPLIT, CLAMP, 40001)
    tail = erfc64(t)
    p = minimax(2 * (t - SPLIT) / (CLAMP - SPLIT) - 1, np.log2(tail), tail * math.log(2), P_DEGREE)
    return horner_coefficients(q, 0.0, SPLIT**2), horner_coefficients(p, SPLIT, CLAMP)


def horner(coefficients: np.ndarray, v: np.ndarray, fused: bool) -> np.ndarray:
    r = np.full_like(v, coefficients[0])
    for c in coefficients[1:]:
        if fused:       # the product of two fp32 values is exact in float64: one rounding, as an FMA
            r = (r.astype(np.float64) * v + np.float64(c)).astype(np.float32)
        else:
            r = r * v + c
    return r


def erf32(x: np.ndarray, q: np.ndarray, p: np.ndarray, fused: bool) -> np.ndarray:
    """pp_erf in fp32, step by step as the Triton helper computes it."""
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(x)
        small = x * horner(q, x * x, fused)
        big = np.float32(1) - np.exp2(horner(p, np.minimum(a, np.float32(CLAMP)), fused))
        big = np.where(x < 0, -big, big)
        return np.where(a >= np.float32(SPLIT), big, small)


def every_float(lo: float, hi: float):
    """Every fp32 value in [lo, hi), in chunks."""
    first, last = (int(np.float32(v).view(np.int32)) for v in (lo, hi))
    for start in range(first, last, 1 << 23):
        yield np.arange(start, min(start + (1 << 23), last), dtype=np.int32).view(np.float32)


def measure(q: np.ndarray, p: np.ndarray, fused: bool) -> tuple[float, float, float]:
    """(max abs error, max relative error below 0.5, max erfc of the inputs that take exp2)."""
    worst_abs = worst_rel = 0.0
    chunks = list(every_float(2.0**-12, 4.0))
    chunks.append(np.float32(2.0) ** np.random.default_rng(0).uniform(-149, -12, 1 << 20).astype(np.float32))
    for x in chunks:
        x = np.concatenate([x, -x])
        want, got = erf64(x), erf32(x, q, p, fused).astype(np.float64)
        err = np.abs(got - want)
        worst_abs = max(worst_abs, err.max())
        small = (np.abs(x) < 0.5) & (np.abs(want) >= 2.0**-126)     # normal results: fp32 can hold them
        if small.any():
            worst_rel = max(worst_rel, (err[small] / np.abs(want[small])).max())
    return worst_abs, worst_rel, float(erfc64(SPLIT))


GELU_FIT_HI, GELU_CLAMP, GELU_DEGREE = 3.96875, 8.0, 8


def fit_gelu() -> np.ndarray:
    t = np.linspace(0.0, GELU_FIT_HI, 80001)
    h = erfc64(t) / 2
    weight = h * math.log(2) / (1e-7 + 3e-7 * h)
    return horner_coefficients(minimax(2 * t / GELU_FIT_HI - 1, np.log2(h), weight, GELU_DEGREE), 0.0, GELU_FIT_HI)


def gelu32(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """pp_gelu in fp32, step by step as the helpers compute it (fused multiply-adds)."""
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.minimum(np.abs(x) * np.float32(0.7071067811865476), np.float32(GELU_CLAMP))
        h = np.exp2(horner(p, t, True))
        return x * np.where(x >= 0, np.float32(1) - h, h)


def main_gelu() -> None:
    p = fit_gelu()
    print("p (log2(erfc(t) / 2), 0 <= t <= %g), highest power first:" % GELU_FIT_HI)
    print("   ", ", ".join(f"{float(c):.9g}" for c in p))
    worst, where = 0.0, 0.0
    for x in every_float(2.0**-12, 16.0):
        x = np.concatenate([x, -x])
        xd = torch.from_numpy(x.astype(np.float64))
        want = (0.5 * xd * torch.special.erfc(-xd / math.sqrt(2))).numpy()
        ratio = np.abs(gelu32(x, p) - want) / (1e-7 * np.abs(x) + 3e-7 * np.abs(want) + 1e-45)
        if ratio.max() > worst:
            worst, where = float(ratio.max()), float(x[ratio.argmax()])
    print(f"largest error / (1e-7 |x| + 3e-7 |gelu|): {worst:.3f} at x = {where!r}")
    beyond = np.linspace(GELU_FIT_HI, 40.0, 200001).astype(np.float32)
    values = horner(p, beyond, True).astype(np.float64)
    print(f"p decreasing past the fit: {bool((np.diff(values) < 0).all())}; p < -150 from t = "
          f"{float(beyond[np.argmax(values < -150)]) if (values < -150).any() else None} "
          f"(the helpers clamp t at {GELU_CLAMP})")
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0], np.float32)
    print("specials:", ", ".join(f"gelu({a}) = {b}" for a, b in zip(specials.tolist(), gelu32(specials, p).tolist())))


def main() -> None:
    if "--gelu" in __import__("sys").argv:
        main_gelu()
        return
    q, p = fit()
    print(f"SPLIT = {SPLIT}, CLAMP = {CLAMP}")
    print("q (erf(x) = x * q(x*x), |x| < SPLIT), highest power first:")
    print("   ", ", ".join(f"{float(c):.9g}" for c in q))
    print("p (log2(erfc(t)), SPLIT <= t <= CLAMP), highest power first:")
    print("   ", ", ".join(f"{float(c):.9g}" for c in p))
    print(f"p(CLAMP) = {float(horner(p, np.array([CLAMP], np.float32), True)[0]):.3f} (must be < -25)")
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-20, -1e-45], np.float32)
    print("specials:", ", ".join(f"erf({a}) = {b}" for a, b in zip(specials.tolist(), erf32(specials, q, p, True).tolist())))
    for fused in (False, True):
        worst_abs, worst_rel, tail = measure(q, p, fused)
        print(f"{'fma' if fused else 'mul+add'}: max abs error {worst_abs:.3g}, "
              f"max relative error for |x| < 0.5 {worst_rel:.3g}")
    print(f"a 2-ulp exp2 (GPU MUFU.EX2) adds at most erfc(SPLIT) * 2**-22 = {tail * 2**-22:.3g}")


if __name__ == "__main__":
    main()
