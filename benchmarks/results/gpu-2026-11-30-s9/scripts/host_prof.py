"""cProfile (Python 3.12: sys.monitoring, every thread, so the backward on autograd's thread too)
of GPT-2 6L train steps: host own time by function, for our plan or Inductor."""
import cProfile, pstats, sys, io, os, time, torch
sys.path.insert(0, "benchmarks")
from train_suite import gpt2_train
from pipeline import compile_with_plan
for plan in sys.argv[1:]:
    torch._dynamo.reset()
    dev = os.environ.get("DEV", "cuda"); small = dev == "cpu"
    torch.manual_seed(0)
    model = gpt2_train(layers=1 if small else 6).to(dev)
    ids = torch.randint(0, 50257, (1, 32) if small else (8, 512), device=dev)
    compiled = torch.compile(model) if plan == "inductor" else compile_with_plan(model, plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    def sync():
        if dev == "cuda": torch.cuda.synchronize()
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = compiled(ids)
        loss.backward(); opt.step()
    n = 3 if small else 20
    for _ in range(5): step()
    sync(); t = time.perf_counter()
    for _ in range(n): step()
    sync(); print(plan, "wall ms/step", (time.perf_counter() - t) / n * 1e3)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): step()
    sync(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
    print("=====", plan, "by own time"); print(s.getvalue()[:10000])
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(25)
    print("=====", plan, "by cumulative time"); print(s.getvalue()[:7000])
