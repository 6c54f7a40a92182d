"""capture.precompile: a stored capture (Dynamo's code and guards) lets a later compile or process
run its first call without tracing the model; its guards still decide which entry runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline import compilation_of, compile_with_plan

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def graph_cache_on(monkeypatch):
    # Imported here, not at collection: it imports Dynamo (and Triton), which the Triton-interpreter
    # test modules must import after setting TRITON_INTERPRET.
    from pipeline.compat import precompile
    if not precompile.available():
        pytest.skip("this torch has no ahead-of-time compile")
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    monkeypatch.delenv("PIPELINE_DUMP_DIR", raising=False)


class Scaled(torch.nn.Module):
    def __init__(self, width: int = 32, scale: float = 2.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x)) * self.scale + x.softmax(-1)


def compiled_call(folder: Path, model: torch.nn.Module, x: torch.Tensor, **options):
    compiled = compile_with_plan(model, "default", cache={"dir": str(folder)},
                                 options={"capture": {"precompile": True, **options}})
    with torch.no_grad():
        out = compiled(x)
        expected = model(x)
    torch.testing.assert_close(out, expected)
    compilation = compilation_of(compiled)
    return compiled, compilation, compilation.runtime["stored_captures"]


def test_a_stored_capture_serves_a_later_compile_without_tracing(tmp_path):
    torch.manual_seed(0)
    model = Scaled().eval()
    x = torch.randn(8, 32)
    _, first, stored = compiled_call(tmp_path, model, x)
    assert stored.counts()["captures_stored"] == 1, (stored.counts(), stored.notes)
    assert len(first.captures) == 1        # Dynamo traced it
    _, second, stored = compiled_call(tmp_path, model, torch.randn(8, 32))
    counts = stored.counts()
    assert counts["stored_captures_loaded"] == 1 and counts["stored_capture_hits"] == 1
    assert counts["captures_traced_for_storing"] == 0
    assert second.captures == []           # nothing traced: the backend never ran
    graph = second.graphs[0]
    assert graph.cache["status"] == "hit"
    assert any("stored capture" in n["message"] for n in graph.notes)
    assert graph.kernels >= 1


def test_a_call_no_stored_entry_passes_is_traced_and_stored_beside_the_others(tmp_path):
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled_call(tmp_path, model, torch.randn(8, 32), dynamic=False)
    _, _, stored = compiled_call(tmp_path, model, torch.randn(4, 32), dynamic=False)
    assert stored.counts()["stored_captures_loaded"] == 1
    assert stored.counts()["captures_traced_for_storing"] == 1     # (8, 32) guards fail for (4, 32)
    compiled, _, stored = compiled_call(tmp_path, model, torch.randn(8, 32), dynamic=False)
    with torch.no_grad():
        x = torch.randn(4, 32)
        torch.testing.assert_close(compiled(x), model(x))
    assert stored.counts()["stored_captures_loaded"] == 2
    assert stored.counts()["stored_capture_hits"] == 2
    assert stored.counts()["captures_traced_for_storing"] == 0


def test_guards_on_module_attributes_and_weights_are_checked_on_stored_entries(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    compiled_call(tmp_path, Scaled(scale=2.0).eval(), x)
    _, _, stored = compiled_call(tmp_path, Scaled(scale=3.0).eval(), x)    # a float attribute: specialized
    assert stored.counts()["stored_capture_hits"] == 0
    assert stored.counts()["captures_traced_for_storing"] == 1
    _, _, stored = compiled_call(tmp_path, Scaled(width=16).eval(), torch.randn(8, 16))
    assert stored.counts()["stored_capture_hits"] == 0


def test_a_model_that_breaks_the_graph_goes_through_dynamo_with_the_reason(tmp_path):
    class Breaks(torch.nn.Module):
        def forward(self, x):
            y = x.sin()
            torch._dynamo.graph_break()
            return y.cos()

    model = Breaks()
    x = torch.randn(4, 4)
    compiled, compilation, stored = compiled_call(tmp_path, model, x)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert stored.disabled is not None and "one stored graph" in stored.disabled
    assert len(compilation.graph_breaks) >= 1
    assert stored.counts()["not_served_by_stored_captures"] == 2


def test_calls_that_need_gradients_go_through_dynamo(tmp_path):
    torch.manual_seed(0)
    model = Scaled()
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)},
                                 options={"capture": {"precompile": True}})
    x = torch.randn(8, 32)
    compiled(x).sum().backward()
    stored = compilation_of(compiled).runtime["stored_captures"]
    assert stored.counts()["captures_traced_for_storing"] == 0
    assert any("gradients" in note for note in stored.notes)


MODULE = '''
import functools
import torch


def helper(x):
    return x * {factor}


def wrapped(forward):
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    @wrapped
    def forward(self, x):
        return helper(torch.relu(self.linear(x)))
'''

SCRIPT = '''
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import stored_model
from pipeline import compilation_of, compile_with_plan
torch.manual_seed(0)
model = stored_model.Decorated().eval()
x = torch.randn(4, 16)
compiled = compile_with_plan(model, "default", cache={"dir": sys.argv[3]}, options={"capture": {"precompile": True}})
with torch.no_grad():
    out = compiled(x)
    ok = torch.allclose(out, model(x), atol=1e-5, rtol=1e-5)
stored = compilation_of(compiled).runtime["stored_captures"]
print(json.dumps({"ok": ok, "counts": stored.counts(), "notes": stored.notes}))
'''


def _run(folder: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PIPELINE_CACHE_GRAPHS", None)
    done = subprocess.run([sys.executable, str(folder / "script.py"), str(folder), str(ROOT), str(cache)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_runs_a_decorated_forward_from_its_stored_capture_until_its_code_changes(tmp_path):
    """The traced function's closure (the wrapped forward) comes from the loading process, and a
    change in a function the capture inlined makes the entry unusable."""
    (tmp_path / "stored_model.py").write_text(textwrap.dedent(MODULE.format(factor=2)))
    (tmp_path / "script.py").write_text(SCRIPT)
    cache = tmp_path / "cache"
    first = _run(tmp_path, cache)
    assert first["ok"] and first["counts"]["captures_stored"] == 1, first
    second = _run(tmp_path, cache)
    assert second["ok"], second
    assert second["counts"]["stored_capture_hits"] == 1 and second["counts"]["captures_traced_for_storing"] == 0
    (tmp_path / "stored_model.py").write_text(textwrap.dedent(MODULE.format(factor=3)))
    third = _run(tmp_path, cache)
    assert third["ok"], third
    assert third["counts"]["stored_capture_hits"] == 0 and third["counts"]["captures_traced_for_storing"] == 1
    assert any("changed" in note for note in third["notes"]), third["notes"]


def test_under_fail_on_recompile_stored_entries_serve_hits_and_a_miss_names_the_failed_guard(tmp_path):
    from pipeline import RecompileError, stance
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled_call(tmp_path, model, torch.randn(8, 32), dynamic=False)
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)},
                                 options={"capture": {"precompile": True, "dynamic": False}})
    with torch.no_grad(), stance("fail_on_recompile"):
        x = torch.randn(8, 32)
        torch.testing.assert_close(compiled(x), model(x))
        with pytest.raises(RecompileError, match="size|shape|8"):
            compiled(torch.randn(4, 32))
    assert compilation_of(compiled).runtime["stored_captures"].counts()["stored_capture_hits"] == 1


def test_a_new_variant_beside_stored_entries_is_a_recorded_recompile_naming_the_guard(tmp_path):
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled_call(tmp_path, model, torch.randn(8, 32), dynamic=False)
    _, compilation, _ = compiled_call(tmp_path, model, torch.randn(4, 32), dynamic=False)
    assert len(compilation.recompiles) == 1
    assert "expected 8, actual 4" in compilation.recompiles[0]


def test_two_models_in_one_process_each_store_static_captures(tmp_path):
    """Each compiled model traces its own code object: the second model's first capture is not
    made dynamic by the sizes the first one saw."""
    torch.manual_seed(0)
    _, _, first = compiled_call(tmp_path, Scaled().eval(), torch.randn(8, 32))
    _, _, second = compiled_call(tmp_path, Scaled(width=16).eval(), torch.randn(3, 16))
    assert first.counts()["captures_stored"] == 1 and second.counts()["captures_stored"] == 1, second.notes


def test_a_bundle_carries_stored_captures_only_when_asked_and_loads_them_only_when_trusted(tmp_path):
    import pipeline
    from pipeline.cache.artifacts import read_manifest
    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(8, 32)
    compiled, _, _ = compiled_call(tmp_path / "a", model, x)
    plain = pipeline.save_artifacts(compiled, tmp_path / "plain")
    assert read_manifest(plain.parent)["captures"] == []
    bundle = pipeline.save_artifacts(compiled, tmp_path / "bundle", captures=True).parent
    assert len(read_manifest(bundle)["captures"]) == 1
    untrusted = pipeline.load_artifacts(bundle, tmp_path / "b")
    assert (untrusted["captures"], untrusted["captures_skipped"]) == (0, 1)
    _, _, stored = compiled_call(tmp_path / "b", model, x)
    assert stored.counts()["captures_traced_for_storing"] == 1        # traced: the capture was not loaded
    trusted = pipeline.load_artifacts(bundle, tmp_path / "c", trust_captures=True)
    assert trusted["captures"] == 1
    _, compilation, stored = compiled_call(tmp_path / "c", model, x)
    assert stored.counts()["stored_capture_hits"] == 1 and compilation.captures == []


def test_with_the_cache_off_calls_go_through_dynamo_once_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled, compilation, stored = compiled_call(tmp_path, model, torch.randn(8, 32))
    assert stored.counts()["captures_traced_for_storing"] == 0
    assert len(compilation.graphs) == 1          # traced once, by Dynamo
    assert any("not stored" in note and "PIPELINE_CACHE_GRAPHS" in note for note in stored.notes), stored.notes


def test_a_plan_that_verifies_does_not_store_captures_and_says_why(tmp_path):
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)}, verify="final",
                                 options={"capture": {"precompile": True}})
    with torch.no_grad():
        x = torch.randn(8, 32)
        torch.testing.assert_close(compiled(x), model(x))
    stored = compilation_of(compiled).runtime["stored_captures"]
    assert stored.counts()["captures_traced_for_storing"] == 0
    assert any(note.startswith("verify: final") for note in stored.notes), stored.notes


def test_threads_calling_one_model_at_several_shapes_get_eager_results(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    torch.manual_seed(0)
    model = Scaled().eval()
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)},
                                 options={"capture": {"precompile": True, "dynamic": False}})

    def call(n: int) -> None:
        with torch.no_grad():
            for _ in range(4):
                x = torch.randn(n, 32)
                torch.testing.assert_close(compiled(x), model(x))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, [2, 3, 4, 2, 3, 4]))
    counts = compilation_of(compiled).runtime["stored_captures"].counts()
    assert counts["captures_traced_for_storing"] == 3       # one per shape (the counters of hits are not atomic)


def test_precompile_with_export_is_a_plan_error_and_with_regions_a_warning(tmp_path):
    from pipeline import PipelineError
    model = Scaled().eval()
    with pytest.raises(PipelineError, match="frontend: dynamo only"):
        compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)},
                                     options={"capture": {"precompile": True, "frontend": "export"}})
        compiled(torch.randn(8, 32))
    with pytest.warns(UserWarning, match="precompile is not applied with regional compilation"), torch.no_grad():
        compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path)},
                                     options={"capture": {"precompile": True, "regions": ["Linear"]}})
        compiled(torch.randn(8, 32))


def softplus_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x) + y.sin()


def test_a_plain_function_is_stored_and_served_without_tracing(tmp_path):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    options = {"capture": {"precompile": True}}
    first = compile_with_plan(softplus_sum, "default", cache={"dir": str(tmp_path)}, options=options)
    torch.testing.assert_close(first(x, y), softplus_sum(x, y))
    second = compile_with_plan(softplus_sum, "default", cache={"dir": str(tmp_path)}, options=options)
    torch.testing.assert_close(second(x, y), softplus_sum(x, y))
    stored = compilation_of(second).runtime["stored_captures"]
    assert stored.counts()["stored_capture_hits"] == 1 and compilation_of(second).captures == [], stored.notes


def dynamic_calls(folder: Path, model: torch.nn.Module, rows: list[int]):
    """A compile with sizes symbolic from the first call, called at ``rows`` rows, each checked."""
    compiled = compile_with_plan(model, "default", cache={"dir": str(folder)},
                                 options={"capture": {"precompile": True, "dynamic": True}})
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n in rows:
            x = torch.randn(n, 32, generator=generator)
            torch.testing.assert_close(compiled(x), model(x))
    compilation = compilation_of(compiled)
    return compilation, compilation.runtime["stored_captures"]


def test_a_dynamic_capture_is_stored_with_the_size_classes_its_graph_made_after_the_compile(tmp_path):
    """4096 rows cross the C++ kernels' parallel threshold: a size class made on a later call, after
    the graph was stored. Its entry is written again with it, so a later compile loads the capture,
    rebuilds the graph and serves every size without tracing or generating a kernel."""
    torch.manual_seed(0)
    model = Scaled().eval()
    _, stored = dynamic_calls(tmp_path, model, [8, 12, 4096])
    assert stored.counts()["captures_stored"] == 1, (stored.counts(), stored.notes)
    torch._dynamo.reset()
    second, stored = dynamic_calls(tmp_path, model, [8, 12, 4096, 5])
    counts = stored.counts()
    assert counts["stored_captures_loaded"] == 1 and counts["captures_traced_for_storing"] == 0, counts
    (graph,) = second.graphs
    sizes = graph.metrics["size_specializations"]
    assert graph.cache["status"] == "hit" and sizes["builds"] == 0 and sizes["classes"] >= 2, sizes


def test_a_size_outside_a_stored_dynamic_graphs_classes_runs_its_groups_eagerly_with_the_reason(tmp_path):
    """A graph rebuilt for a stored capture has no compile's shapes to generate kernels in: a size
    its stored classes do not cover runs the groups eagerly (still matching eager), noted."""
    torch.manual_seed(0)
    model = Scaled().eval()
    dynamic_calls(tmp_path, model, [8, 12])
    torch._dynamo.reset()
    second, _ = dynamic_calls(tmp_path, model, [4096, 8])
    (graph,) = second.graphs
    sizes = graph.metrics["size_specializations"]
    assert sizes["kernels"] == 0 and any("no shape environment" in n for n in sizes["eager"]), sizes
