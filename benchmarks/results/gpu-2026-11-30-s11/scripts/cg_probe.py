import sys, torch, traceback
sys.path.insert(0, "tests")
from test_cudagraphs import mlp, cudagraph_notes
from pipeline import compile_with_plan, compilation_of
from pipeline.numerics import compare
direct = sys.argv[1] == "direct"
model = mlp().cuda()
compiled = compile_with_plan(model, "reduce-overhead", options={"capture": {"direct_calls": direct}})
try:
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(8, 32, device="cuda")
            print(i, compare(model(x), compiled(x)))
except Exception:
    traceback.print_exc()
rec = compilation_of(compiled).graphs[0]
print("cudagraphs", rec.cudagraphs)
for n in rec.notes: print(n)
print(compilation_of(compiled).runtime.get("direct_calls") and compilation_of(compiled).runtime["direct_calls"].counts())
