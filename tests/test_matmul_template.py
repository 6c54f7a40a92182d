"""The ``matmul-template`` pass: one Triton matmul kernel with the pointwise epilogue fused in.

Kernels run on CPU tensors through the Triton interpreter (``TRITON_INTERPRET=1``, set below at
collection before anything imports triton, as in test_triton_backend.py), forced with
``choose: always`` since nothing can be timed without a GPU; every template source generated
here, and every candidate for the GPU benchmark's shape, is compiled for sm_90 in one fresh
process. The compile cache of whole graphs is off (``PIPELINE_CACHE_GRAPHS=0``) except where a
test is about it, so every compile runs the passes.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeline import compilation_of, compile_with_plan, load_plan  # noqa: E402
from pipeline.numerics import compare  # noqa: E402
from conftest import rerun_with_interpreter, triton_interpreter_ready  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e '.[gpu]')")

ALWAYS = {"choose": "always", "min_flops": 0}
PLAN = {"extends": "max-autotune-no-cudagraphs", "target": "cpu",
        "options": {"codegen": {"backend": "triton"}, "matmul-template": ALWAYS}}
SOURCES: dict = {}          # source path -> True, every template module a test installed


@pytest.fixture(autouse=True)
def _interpreter_and_records(monkeypatch, request):
    """Fresh Dynamo state, no graph cache, and every installed template's source recorded."""
    torch._dynamo.reset()
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "0")
    if not HAS_TRITON:
        yield
        return
    import passes.matmul_template as matmul_template
    if not triton_interpreter_ready(request):
        yield
        return
    original = matmul_template.install

    def recording(graph, site, chosen, directory, persistent):
        original(graph, site, chosen, directory, persistent)
        SOURCES[str(site.epilogue.target.path)] = True

    monkeypatch.setattr(matmul_template, "install", recording)
    yield


def compiled_graph(fn, *args, plan=PLAN):
    """Compile ``fn`` with ``plan``, check the result against eager, return the graph's record."""
    compiled = compile_with_plan(fn, plan)
    with torch.no_grad():
        out = compiled(*args)
        problem = compare(fn(*args), out)
    assert problem is None, problem
    return compilation_of(compiled).graphs[0]


def template_kernels(record) -> list[dict]:
    return [k for k in record.contents["kernels"] if "matmul template" in k["source"]]


def template_notes(record) -> list[str]:
    return [n["message"] for n in record.notes if n["pass"] == "matmul-template"]


ACTIVATIONS = {"gelu": F.gelu, "relu": torch.relu, "silu": F.silu, "tanh": torch.tanh, "none": lambda v: v}


def epilogue_function(linear: bool, bias: bool, activation: str, scale: bool, residual: bool):
    """``act(x @ w [+ b]) [* s] [+ r]``, the product through ``F.linear`` (addmm/linear in the
    graph) or ``@`` (mm)."""
    def fn(x, w, b, s, r):
        y = F.linear(x, w, b if bias else None) if linear else x @ w
        if bias and not linear:
            y = y + b
        y = ACTIVATIONS[activation](y)
        if scale:
            y = y * s
        if residual:
            y = y + r
        return y
    return fn


def epilogue_inputs(m: int, n: int, k: int, linear: bool, dtype=torch.float32) -> tuple:
    w = torch.randn(n, k, dtype=dtype) if linear else torch.randn(k, n, dtype=dtype)
    return (torch.randn(m, k, dtype=dtype), w * 0.2, torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype),
            torch.randn(m, n, dtype=dtype))


@settings(max_examples=12, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(m=st.sampled_from([32, 37]), n=st.sampled_from([40, 64]), k=st.sampled_from([48, 16]),
       linear=st.booleans(), bias=st.booleans(), activation=st.sampled_from(sorted(ACTIVATIONS)),
       scale=st.booleans(), residual=st.booleans())
def test_template_with_fused_epilogue_matches_eager(m, n, k, linear, bias, activation, scale, residual):
    if not ((bias and not linear) or scale or residual) and activation == "none":
        activation = "gelu"     # a matmul without an epilogue (linear's bias is its own) is not a site
    torch._dynamo.reset()
    fn = epilogue_function(linear, bias, activation, scale, residual)
    record = compiled_graph(fn, *epilogue_inputs(m, n, k, linear))
    assert len(template_kernels(record)) == 1 and record.kernels == 1, template_notes(record)
    assert "aten_mm" not in record.final_code and "aten_linear" not in record.final_code


def test_bias_gelu_scale_residual_is_one_kernel_with_the_epilogue_on_the_accumulator():
    fn = epilogue_function(False, True, "gelu", True, True)
    record = compiled_graph(fn, *epilogue_inputs(32, 40, 48, False))
    (kernel,) = template_kernels(record)
    source = kernel["source"]
    assert "tl.dot(a, b, acc" in source and 'input_precision="ieee"' in source
    assert source.index("for k in range") < source.rindex("pp_gelu(") < source.index("tl.store")
    assert source.count("tl.store") == 1
    assert any("matmul template" in note and "choose: always" in note for note in template_notes(record))


def test_fp16_template_rounds_like_eager():
    fn = epilogue_function(True, True, "silu", True, False)
    record = compiled_graph(fn, *epilogue_inputs(32, 40, 48, True, dtype=torch.float16))
    (kernel,) = template_kernels(record)
    assert ".to(tl.float16).to(tl.float32)" in kernel["source"]


def test_every_candidate_configuration_matches_eager():
    """Autotuning picks among these by speed alone, so each must compute the same thing (ragged
    tiles in M, N and K; fp32 and fp16 tables)."""
    from passes.matmul_template import MatmulTemplateKernel
    from passes.matmul_template.source import candidate_configs, template_source
    from passes.codegen.triton.runtime import load_module, write_source
    torch.manual_seed(0)    # inputs independent of the tests run before (fp16 sits near its tolerance)
    for dtype, (m, n, k) in ((torch.float32, (130, 136, 80)), (torch.float16, (70, 260, 72))):
        fn = epilogue_function(False, True, "tanh", True, True)
        args = epilogue_inputs(m, n, k, False, dtype=dtype)
        site, values = site_of(fn, args)
        configs = candidate_configs(m, n, k, dtype, limit=20)
        assert len(configs) >= 4
        expected = fn(*args)
        outputs = next(x for x in site.group.subgraph.graph.nodes if x.op == "output").args[0]
        for config in configs:
            generated = template_source(site.plan, "triton_candidate", config)
            path, _ = write_source(generated.source)
            SOURCES[str(path)] = True
            kernel = MatmulTemplateKernel(site.group, generated, load_module(path), path,
                                          [v.meta["val"] for v in site.inputs], [o.meta["val"] for o in outputs])
            (got,) = kernel(*values)
            assert compare(expected, got) is None, (config, compare(expected, got))


def site_of(fn, args) -> tuple:
    """The template site in ``fn``'s graph after ``codegen`` (found by the pass's own matcher)
    and the arguments its combined group takes. Every argument of ``fn`` must be used, so the
    graph's placeholders are ``args`` in order."""
    from passes.matmul_template import MatmulTemplate, find_site
    found = []

    def spy(self, graph, context):
        placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
        for node in graph.graph.nodes:
            site, _ = find_site(node) if node.op == "call_function" and "mm" in str(node.target) else (None, "")
            if site is not None:
                found.append((site, [args[placeholders.index(v)] for v in site.inputs]))
        return graph

    original = MatmulTemplate.run
    MatmulTemplate.run = spy
    try:
        torch._dynamo.reset()
        compiled = compile_with_plan(fn, PLAN)
        with torch.no_grad():
            compiled(*args)
    finally:
        MatmulTemplate.run = original
    (result,) = found
    return result


def test_autotune_without_a_gpu_keeps_the_extern_call_and_says_why():
    plan = dict(PLAN, options={"codegen": {"backend": "triton"}, "matmul-template": {"min_flops": 0}})
    record = compiled_graph(epilogue_function(False, True, "gelu", True, False), *epilogue_inputs(32, 40, 48, False),
                            plan=plan)
    assert not template_kernels(record) and "aten_mm" in record.final_code
    (note,) = template_notes(record)
    assert "extern kept" in note and "on a CUDA GPU" in note and "cpu" in note


def test_small_matmuls_and_other_dtypes_keep_the_extern_call():
    fn, args = epilogue_function(False, True, "relu", False, False), epilogue_inputs(32, 40, 48, False)
    record = compiled_graph(fn, *args, plan=dict(PLAN, options={"codegen": {"backend": "triton"},
                                                                "matmul-template": {"choose": "always"}}))
    assert not template_kernels(record)
    assert any("under min_flops 100000000" in n for n in template_notes(record))
    torch._dynamo.reset()
    record = compiled_graph(fn, *args, plan=dict(PLAN, options={
        "codegen": {"backend": "triton"}, "matmul-template": dict(ALWAYS, dtypes=["bfloat16"])}))
    assert not template_kernels(record)
    assert any("dtype torch.float32 is not in dtypes" in n for n in template_notes(record))


def test_a_matmul_result_used_twice_stays_extern():
    def fn(x, w, b):
        y = x @ w
        return torch.relu(y + b), y
    record = compiled_graph(fn, torch.randn(32, 48), torch.randn(48, 40), torch.randn(40))
    assert not template_kernels(record)
    assert any("does not feed exactly one fused group" in n for n in template_notes(record))


def test_an_epilogue_reading_two_matmuls_fuses_only_the_first():
    def fn(x, w1, y, w2):
        return torch.relu(x @ w1 + y @ w2)
    record = compiled_graph(fn, torch.randn(32, 48), torch.randn(48, 40), torch.randn(32, 24), torch.randn(24, 40))
    assert len(template_kernels(record)) == 1 and record.final_code.count("aten_mm") == 1
    assert any("already fuses another matmul" in n for n in template_notes(record)), template_notes(record)


def test_a_chain_of_linear_layers_gets_one_template_per_layer():
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.ReLU()).eval()
    record = compiled_graph(model, torch.randn(32, 48))
    assert len(template_kernels(record)) == 2 and record.kernels == 2


def test_an_epilogue_with_two_outputs_stores_both_from_the_tile():
    def fn(x, w, b):
        y = x @ w + b
        return torch.relu(y), torch.sigmoid(y) * 2
    record = compiled_graph(fn, torch.randn(37, 48), torch.randn(48, 40), torch.randn(40))
    (kernel,) = template_kernels(record)
    assert kernel["source"].count("tl.store") == 2 and record.kernels == 1


@pytest.mark.parametrize("limit", [0, None], ids=["no_fuel", "unlimited"])
def test_bisect_fuel_gates_each_template_rewrite(limit):
    from pipeline import get_registry
    from pipeline.api import compile_under
    from pipeline.compilation import Compilation
    from pipeline.graph_pass import Fuel
    fuel = Fuel({"matmul-template": limit})
    compilation = Compilation(load_plan(PLAN), get_registry(), fuel=fuel)
    fn, args = epilogue_function(False, True, "gelu", False, False), epilogue_inputs(32, 40, 48, False)
    with torch.no_grad():
        assert compare(fn(*args), compile_under(fn, compilation)(*args)) is None
    used = template_kernels(compilation.graphs[0])
    assert (len(used), len(fuel.spent.get("matmul-template", []))) == ((0, 0) if limit == 0 else (1, 1))


def test_choose_never_leaves_the_graph_alone():
    plan = dict(PLAN, options={"codegen": {"backend": "triton"}, "matmul-template": {"choose": "never"}})
    record = compiled_graph(epilogue_function(False, True, "gelu", True, False), *epilogue_inputs(32, 40, 48, False),
                            plan=plan)
    assert not template_kernels(record) and not template_notes(record) and record.kernels == 1


def test_inputs_with_unexpected_strides_run_the_combined_group_eagerly(monkeypatch):
    from passes.matmul_template import MatmulTemplateKernel, install
    from passes.matmul_template.source import candidate_configs, template_source
    fn = epilogue_function(False, True, "gelu", True, True)
    args = epilogue_inputs(32, 40, 48, False)
    site, values = site_of(fn, args)
    config = candidate_configs(32, 40, 48, torch.float32, 1)[0]
    install(site.matmul.graph.owning_module, site, template_source(site.plan, "triton_strides", config), None, True)
    kernel = site.epilogue.target
    assert isinstance(kernel, MatmulTemplateKernel)
    assert compare(fn(*args), kernel(*values)[0]) is None
    monkeypatch.setattr(kernel, "launch", lambda *a, **k: pytest.fail("launched with unexpected strides"))
    x = torch.randn(48, 32).t()                     # a transposed layout the kernel was not built for
    (out,) = kernel(x, *values[1:])
    assert compare(fn(x, *args[1:]), out) is None


def test_verify_each_checks_the_graph_after_the_template_pass():
    plan = dict(PLAN, verify="each")
    record = compiled_graph(epilogue_function(True, True, "gelu", True, True), *epilogue_inputs(32, 40, 48, True),
                            plan=plan)
    assert template_kernels(record) and record.verified.startswith("passed"), record.verified


def test_compile_cache_rebuilds_the_template_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE_GRAPHS", "1")
    plan = dict(PLAN, cache={"dir": str(tmp_path)})
    fn, args = epilogue_function(False, True, "relu", True, False), epilogue_inputs(32, 40, 48, False)
    first = compiled_graph(fn, *args, plan=plan)
    torch._dynamo.reset()
    second = compiled_graph(fn, *args, plan=plan)
    assert first.cache["status"] == "miss" and second.cache["status"] == "hit", (first.cache, second.cache)
    assert template_kernels(second) and "NUM_STAGES" in template_kernels(second)[0]["source"]


def test_max_autotune_plans_add_the_template_after_codegen():
    default, reduce = load_plan("default"), load_plan("reduce-overhead")
    no_graphs, autotune = load_plan("max-autotune-no-cudagraphs"), load_plan("max-autotune")
    assert no_graphs.pass_names() == default.pass_names() + ["matmul-template"]
    names = reduce.pass_names()
    assert autotune.pass_names() == names[:names.index("cudagraphs")] + ["matmul-template", "cudagraphs"]
    for plan, base in ((no_graphs, default), (autotune, reduce)):
        (template,) = [p for p in plan.passes if p.name == "matmul-template"]
        assert template.options.choose == "autotune"
        for ours, theirs in zip([p for p in plan.passes if p.name != "matmul-template"], base.passes):
            if ours.name == "codegen":
                assert ours.options.autotune and ours.options.backend == theirs.options.backend
            else:
                assert ours.options == theirs.options, (plan.name, ours.name)


def test_a_3d_linear_through_a_reshape_is_one_template_kernel():
    """A 3-D input's linear is a 2-D matmul whose result is viewed back to 3-D before the epilogue:
    the template writes the 3-D result directly (a strided slice as residual)."""
    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b)) + x[..., :40]
    record = compiled_graph(fn, torch.randn(2, 16, 48), torch.randn(40, 48) * 0.2, torch.randn(40))
    assert len(template_kernels(record)) == 1 and "as_strided" not in record.final_code


def test_an_epilogue_input_broadcast_over_the_middle_axis_stays_extern():
    def fn(x, w, r):
        return torch.relu(F.linear(x, w)) * r
    record = compiled_graph(fn, torch.randn(2, 16, 48), torch.randn(40, 48), torch.randn(2, 1, 40))
    assert not template_kernels(record)
    assert any("not addressed row-major" in n for n in template_notes(record)), template_notes(record)


def test_autotune_uses_the_template_only_where_it_is_faster_and_caches_the_decision(monkeypatch, tmp_path):
    """The GPU decision with the clock replaced: ``do_bench`` still runs each candidate and the
    extern pair once (interpreted), then reports the given times."""
    import contextlib

    import triton.testing

    import passes.matmul_template as matmul_template
    from passes.matmul_template.source import candidate_configs, template_source
    from passes.codegen.triton.runtime import load_module, write_source
    fn = epilogue_function(False, True, "gelu", True, True)
    args = epilogue_inputs(32, 40, 48, False)
    site, values = site_of(fn, args)
    assert compare(fn(*args), matmul_template.extern_call(site)(*values)[0]) is None
    configs = candidate_configs(64, 64, 64, torch.float32, 3)
    sources = [template_source(site.plan, "triton_timed", c) for c in configs]
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")

    def clock(times):
        pending = iter(times)

        def bench(function, warmup, rep):
            function()
            return next(pending)
        return bench

    def load(source):
        return load_module(write_source(source.source)[0])

    def decide(folder):
        return matmul_template.decide(site, configs, sources, torch.device("cpu"), folder, load)

    monkeypatch.setattr(triton.testing, "do_bench", clock([1.0, 2.0, 0.5, 3.0]))     # extern first
    chosen, note = decide(tmp_path / "a")
    assert chosen is sources[1], note
    assert "template 0.5000 ms" in note and "extern 1.0000 ms" in note and configs[1].describe() in note
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("timed a cached decision"))
    again, note = decide(tmp_path / "a")
    assert again is sources[1] and "cached decision" in note
    monkeypatch.setattr(triton.testing, "do_bench", clock([0.25, 2.0, 0.5, 3.0]))
    chosen, note = decide(tmp_path / "b")
    assert chosen is None and note.startswith("extern kept") and "extern 0.2500 ms" in note


def bench_plan(m: int, n: int, k: int, dtype: torch.dtype):
    """The template plan of ``gelu(x @ w + b) * s`` at a GPU benchmark's size, from meta tensors."""
    from passes.matmul_template.source import template_plan
    from passes.kernel_ir.groups import FusedGroup
    aten = torch.ops.aten
    graph = torch.fx.Graph()

    def value(node, *shape):
        node.meta["val"] = torch.empty(*shape, dtype=dtype, device="meta")
        return node

    x, w = value(graph.placeholder("in0"), m, k), value(graph.placeholder("in1"), k, n)
    b, s = value(graph.placeholder("in2"), n), value(graph.placeholder("in3"), n)
    mm = value(graph.call_function(aten.mm.default, (x, w)), m, n)
    add = value(graph.call_function(aten.add.Tensor, (mm, b)), m, n)
    gelu = value(graph.call_function(aten.gelu.default, (add,)), m, n)
    mul = value(graph.call_function(aten.mul.Tensor, (gelu, s)), m, n)
    graph.output((mul,))
    group = FusedGroup("mm_bench", torch.fx.GraphModule(torch.nn.Module(), graph), (m, n))
    return template_plan(group)


def test_offsets_past_two_to_the_31_are_computed_in_int64():
    from passes.matmul_template.source import candidate_configs, template_source
    small, huge = bench_plan(8192, 4096, 4096, torch.bfloat16), bench_plan(65536, 40960, 64, torch.bfloat16)
    config = candidate_configs(8192, 4096, 4096, torch.bfloat16, 1)[0]
    assert "tl.program_id(0).to(tl.int64)" not in template_source(small, "triton_small", config).source
    assert "tl.program_id(0).to(tl.int64)" in template_source(huge, "triton_huge", config).source


def test_every_template_kernel_compiles_for_sm90():
    """Runs last: every template source the tests above generated, and every candidate for the
    GPU benchmark's ``gelu(x@w+b)*s`` (8192x4096 @ 4096x4096, bf16 and fp32), compile to PTX and a
    cubin for the H200 with their warps and stages, within its 227 KiB of shared memory per block."""
    from passes.matmul_template.source import candidate_configs, template_source
    from passes.codegen.triton.runtime import compile_all_for_sm90, write_source
    if not SOURCES:
        test_bias_gelu_scale_residual_is_one_kernel_with_the_epilogue_on_the_accumulator()
    paths = sorted(SOURCES)
    for dtype in (torch.bfloat16, torch.float32):
        plan = bench_plan(8192, 4096, 4096, dtype)
        for config in candidate_configs(8192, 4096, 4096, dtype, limit=12):
            paths.append(str(write_source(template_source(plan, "triton_bench", config).source)[0]))
    results = compile_all_for_sm90(paths)
    assert len(results) == len(paths) and len(paths) > 16
    assert all(r["cubin_bytes"] > 0 and r["shared"] <= 232448 for r in results), results


def test_module_in_a_fresh_process():
    """Only when something imported triton before this module could set TRITON_INTERPRET (the
    interpreter needs it at import time): run this file again in a new process."""
    rerun_with_interpreter(__file__)
