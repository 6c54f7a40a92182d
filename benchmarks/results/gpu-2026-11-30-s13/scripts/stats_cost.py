"""Where does codegen.eager_norm_statistics spend its time? (H200 probe, session 13)

Compiles two layer-norm workloads with the default plan and with the option, finds the kernel
files each writes, and times each kernel alone (triton do_bench, median) together with variants
of the exact kernel made by editing its source: no IEEE division in the combine, no combine tree
(plain sums instead: wrong values, cost only), and no Welford chain.
"""
import glob
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from pipeline import compile_with_plan


def residual_ln(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, (h.shape[-1],), w, b, 1e-5)


def ln_gelu_res(x, w, b):
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + x


def new_files(before):
    return sorted(set(glob.glob(os.environ["PIPELINE_CACHE_DIR"] + "/**/t_*.py", recursive=True)) - before)


def load(path, text=None):
    if text is not None:
        path = path[:-3] + f"_v{abs(hash(text)) % 10**8}.py"
        open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_module(module, rows, n, maxnreg=None):
    args = []
    for name, kind in module.SIGNATURE.items():
        if kind == "constexpr":
            continue
        dtype = {"*bf16": torch.bfloat16, "*fp32": torch.float32, "*fp16": torch.float16}[kind]
        args.append(torch.randn(rows * n, device="cuda").to(dtype))
    kernel = module.KERNEL[module.GRID]

    extra = {"maxnreg": maxnreg} if maxnreg else {}

    def launch():
        return kernel(*args, **module.CONSTEXPRS, num_warps=module.NUM_WARPS, **extra)
    compiled = launch()
    ms = do_bench(launch, warmup=25, rep=200) * 1e3
    return f"{ms:.2f} us ({getattr(compiled, 'n_regs', '?')} registers)"


DIV = "tl.div_rn(tl.full(count.shape, 1.0, tl.float32), tl.where(count > 0, count, 1.0))"
RCP = ('tl.inline_asm_elementwise("rcp.rn.f32 $0, $1;", "=r,r", [tl.where(count > 0, count, 1.0)], '
       'dtype=tl.float32, is_pure=True, pack=1)')


NEWTON = ("tl.fma(1.0 / tl.where(count > 0, count, 1.0), tl.fma(-tl.where(count > 0, count, 1.0), "
          "1.0 / tl.where(count > 0, count, 1.0), 1.0), 1.0 / tl.where(count > 0, count, 1.0))")


def loads_first(text):
    """Move the main body's loads (after the statistics block) to the top of the kernel."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("xo = ") and "[None, :, None]" in line)
    restore = next(i for i, line in enumerate(lines) if i > start and line.strip() == "rr = tl.arange(0, RBLOCK)[None, :]")
    moved = [line for line in lines[restore + 1:] if "tl.load(" in line and " = tl.load(" in line.split("#")[0]
             and line.strip().split(" = ")[0].startswith("t")]
    rest = [line for line in lines[restore + 1:] if line not in moved]
    return "\n".join(lines[:start] + moved + lines[start:restore + 1] + rest) + "\n"


def variants(text):
    out = {}
    out["fast-div combine"] = text.replace(DIV, "1.0 / tl.where(count > 0, count, 1.0)")
    out["rcp.rn combine"] = text.replace(DIV, RCP)
    out["main loads first"] = loads_first(text)
    out["div.full + Newton combine"] = text.replace(DIV, NEWTON)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "tl.reduce((" in line and "pp_welford_combine" in line:
            lhs, rhs = line.split(" = tl.reduce((")
            names = rhs.split(")")[0].split(", ")
            indent = lhs[:len(lhs) - len(lhs.lstrip())]
            tree_free = lines[:i] + [indent + lhs.strip() + " = " + ", ".join(f"tl.sum({v}, 0)" for v in names)] + lines[i + 1:]
            out["sums instead of tree"] = "\n".join(tree_free) + "\n"
    return out


def main():
    torch.manual_seed(0)
    cases = [("residual+LN 4096x768 bf16", residual_ln, 4096, 768,
              lambda: (torch.randn(4096, 768, device="cuda").bfloat16(), torch.randn(4096, 768, device="cuda").bfloat16(),
                       torch.randn(768, device="cuda").bfloat16(), torch.randn(768, device="cuda").bfloat16())),
             ("LN+GELU+res 8192x4096 bf16", ln_gelu_res, 8192, 4096,
              lambda: (torch.randn(8192, 4096, device="cuda").bfloat16(), torch.randn(4096, device="cuda").bfloat16(),
                       torch.randn(4096, device="cuda").bfloat16()))]
    for title, fn, rows, n, make in cases:
        inputs = make()
        for plan_name, plan in (("default", "default"),
                                ("exact", {"extends": "default", "options": {"codegen": {"eager_norm_statistics": True}}})):
            torch._dynamo.reset()
            before = set(glob.glob(os.environ["PIPELINE_CACHE_DIR"] + "/**/t_*.py", recursive=True))
            with torch.no_grad():
                compile_with_plan(fn, plan)(*inputs)
            files = [f for f in new_files(before) if "_v" not in os.path.basename(f)]
            for path in files:
                module = load(path)
                desc = f"XBLOCK {module.CONSTEXPRS.get('XBLOCK')} warps {module.NUM_WARPS}"
                print(f"{title} | {plan_name} | {desc} | {time_module(module, rows, n)}", flush=True)
                for cap in (64,):
                    print(f"{title} | {plan_name} maxnreg {cap} | {desc} | {time_module(module, rows, n, cap)}",
                          flush=True)
                if plan_name == "exact":
                    text = open(path).read()
                    for label, edited in variants(text).items():
                        try:
                            print(f"{title} | exact, {label} | {desc} | {time_module(load(path, edited), rows, n)}",
                                  flush=True)
                            for cap in ():
                                print(f"{title} | exact, {label}, maxnreg {cap} | {desc} | "
                                      f"{time_module(load(path, edited), rows, n, cap)}", flush=True)
                        except Exception as exc:  # noqa: BLE001
                            print(f"{title} | exact, {label} | failed {type(exc).__name__}: {str(exc)[:200]}")
                    for warps in (4,):
                        for xb in (1, 2, 4):
                            if n > 1024 and xb > 2:
                                continue
                            edited = text.replace(f"CONSTEXPRS = {{'XBLOCK': {module.CONSTEXPRS['XBLOCK']},",
                                                  f"CONSTEXPRS = {{'XBLOCK': {xb},")
                            edited = edited.replace(f"GRID = ({module.GRID[0]},)", f"GRID = ({-(-rows // xb)},)")
                            edited = edited.replace(f"NUM_WARPS = {module.NUM_WARPS}", f"NUM_WARPS = {warps}")
                            edited = edited.replace(DIV, NEWTON)
                            try:
                                t = time_module(load(path, edited), rows, n)
                                print(f"{title} | exact, div.full + Newton, XBLOCK {xb} warps {warps} | {t}", flush=True)
                            except Exception as exc:  # noqa: BLE001
                                print(f"{title} | exact XBLOCK {xb} warps {warps} | failed {str(exc)[:120]}")
        # copy of the same bytes
        x = torch.empty(rows * n * 2, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        print(f"{title} | copy {2 * rows * n * 2 * 2 / 1e6:.1f} MB | {do_bench(lambda: y.copy_(x), warmup=25, rep=200) * 1e3:.2f} us")


if __name__ == "__main__":
    sys.exit(main())
