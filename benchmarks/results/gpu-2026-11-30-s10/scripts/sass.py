"""SASS instruction counts of a kernel module compiled for sm_90 without a GPU:
    python sass.py ln_kernel | ln_gelu
"""
import sys, os, subprocess, collections
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, here + "/../../gpu-2026-11-30-s9/scripts")   # ln_kernel.py (pp_erf)
import tempfile
TMP = tempfile.mkdtemp()
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib; ln_kernel = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "ln_kernel")
sig = dict(ln_kernel.SIGNATURE)
aligned = {(i,): [["tt.divisibility", 16]] for i, k in enumerate(sig.values()) if k.startswith("*")}
src = ASTSource(fn=ln_kernel.KERNEL, signature=sig, constexprs=dict(ln_kernel.CONSTEXPRS), attrs=aligned)
c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
open(TMP + "/ln.cubin", "wb").write(c.asm["cubin"])
nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
sass = subprocess.run([nv, "-c", TMP + "/ln.cubin"], capture_output=True, text=True).stdout
open(TMP + "/ln.sass", "w").write(sass)
ops = collections.Counter()
n = 0
for line in sass.splitlines():
    line = line.strip()
    if line.startswith("/*") and "*/" in line:
        body = line.split("*/", 1)[1].strip()
        if not body or body.startswith("/*"): continue
        op = body.split()[0]
        if op.startswith("@"): op = body.split()[1]
        ops[op.split(".")[0]] += 1; n += 1
print("total", n)
print(ops.most_common(40))
