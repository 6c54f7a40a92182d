"""The compiled-graph cache: what feeds its key, hits that run no pass, damaged entries that are
detected and rebuilt, several processes sharing one cache folder, and progress lines."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline import compilation_of, compile_with_plan, explain
from pipeline.cache import CorruptEntry, entry_path, read_entry
from pipeline.progress import Progress

WORKER = Path(__file__).with_name("cache_worker.py")


class Small(torch.nn.Module):
    """A linear layer with a fused epilogue: one graph, one or two generated kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.nn.functional.gelu(y) * 2 + torch.softmax(y, dim=-1)


@pytest.fixture(autouse=True)
def graph_cache_on(monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    monkeypatch.delenv("PIPELINE_DUMP_DIR", raising=False)


def compile_and_call(folder: Path, model: torch.nn.Module | None = None, **overrides):
    torch.manual_seed(0)
    model = model if model is not None else Small().eval()
    x = torch.randn(8, 32)
    overrides.setdefault("cache", {"dir": str(folder)})
    compiled = compile_with_plan(model, "default", **overrides)
    with torch.no_grad():
        out = compiled(x)
        expected = model(x)
    return compilation_of(compiled), out, expected


def only_graph(compilation):
    assert len(compilation.graphs) == 1
    return compilation.graphs[0]


def test_a_second_compile_is_a_hit_that_runs_no_pass(tmp_path):
    first, _, _ = compile_and_call(tmp_path)
    assert only_graph(first).cache["status"] == "miss" and only_graph(first).cache["stored"]
    assert only_graph(first).passes
    second, out, expected = compile_and_call(tmp_path)
    record = only_graph(second)
    assert record.cache["status"] == "hit"
    assert record.passes == []
    assert record.kernels == only_graph(first).kernels > 0
    torch.testing.assert_close(out, expected)


def test_changing_one_plan_option_changes_the_key(tmp_path):
    base, _, _ = compile_and_call(tmp_path)
    changed, _, _ = compile_and_call(tmp_path, options={"fuse": {"max_group_size": 7}})
    assert only_graph(changed).cache["status"] == "miss"
    assert only_graph(changed).cache["key"] != only_graph(base).cache["key"]


def test_an_unrelated_environment_variable_does_not_change_the_key(tmp_path, monkeypatch):
    base, _, _ = compile_and_call(tmp_path)
    monkeypatch.setenv("SOME_UNRELATED_SETTING", "42")
    monkeypatch.setenv("PIPELINE_LOGS", "cache")
    again, _, _ = compile_and_call(tmp_path)
    assert only_graph(again).cache["key"] == only_graph(base).cache["key"]
    assert only_graph(again).cache["status"] == "hit"


def test_the_cache_folder_is_not_part_of_the_key(tmp_path):
    a, _, _ = compile_and_call(tmp_path / "a")
    b, _, _ = compile_and_call(tmp_path / "b")
    assert only_graph(a).cache["key"] == only_graph(b).cache["key"]
    assert only_graph(b).cache["status"] == "miss"


def _entry_file(tmp_path: Path) -> Path:
    files = list(tmp_path.glob("graphs/*/*.entry"))
    assert len(files) == 1
    return files[0]


@pytest.mark.parametrize("damage", ["corrupted", "truncated"])
def test_a_damaged_entry_is_detected_reported_and_rebuilt(tmp_path, damage, caplog):
    first, _, _ = compile_and_call(tmp_path)
    path = _entry_file(tmp_path)
    raw = path.read_bytes()
    if damage == "corrupted":
        middle = len(raw) - 100
        path.write_bytes(raw[:middle] + bytes([raw[middle] ^ 0xFF]) + raw[middle + 1:])
    else:
        path.write_bytes(raw[:len(raw) // 2])
    key = path.stem
    with pytest.raises(CorruptEntry):
        read_entry(path, key)
    with caplog.at_level(logging.WARNING, logger="pipeline.cache"):
        again, out, expected = compile_and_call(tmp_path)
    record = only_graph(again)
    assert record.cache["status"] == "miss"
    assert "corrupt entry removed and rebuilt" in record.cache["reason"]
    assert ("checksum mismatch" if damage == "corrupted" else "truncated") in record.cache["reason"]
    assert any("corrupt cache entry" in r.getMessage() for r in caplog.records)
    assert record.passes, "the graph was compiled again"
    torch.testing.assert_close(out, expected)
    read_entry(entry_path(tmp_path, key), key)          # rewritten whole
    assert only_graph(compile_and_call(tmp_path)[0]).cache["status"] == "hit"


def test_a_changed_kernel_library_is_rebuilt_not_loaded(tmp_path):
    compile_and_call(tmp_path)
    libraries = list((tmp_path / "cpp").glob("k_*.so"))
    assert len(libraries) == 1
    damaged = libraries[0].with_suffix(".damaged")
    damaged.write_bytes(b"not a shared library")
    os.replace(damaged, libraries[0])   # a new file: the library this process mapped stays intact
    from passes.codegen.cpp import build as cpp_build
    cpp_build._loaded.clear()           # this process loaded the library already
    again, out, expected = compile_and_call(tmp_path)
    assert only_graph(again).cache["status"] == "hit"
    assert libraries[0].read_bytes()[:4] == b"\x7fELF"
    torch.testing.assert_close(out, expected)


def test_a_pass_without_version_makes_the_plan_visibly_uncacheable(tmp_path, monkeypatch, caplog):
    cls = pipeline.get_registry().passes["fuse"].cls
    monkeypatch.setattr(cls, "version", "")
    with caplog.at_level(logging.WARNING, logger="pipeline.cache"):
        compilation, out, expected = compile_and_call(tmp_path)
    record = only_graph(compilation)
    assert record.cache["status"] == "uncacheable"
    assert "pass 'fuse'" in record.cache["reason"] and "no version" in record.cache["reason"]
    assert any("uncacheable" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob("graphs/*/*.entry"))
    torch.testing.assert_close(out, expected)


def test_cache_enabled_false_stores_nothing(tmp_path):
    compilation, _, _ = compile_and_call(tmp_path, cache={"dir": str(tmp_path), "enabled": False})
    assert only_graph(compilation).cache["status"] == "off"
    assert not (tmp_path / "graphs").exists()


def test_verify_each_bypasses_the_cache_and_runs_every_pass(tmp_path):
    compile_and_call(tmp_path)
    compilation, _, _ = compile_and_call(tmp_path, verify="each")
    record = only_graph(compilation)
    assert record.cache["status"] == "bypassed" and record.passes


def test_explain_and_the_report_show_hits_and_misses(tmp_path):
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(8, 32)
    with torch.no_grad():
        cold = explain(model, x, overrides={"cache": {"dir": str(tmp_path)}})
        warm = explain(model, x, overrides={"cache": {"dir": str(tmp_path)}})
    assert [c["status"] for c in cold.cache] == ["miss"]
    assert [c["status"] for c in warm.cache] == ["hit"]
    assert "cache hit (g0)" in str(warm)
    assert warm.report["summary"]["cache_hits"] == 1 and cold.report["summary"]["cache_misses"] == 1
    assert any("cache hit" in n["message"] for n in warm.report["graphs"][0]["cache"])


def run_worker(cache: Path, *extra: str, env_extra: dict | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PIPELINE_CACHE_GRAPHS", "PIPELINE_DUMP_DIR")}
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, str(WORKER), "compile", str(cache), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def worker_result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_compiling_the_same_model_at_once_both_succeed(tmp_path):
    a, b = run_worker(tmp_path), run_worker(tmp_path)
    results = [worker_result(a), worker_result(b)]
    for result in results:
        assert result["max_error"] < 1e-4
        assert result["kernels"] > 0
    entries = list(tmp_path.glob("graphs/*/*.entry"))
    assert len(entries) == 1
    read_entry(entries[0], entries[0].stem)
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file is left behind"
    third = worker_result(run_worker(tmp_path))
    assert third["statuses"] == ["hit"] and third["max_error"] < 1e-4


def test_four_processes_racing_on_one_empty_cache_all_match_eager(tmp_path):
    workers = [run_worker(tmp_path, "--model", "small") for _ in range(4)]
    for result in [worker_result(w) for w in workers]:
        assert result["max_error"] < 1e-4 and result["kernels"] > 0
    for entry in tmp_path.glob("graphs/*/*.entry"):
        read_entry(entry, entry.stem)                  # every entry whole
    libraries = list((tmp_path / "cpp").glob("k_*.so"))
    assert libraries and all(Path(f"{lib}.sha256").exists() for lib in libraries)
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file is left behind"


def test_a_second_process_does_no_pass_work(tmp_path):
    cold = worker_result(run_worker(tmp_path))
    assert cold["statuses"] == ["miss"] and cold["passes_run"] > 0
    warm = worker_result(run_worker(tmp_path))
    assert warm["statuses"] == ["hit"]
    assert warm["passes_run"] == 0
    assert warm["compile_seconds"] <= 1.0
    assert warm["kernels"] == cold["kernels"]
    assert warm["max_error"] < 1e-4


def test_triton_kernels_are_rebuilt_from_the_cache_in_another_process(tmp_path):
    pytest.importorskip("triton")
    args = ("--model", "small", "--backend", "triton")
    cold = worker_result(run_worker(tmp_path, *args, env_extra={"TRITON_INTERPRET": "1"}))
    warm = worker_result(run_worker(tmp_path, *args, env_extra={"TRITON_INTERPRET": "1"}))
    assert cold["statuses"] == ["miss"] and warm["statuses"] == ["hit"]
    assert warm["kernels"] == cold["kernels"] > 0 and warm["passes_run"] == 0
    assert warm["max_error"] < 1e-5
    assert list((tmp_path / "triton").glob("t_*.py"))


# -- progress lines --------------------------------------------------------------------------------
def test_progress_lines_appear_once_a_compile_is_long(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_PROGRESS", "on")
    monkeypatch.setenv("PIPELINE_PROGRESS_AFTER", "0")
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    compile_and_call(tmp_path, cache={"dir": str(tmp_path), "enabled": False})
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("pipeline: g0 [")]
    assert lines and "functionalize" in lines[0] and "[1/" in lines[0]


def test_progress_is_silent_for_short_compiles_and_off_when_not_a_terminal(monkeypatch):
    monkeypatch.delenv("PIPELINE_PROGRESS", raising=False)
    assert Progress(io.StringIO()).enabled is False           # auto: a StringIO is not a terminal
    stream = io.StringIO()
    progress = Progress(stream, after=60.0, enabled=True)
    progress.for_graph("g0", 3, 0.0)
    progress.write("g0 [1/3] fuse")
    assert stream.getvalue() == ""
    progress.for_graph("g1", 3, 61.0)
    progress.write("g1 [1/3] fuse")
    assert stream.getvalue() == "pipeline: g1 [1/3] fuse\n"


def test_a_backward_graphs_key_ignores_whether_its_inputs_required_gradients():
    """A backward graph runs without autograd: a saved tensor that requires gradients in the process
    that compiled (from a forward traced there) and not in one that loaded artifacts (from a forward
    rebuilt from the cache) is the same input, so both must find the same entry (fleet start)."""
    from pipeline.cache import key_material
    from pipeline.plan import load_plan

    gm = torch.fx.symbolic_trace(lambda a, b: a * b)
    plan = load_plan("default")

    def key(role: str, requires_grad: bool) -> str:
        inputs = [torch.randn(3, requires_grad=requires_grad), torch.randn(3)]
        material, _ = key_material(gm, inputs, plan=plan, passes=[], role=role, target="cpu")
        return json.dumps(material["inputs"], sort_keys=True)

    assert key("backward", True) == key("backward", False)
    assert key("forward", True) != key("forward", False)


def _graph_on(device: str) -> torch.fx.GraphModule:
    """``a + ones(3, device=device)``: a graph naming its device in a node's arguments."""
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    ones = graph.call_function(torch.ops.aten.ones.default, ([3],), {"device": torch.device(device)})
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (a, ones)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_graph_on_one_gpu_has_the_same_key_on_every_gpu_of_the_host_and_is_relocated_on_a_hit():
    """Fleet start on one host: rank 1 (cuda:1) finds the entries rank 0 (cuda:0) compiled; the
    rebuilt graph names the GPU it is loaded for. A graph spanning two GPUs keeps its indices."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pipeline.cache import digest, key_material, relocate_cuda
    from pipeline.cache.graph_io import data_to_graph, graph_to_data
    from pipeline.plan import load_plan

    plan = load_plan("default")
    with FakeTensorMode():
        on0, on1 = torch.empty(3, device="cuda:0"), torch.empty(3, device="cuda:1")

    def material(device: str, example: torch.Tensor) -> dict:
        return key_material(_graph_on(device), [example], plan=plan, passes=[], role="forward", target="cuda")[0]

    first, second = material("cuda:0", on0), material("cuda:1", on1)
    assert digest(first) == digest(second)
    assert (first["cuda_index"], second["cuda_index"]) == (0, 1)
    spanning = material("cuda:1", on0)
    assert "cuda_index" not in spanning and digest(spanning) != digest(first)

    data, constants = graph_to_data(_graph_on("cuda:0"))
    rebuilt = data_to_graph(relocate_cuda(data, 0, 1), constants)
    ones = next(n for n in rebuilt.graph.nodes if n.target is torch.ops.aten.ones.default)
    assert ones.kwargs["device"] == torch.device("cuda:1")


class ViewsAndDonors(torch.nn.Module):
    """A kernel whose input dies at its call (its output takes that buffer) and a reshape of a
    kernel's output (a folded view: a reinterpret alias in the host code)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.linear(x)) * 3      # in-kernel operands: the transpose is not hoisted above it
        return (y.t().contiguous() * 2).view(4, -1).sin().t()


def test_a_cache_hit_runs_the_same_host_code_as_the_compile_that_stored_it(tmp_path):
    """Donated buffers and reinterpret aliases are decided with example values the rebuilt graph
    does not have: the decisions travel in the entry (donors) or are made at run time (the
    alias's base offset), so a hit loses neither."""
    def host_lines(compilation) -> list[str]:
        code = only_graph(compilation).final_code
        return [line.split("=", 1)[1].split("(")[0].strip() + ("(donors)" if "donors=" in line else "")
                for line in code.splitlines() if "donors=" in line or "reinterpret_tensor" in line]

    first, _, _ = compile_and_call(tmp_path, ViewsAndDonors().eval())
    second, out, expected = compile_and_call(tmp_path, ViewsAndDonors().eval())
    assert only_graph(second).cache["status"] == "hit"
    kinds = host_lines(first)
    assert any(k.endswith("(donors)") for k in kinds) and "reinterpret_tensor" in kinds, kinds
    assert host_lines(second) == kinds
    torch.testing.assert_close(out, expected)


class DeadBuffers(torch.nn.Module):
    """Two softmaxes after matmuls: the second softmax's output takes the first's dead input."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(32, 32))
        self.w2 = torch.nn.Parameter(torch.randn(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.softmax(x @ self.w1, dim=-1) @ self.w2, dim=-1)


def test_a_cache_hit_keeps_the_kernels_buffer_reuse(tmp_path):
    """``reuse=`` is a graph edge decided with example values: the stored graph carries it."""
    options = {"options": {"codegen": {"reuse_buffers": ["cpu"]}}}
    first, _, _ = compile_and_call(tmp_path, DeadBuffers().eval(), **options)
    second, out, expected = compile_and_call(tmp_path, DeadBuffers().eval(), **options)
    assert only_graph(second).cache["status"] == "hit"
    reuse = [line.split("reuse=")[1] for line in only_graph(first).final_code.splitlines() if "reuse=" in line]
    assert reuse and reuse == [line.split("reuse=")[1] for line in only_graph(second).final_code.splitlines()
                               if "reuse=" in line]
    torch.testing.assert_close(out, expected)
