"""The model zoo's CI part (benchmarks/zoo): the small CPU models compile with our default plan and
match eager (the pass rate is printed, a failure fails the test), the registry holds the families
the zoo promises, and the harness itself tells a slower variant and a wrong one apart."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

pytest.importorskip("transformers")

import zoo  # noqa: E402
from zoo.runner import run_model  # noqa: E402
from zoo.summary import family_summary, markdown, summarize  # noqa: E402
from zoo.variants import VARIANTS, Variant, same_mode, variant  # noqa: E402

MINIMUM_PER_FAMILY = {"decoder": 5, "encoder": 4, "encoder-decoder": 2, "vision-transformer": 3, "convnet": 5,
                      "mobile": 2, "speech": 1, "diffusion": 1, "moe": 1, "recurrent": 1}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_zoo_holds_every_family_it_promises():
    models = zoo.select()
    counts = {family: sum(1 for m in models if m.family == family) for family in zoo.FAMILIES}
    short = {f: (counts[f], n) for f, n in MINIMUM_PER_FAMILY.items() if counts[f] < n}
    assert not short, f"families with fewer models than promised (have, want): {short}"
    assert len(models) >= 32
    assert sum(m.train for m in models) >= 10


CI_MODELS = zoo.select(ci=True, device="cpu")


def test_ci_checks_at_least_eight_models():
    assert len(CI_MODELS) >= 8, [m.name for m in CI_MODELS]


def test_ci_models_compile_and_match_eager(tmp_path, capsys):
    records = []
    for model in CI_MODELS:
        records.append(run_model(model, mode="inference", device="cpu", size="small",
                                 variants=[VARIANTS["eager"], VARIANTS["ours-default"]],
                                 cache_dir=tmp_path / model.name, timing=False))
    passed = [r["model"] for r in records if r["variants"].get("ours-default", {}).get("status") == "pass"]
    with capsys.disabled():
        print(f"\nzoo CI accuracy: {len(passed)}/{len(records)} models pass with ours-default on CPU")
    failures = {r["model"]: r.get("error") or r.get("skipped") or r["variants"]["ours-default"].get("error")
                for r in records if r["model"] not in passed}
    assert not failures, failures
    # The accuracy check calls the model in the timed calls' grad mode: no graph is compiled for it alone.
    recompiled = {r["model"]: r["variants"]["ours-default"].get("recompiles") for r in records
                  if r["variants"]["ours-default"].get("recompiles")}
    assert not recompiled, recompiled


def test_ci_training_rows_match_eager(tmp_path):
    models = [m for m in CI_MODELS if m.train][:2]
    assert models, "no CI model has a training row"
    for model in models:
        record = run_model(model, mode="training", device="cpu", size="small",
                           variants=[VARIANTS["eager"], VARIANTS["ours-training"]], cache_dir=tmp_path / model.name,
                           timing=False)
        entry = record["variants"]["ours-training"]
        assert entry["status"] == "pass", (model.name, entry)


def _planted(seconds: float = 0.0, scale: float = 1.0) -> Variant:
    def wrap(module: torch.nn.Module):
        def call(*args, **kwargs):
            if seconds:
                time.sleep(seconds)
            return module(*args, **kwargs) * scale
        return call
    return Variant(f"planted-{seconds}-{scale}", "custom", wrap=wrap)


def test_the_harness_reports_a_planted_slower_variant_slower_and_a_wrong_one_failing(tmp_path):
    model = CI_MODELS[0]
    slow, wrong = _planted(seconds=0.02), _planted(scale=1.01)
    record = run_model(model, mode="inference", device="cpu", size="small",
                       variants=[VARIANTS["eager"], slow, wrong], cache_dir=tmp_path, rounds=3, iters=2)
    entries = record["variants"]
    assert entries[slow.name]["status"] == "pass" and entries[slow.name]["ms"] >= 20.0
    assert entries[slow.name]["ms"] > entries["eager"]["ms"]
    assert entries[wrong.name]["status"] == "fail" and "accuracy" in entries[wrong.name]["error"]
    summary = family_summary([record])
    assert summary[slow.name]["speedup"] < 1.0 and summary[wrong.name]["passing"] == 0


def test_the_summary_page_lists_failures_and_skips_instead_of_dropping_them(tmp_path):
    records = [{"model": "a", "family": "decoder", "mode": "inference", "variants": {
                    "eager": {"status": "pass", "ms": 2.0, "cold_s": 0.1},
                    "ours-default": {"status": "error", "error": "PassFailure: boom"},
                    "inductor-default": {"status": "pass", "ms": 1.0, "cold_s": 5.0}}},
               {"model": "b", "family": "decoder", "mode": "inference", "variants": {},
                "skipped": "timm does not import"}]
    result = {"device": "cpu", "date": "2026-12-02", "commit": "abc", "torch": torch.__version__, "size": "small",
              "rounds": 1, "iters": 1, "jobs": 1, "records": records}
    summary = summarize(result)
    page = markdown(result, summary)
    assert "PassFailure: boom" in page and "timm does not import" in page
    assert summary["inference"]["all"]["ours-default"]["pass_rate"] == 0.0
    assert summary["inference_trailing"][0]["model"] == "a"


def test_a_plan_variant_is_judged_in_its_base_variants_mode_beside_the_built_in_plans():
    plan = "ours-reduce-overhead@benchmarks/plans/wide-cats-reduce-overhead.yaml"
    assert variant(plan).setting == "benchmarks/plans/wide-cats-reduce-overhead.yaml"
    assert same_mode(plan) == "inductor-reduce-overhead" and same_mode("eager") is None
    with pytest.raises(KeyError, match="<ours variant>@<plan>"):
        variant("inductor-default@plans/default.yaml")
    records = [{"model": "a", "family": "convnet", "mode": "inference", "variants": {
        "eager": {"status": "pass", "ms": 4.0}, "inductor-reduce-overhead": {"status": "pass", "ms": 2.0},
        "ours-reduce-overhead": {"status": "pass", "ms": 2.5}, plan: {"status": "pass", "ms": 1.6}}}]
    result = {"device": "cpu", "date": "2026-12-06", "commit": "abc", "torch": torch.__version__, "size": "small",
              "rounds": 1, "iters": 1, "jobs": 1, "records": records}
    summary = summarize(result)
    assert summary["inference"]["all"][plan]["vs_inductor"] == pytest.approx(1.25)
    assert {row["variant"] for row in summary["inference_trailing"]} == {"ours-reduce-overhead", plan}
    assert plan in markdown(result, summary)


def test_a_model_whose_retry_alone_the_budget_never_reached_keeps_its_first_attempt(tmp_path, monkeypatch):
    """Out of device memory beside other model processes, a model is queued to run again alone;
    when the budget ends first, its first attempt is reported (with a note), not a bare skip."""
    import json
    from zoo import runner

    class Finished:
        """A model process that has already exited."""
        returncode = 0

        def __init__(self):
            self.started = time.perf_counter()

        def poll(self):
            return 0 if time.perf_counter() - self.started > 0.2 else None

        def kill(self):
            pass

        def wait(self):
            return 0

    def spawn(model, mode, args, work, *, warm=False):
        path = work / f"{model.name}-{mode}.json"
        path.write_text(json.dumps({"model": model.name, "family": model.family, "mode": mode, "variants": {
            "eager": {"status": "pass", "ms": 2.0, "cold_s": 0.1},
            "inductor-default": {"status": "error", "error": "torch.OutOfMemoryError: CUDA out of memory"},
            "ours-default": {"status": "pass", "ms": 1.0, "cold_s": 1.0}}}))
        return Finished(), path, open(work / f"{model.name}-{mode}.log", "w")

    monkeypatch.setattr(runner, "_spawn", spawn)
    args = runner.build_parser().parse_args(["--device", "cpu", "--models", "gpt2,bert", "--mode", "inference",
                                             "--jobs", "2", "--budget", "0.1", "--grace", "0",
                                             "--work", str(tmp_path)])
    result = runner.run_zoo(args)
    records = {r["model"]: r for r in result["records"]}
    assert set(records) == {"gpt2", "bert"}
    for record in records.values():
        assert "skipped" not in record and "not run again alone" in record["note"]
        assert record["variants"]["ours-default"]["ms"] == 1.0
    page = markdown(result, summarize(result))
    assert "first attempt, beside other model processes" in page


def test_a_model_out_of_memory_beside_others_runs_again_next_alone_and_families_take_turns(tmp_path, monkeypatch):
    """Models start taking the families in turn; one that ran out of device memory beside another
    process is run again before the models still queued, with no other process running."""
    import json
    from zoo import runner

    running: list = []
    log: list = []              # (model, the models running when it started)
    attempts: dict = {}

    class Process:
        returncode = 0

        def __init__(self, name):
            self.name, self.started = name, time.perf_counter()

        def poll(self):
            if time.perf_counter() - self.started < 0.3:
                return None
            if self in running:
                running.remove(self)
            return 0

        def kill(self):
            pass

        def wait(self):
            return 0

    def spawn(model, mode, args, work, *, warm=False):
        attempts[model.name] = attempts.get(model.name, 0) + 1
        out_of_memory = model.name == "llama" and attempts[model.name] == 1
        ours = {"status": "error", "error": "torch.OutOfMemoryError: CUDA out of memory"} if out_of_memory else \
            {"status": "pass", "ms": 1.0, "cold_s": 1.0}
        path = work / f"{model.name}-{mode}.json"
        path.write_text(json.dumps({"model": model.name, "family": model.family, "mode": mode, "variants": {
            "eager": {"status": "pass", "ms": 2.0, "cold_s": 0.1}, "ours-default": ours}}))
        log.append((model.name, sorted(p.name for p in running)))
        process = Process(model.name)
        running.append(process)
        return process, path, open(work / f"{model.name}-{mode}.log", "w")

    monkeypatch.setattr(runner, "_spawn", spawn)
    args = runner.build_parser().parse_args(["--device", "cpu", "--models", "gpt2,llama,mistral,bert,resnet18",
                                             "--mode", "inference", "--jobs", "2", "--work", str(tmp_path)])
    result = runner.run_zoo(args)
    assert log == [("gpt2", []), ("bert", ["gpt2"]), ("resnet18", []), ("llama", ["resnet18"]),
                   ("llama", []), ("mistral", [])]      # families in turn; the retry next, alone
    records = {r["model"]: r for r in result["records"]}
    assert set(records) == {"gpt2", "llama", "mistral", "bert", "resnet18"}
    assert records["llama"]["variants"]["ours-default"]["status"] == "pass"
