"""SASS instruction counts of tanh-GELU variants compiled for sm_90 without a GPU (session 11)."""
import sys, os, subprocess, collections, tempfile
sys.path.insert(0, os.path.dirname(__file__) or ".")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import tanh_gelu_kernels as gk
for kern in ("k_div", "k_sig", "k_emul", "k_div2"):
  for fast in (False,):
      src = ASTSource(fn=getattr(gk, kern), signature={"X": "*bf16", "Y": "*bf16", "N": "constexpr", "BLOCK": "constexpr", "FAST": "constexpr"},
                      constexprs={"N": 1024, "BLOCK": 1024, "FAST": fast}, attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
      c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
      d = tempfile.mkdtemp(); open(d + "/k.cubin", "wb").write(c.asm["cubin"])
      nv = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
      sass = subprocess.run([nv, "-c", d + "/k.cubin"], capture_output=True, text=True).stdout
      ops = collections.Counter(); n = 0
      for line in sass.splitlines():
          line = line.strip()
          if line.startswith("/*") and "*/" in line:
              body = line.split("*/", 1)[1].strip()
              if not body or body.startswith("/*"): continue
              op = body.split()[0]
              if op.startswith("@"): op = body.split()[1]
              ops[op.split(".")[0]] += 1; n += 1
      print(kern, "total", n, ops.most_common(12))
