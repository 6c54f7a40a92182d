"""Where does the time of the generated layer norm + GELU + residual kernel go? (a GPU probe)

    python benchmarks/probes/probe_norm_kernel.py [--out DIR]

Compiles ``layer_norm_gelu_residual`` (8192x4096 bf16) with the ``default`` plan, takes the Triton
kernel the codegen wrote, and times edited copies of its source next to it: other warp counts and
rows per program, without the bf16 rounding of intermediates, without the erf (not a valid kernel:
it measures what the erf costs), and a kernel that only copies the rows (the ceiling for this
launch shape). Each line gives ms per call and the share of the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workloads import layer_norm_gelu_residual  # noqa: E402

from pipeline import compilation_of, compile_with_plan  # noqa: E402


def load(source: str, tag: str):
    path = Path(tempfile.mkdtemp()) / f"probe_{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def single_pass_statistics(source: str) -> str | None:
    """The kernel with its variance taken as E[x*x] - mean**2 in the same pass as the mean (one
    block reduction fewer to wait for; numerically weaker, so only a probe of what it would gain).
    None when the source does not have the two-pass shape ``sum((x - mean) * (x - mean))``."""
    square = re.search(r"(v\d+_mul) = \((v\d+_sub) \* \2\)", source)
    centered = square and re.search(rf"{square.group(2)} = \((\w+) - (v\d+_div)\)", source)
    summed = square and re.search(rf"(a\d+_sum) = {square.group(1)}\n", source)
    if not (square and centered and summed):
        return None
    x, mean = centered.group(1), centered.group(2)
    total = summed.group(1).replace("a", "v", 1)
    divided = re.search(rf"(v\d+_div) = \({total} / ([0-9.]+)\)", source)
    if not divided:
        return None
    source = source.replace(summed.group(0), f"{summed.group(1)} = {x} * {x}\n")
    return source.replace(divided.group(0), f"{divided.group(1)} = ({total} / {divided.group(2)}) - {mean} * {mean}")


def looped_rows(source: str, rows: int) -> str | None:
    """The kernel with each program looping over rows ``pid, pid + P, ...`` (``P`` programs,
    the ``PROGRAMS`` constexpr) in a ``tl.range`` that Triton software-pipelines with ``STAGES``
    stages: the next row's loads are in flight while this row reduces. None when the source does
    not have the expected persistent-reduction shape."""
    lines = source.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("    xo = tl.program_id(0)"))
        end = next(i for i in range(start, len(lines)) if not lines[i].startswith("    "))
    except StopIteration:
        return None
    signature = lines[start - 1].replace("RBLOCK: tl.constexpr)",
                                         "RBLOCK: tl.constexpr, PROGRAMS: tl.constexpr, STAGES: tl.constexpr)")
    body = [line for line in lines[start + 1:end] if line.strip()]
    loop = [f"    for row in tl.range(tl.program_id(0), {rows}, PROGRAMS, num_stages=STAGES):",
            "        xo = row + tl.arange(0, XBLOCK)[:, None]"] + ["    " + line for line in body if "rr = " not in line]
    rr = next(line for line in body if "rr = " in line)
    return "\n".join(lines[:start - 1] + [signature, rr] + loop + lines[end:]) + "\n"


def cuda_ms(fn, iters: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return sorted(times)[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows, cols = 8192, 4096
    bf = torch.bfloat16
    x = torch.randn(rows, cols, device="cuda", dtype=bf)
    w, b = torch.randn(cols, device="cuda", dtype=bf), torch.randn(cols, device="cuda", dtype=bf)
    compiled = compile_with_plan(layer_norm_gelu_residual, "default")
    with torch.no_grad():
        compiled(x, w, b)
    kernel = compilation_of(compiled).graphs[0].contents["kernels"][0]
    source = kernel["source"]
    base = load(source, "base")
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size()
    copy_ms = cuda_ms(lambda: out.copy_(x))
    lines = [f"copy 8192x4096 bf16: {copy_ms:.4f} ms = {nbytes / copy_ms / 1e6:.0f} GB/s", "",
             "generated source:", source, ""]

    def timed(label: str, module, xblock: int, warps: int, stages: int | None = None) -> None:
        extra = {} if stages is None else {"num_stages": stages}
        fn = module.KERNEL
        grid = (rows // xblock,)
        call = lambda: fn[grid](x, w, b, out, XBLOCK=xblock, RBLOCK=cols, num_warps=warps, **extra)  # noqa: E731
        try:
            ms = cuda_ms(call)
        except Exception as exc:  # noqa: BLE001 - a probe line, not a crash
            lines.append(f"{label:45s} failed: {type(exc).__name__}: {str(exc)[:120]}")
            return
        lines.append(f"{label:45s} {ms:.4f} ms  {copy_ms / ms * 100:5.1f} % of copy bw")

    for xblock in (1, 2, 4):
        for warps in (2, 4, 8, 16):
            timed(f"generated XBLOCK={xblock} warps={warps}", base, xblock, warps)
    unrounded = re.sub(r"\.to\(tl\.bfloat16\)\.to\(tl\.float32\)", "", source)
    timed("no bf16 rounding of intermediates, XBLOCK=1 w4", load(unrounded, "unrounded"), 1, 4)
    timed("no bf16 rounding, XBLOCK=2 w8", load(unrounded, "unrounded2"), 2, 8)
    no_erf = re.sub(r"tl\.math\.erf\(([^()]*)\)", r"(\1)", unrounded)
    timed("no rounding, no erf (invalid), XBLOCK=1 w4", load(no_erf, "noerf"), 1, 4)
    timed("no rounding, no erf (invalid), XBLOCK=2 w8", load(no_erf, "noerf2"), 2, 8)
    single = single_pass_statistics(source)
    if single is None:
        lines.append("single-pass mean/variance variant: the generated source did not have the expected shape")
    else:
        timed("single-pass mean/var (sum x, sum x*x), XBLOCK=1 w4", load(single, "single"), 1, 4)
        timed("single-pass mean/var, XBLOCK=2 w8", load(single, "single2"), 2, 8)
    copy_only = re.sub(r"tl\.store\((\w+) \+ \((.*)\), .*\)\n", r"tl.store(\1 + (\2), t1.to(tl.bfloat16))\n", source)
    copy_only = "\n".join(line for line in copy_only.splitlines()
                          if not re.match(r"\s*([va]\d+_\w* =|t[23] =)", line))
    timed("load+store only, XBLOCK=1 w4", load(copy_only, "copy"), 1, 4)
    timed("load+store only, XBLOCK=2 w8", load(copy_only, "copy2"), 2, 8)
    looped = looped_rows(source, rows)
    if looped is None:
        lines.append("looped-rows variant: the generated source did not have the expected shape")
    else:
        module = load(looped, "looped")
        for programs in (132 * 4, 132 * 8, 132 * 16):
            for stages in (1, 2, 3):
                for warps in (4, 8):
                    label = f"rows looped, {programs} programs, {stages} stages, w{warps}"
                    try:
                        ms = cuda_ms(lambda: module.KERNEL[(programs,)](x, w, b, out, XBLOCK=1, RBLOCK=cols,
                                                                        PROGRAMS=programs, STAGES=stages,
                                                                        num_warps=warps))
                    except Exception as exc:  # noqa: BLE001 - a probe line, not a crash
                        lines.append(f"{label:45s} failed: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    lines.append(f"{label:45s} {ms:.4f} ms  {copy_ms / ms * 100:5.1f} % of copy bw")
    inductor = torch.compile(layer_norm_gelu_residual)
    with torch.no_grad():
        inductor(x, w, b)
        ms = cuda_ms(lambda: inductor(x, w, b))
    lines.append(f"{'inductor default (whole call)':45s} {ms:.4f} ms  {copy_ms / ms * 100:5.1f} % of copy bw")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe-norm-kernel.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
