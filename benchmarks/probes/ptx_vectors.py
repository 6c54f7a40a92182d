"""Does a generated Triton kernel move memory in 16-byte vectors? (no GPU needed)

    python benchmarks/probes/ptx_vectors.py KERNEL_MODULE.py [...]

Compiles each generated kernel module (the files the Triton backend writes, or that
``profile_gpu.py --kernels`` saves) for sm_90 and counts its global loads and stores by width in
the PTX. Vector instructions (``.v4``/``.v2``) move 8-16 bytes per thread; a bf16 kernel left with
``.b16`` accesses moves 2 bytes per instruction and cannot reach copy bandwidth. Triton vectorizes
only where it can prove contiguity and alignment, including of the mask: a row mask at 50257
(GPT-2's vocabulary) inside rows padded to 50264 keeps every access scalar (H200, 2026-11-29).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys

WIDTHS = ("v4", "v2", "b64", "b32", "b16", "b8")


def access_counts(path: str) -> dict[str, int]:
    """{'ld.v4': n, 'st.b16': n, ...}: global loads and stores in the kernel's sm_90 PTX by width."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("ptx_probe_" + str(abs(hash(path))), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signature = dict(module.SIGNATURE)
    aligned = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values()) if kind.startswith("*")}
    source = ASTSource(fn=module.KERNEL, signature=signature, constexprs=dict(module.CONSTEXPRS), attrs=aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": module.NUM_WARPS, "num_stages": getattr(module, "NUM_STAGES", 3)})
    counts = {}
    for line in compiled.asm["ptx"].splitlines():
        match = re.match(r"\s*(?:@%p\d+\s+)?(ld|st)\.global((?:\.\w+)*)", line)
        if match:
            parts = match.group(2).split(".")
            width = next((w for w in WIDTHS if w in parts), "other")
            key = f"{match.group(1)}.{width}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args()
    for path in args.modules:
        counts = access_counts(path)
        print(f"{path}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
