"""The generated host code: view chains folded into one as_strided, linear lowering, and the
straight-line source that calls ATen entry points directly, all matching eager."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare


def attention_heads(x, w, b):
    """GPT-2's attention input: one matmul, split into q/k/v, each viewed and permuted per head."""
    qkv = (x.reshape(-1, 32) @ w + b).view(2, 8, 96)
    q, k, v = qkv.split(32, dim=2)
    q, k, v = (t.view(2, 8, 4, 8).permute(0, 2, 1, 3) for t in (q, k, v))
    att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    return att.permute(0, 2, 1, 3).reshape(2, 8, 32).relu()


def inputs():
    return torch.randn(2, 8, 32), torch.randn(32, 96), torch.randn(96)


def run(fn, args, **codegen):
    overrides = {"options": {"codegen": codegen}} if codegen else {}
    compiled = compile_with_plan(fn, "cpu-inference", **overrides)
    out = compiled(*args)
    return out, compilation_of(compiled).graphs[0]


def test_view_chains_of_computed_tensors_become_one_as_strided_each():
    args = inputs()
    out, record = run(attention_heads, args)
    assert compare(attention_heads(*args), out) is None
    code = record.final_code
    assert "as_strided" in code
    assert "split" not in code and "permute" not in code
    assert any("view chain(s) folded" in n["message"] for n in record.notes)


def test_folded_views_are_cheap_aliases_with_the_right_offsets():
    """q, k and v start at different offsets of the qkv matmul's result: each folded view is one
    reinterpret_tensor call whose offset is counted from the computed tensor's own."""
    args = inputs()
    out, record = run(attention_heads, args)
    assert compare(attention_heads(*args), out) is None
    code = record.final_code
    assert code.count("reinterpret_tensor(") >= 3 and "= aten_as_strided(" not in code


def test_an_as_strided_without_an_offset_of_a_computed_tensor_is_a_cheap_alias():
    """``as_strided(t, size, stride)`` keeps ``t``'s own storage offset: a reinterpret_tensor call
    with no offset added, also when ``t`` is a slice of a kernel's result."""
    def f(x):
        y = (x * 2).relu()[1:]
        return torch.as_strided(y, (3, 4), (1, 3)) + 1, torch.as_strided(y.sin(), (2, 2), (2, 1))

    x = torch.randn(5, 6)
    out, record = run(f, (x,))
    assert compare(f(x), out) is None
    assert "= aten_as_strided(" not in record.final_code


def test_views_of_graph_inputs_are_not_folded():
    def f(x):
        return x.view(4, 8).permute(1, 0).relu()

    x = torch.randn(64)[16:48]          # a graph input with a storage offset
    out, record = run(f, (x,))
    assert compare(f(x), out) is None
    assert "as_strided" not in record.final_code


def test_folding_off_keeps_the_view_operators():
    args = inputs()
    out, record = run(attention_heads, args, fold_views=False)
    assert compare(attention_heads(*args), out) is None
    assert "as_strided" not in record.final_code and "split" in record.final_code


def test_addmm_of_a_transposed_weight_calls_linear():
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out, record = run(lambda t: F.gelu(layer(t)), (x,))
        assert compare(F.gelu(layer(x)), out) is None
    assert "aten_linear" in record.final_code and "addmm" not in record.final_code


def test_a_product_with_a_transposed_transpose_reads_the_matrix_itself():
    """A backward multiplies by the weight its forward transposed: ``mm(g, w.t().t())`` is
    ``mm(g, w)``, with no view made for either transpose."""
    g, w = torch.randn(4, 8), torch.randn(8, 16)
    out, record = run(lambda g, w: torch.mm(g, w.t().t()) * 2, (g, w))
    assert compare(torch.mm(g, w) * 2, out) is None
    code = record.final_code
    assert "aten_mm(" in code and "permute" not in code and "linear" not in code and "as_strided" not in code, code


def test_host_code_calls_aten_entry_points_not_the_torch_ops_namespace():
    args = inputs()
    _, record = run(attention_heads, args)
    assert "torch.ops" not in record.final_code
    _, plain = run(attention_heads, args, host_code=False)
    assert "torch.ops.aten" in plain.final_code


def test_values_are_released_after_their_last_use():
    args = inputs()
    _, record = run(attention_heads, args)
    lines = record.final_code.splitlines()
    assert any("; del " in line for line in lines)
    released = {name.strip() for line in lines if "; del " in line
                for name in line.split("#")[0].split("; del ")[1].split(",")}
    returned = next(line for line in lines if line.startswith("    return ")).split("return", 1)[1]
    assert not any(name in returned.replace("(", " ").replace(",", " ").split() for name in released)


_observed: list = []
_watched: list = []


@torch.fx.wrap
def observe(t):
    _observed.append(_watched[0]() is None)
    return t


def test_boxed_forward_frees_each_input_at_its_last_use():
    """Called boxed (as AOTAutograd calls a backward, handing over the saved tensors), the host
    code empties the list and drops each input after its last use: a saved activation does not
    live until the whole backward returns."""
    import weakref

    from passes.codegen.host import to_host_module
    from pipeline.compat import boxed_form

    x, y = torch.randn(64), torch.randn(64)
    _watched[:] = [weakref.ref(x)]

    def fn(a, b):
        return torch.relu(a) + observe(b)
    host = to_host_module(torch.fx.symbolic_trace(fn))
    call = boxed_form(host.forward)
    assert call is not None and call._boxed_call
    expected = torch.relu(x) + y
    args = [x, y]
    del x
    _observed.clear()
    out = call(args)
    assert args == [] and _observed == [True]
    assert torch.equal(out, expected)
    z = torch.randn(64)
    assert torch.equal(host(z, y), torch.relu(z) + y)          # the unboxed forward still works
    assert boxed_form(torch.fx.symbolic_trace(fn).forward) is None     # FX's own code is not boxed


def matmul_then_pointwise(x, w):
    return torch.relu(x @ w) * 2


def test_a_pointwise_kernel_writes_into_a_dying_computed_input():
    """The matmul's result dies at the ReLU kernel, which writes its output into that buffer."""
    args = (torch.randn(8, 16), torch.randn(16, 32))
    out, record = run(matmul_then_pointwise, args)
    assert compare(matmul_then_pointwise(*args), out) is None
    assert "cpp_fused_0(mm); del mm  # donors=(0,)" in record.final_code


def test_graph_inputs_and_buffers_still_read_later_are_not_written_into():
    def f(x, w):
        y = x @ w
        z = torch.relu(y) * 2          # y is still needed below: not a donor
        return z + y.t().sum(0), torch.exp(x)     # x is a graph input: never a donor

    args = (torch.randn(8, 8), torch.randn(8, 8))
    out, record = run(f, args)
    assert compare(f(*args), out) is None
    assert "donors=" not in record.final_code


def test_a_buffer_whose_alias_is_read_later_is_not_written_into():
    def f(x, w):
        y = x @ w
        head = y.view(2, 4, 16)[0]     # an alias of y, read after the kernel below
        return torch.sigmoid(y), head.sum(-1)

    args = (torch.randn(8, 16), torch.randn(16, 16))
    out, record = run(f, args)
    assert compare(f(*args), out) is None
    assert "donors=" not in record.final_code


def two_reductions_after_matmuls(x, w1, w2):
    """Two row-softmaxes of the same shape, each after a matmul: the first softmax's input (the
    first matmul's result) is dead by the second softmax, whose output takes its buffer."""
    a = torch.softmax(x @ w1, dim=-1)
    b = torch.softmax(a @ w2, dim=-1)
    return b


def test_a_kernel_writes_into_the_buffer_of_a_tensor_that_died_before_it():
    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    out, record = run(two_reductions_after_matmuls, args, reuse_buffers=["cpu"])
    assert compare(two_reductions_after_matmuls(*args), out) is None
    assert "reuse=(" in record.final_code


def test_buffer_reuse_is_for_cuda_tensors_by_default():
    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    out, record = run(two_reductions_after_matmuls, args)
    assert compare(two_reductions_after_matmuls(*args), out) is None
    assert "reuse=" not in record.final_code


def test_a_dead_buffer_whose_alias_is_still_read_is_not_reused():
    def f(x, w1, w2):
        y = x @ w1
        head = y.view(2, 4, 16)[0]       # an alias of y read at the end
        a = torch.softmax(y, dim=-1)
        b = torch.softmax(a @ w2, dim=-1)
        return b, head.sum(-1)

    args = (torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 16))
    out, record = run(f, args, reuse_buffers=["cpu"])
    assert compare(f(*args), out) is None
    reused = [line.split("reuse=(")[1].split(")")[0] for line in record.final_code.splitlines() if "reuse=(" in line]
    assert reused and not any(name.strip().startswith("mm") for r in reused for name in r.split(",")), reused


def test_a_launcher_matches_the_kernels_own_call_and_checks_layouts_like_it(cpp_kernels_made):
    """A call site's launcher (passes/codegen/cpp/launch.py) gives the kernel's own results: into
    the donated input where the site says so, through the group eagerly for an input of another
    layout or dtype."""
    from passes.codegen.cpp.launch import launcher

    def f(x, y):
        a = x * y + 1
        return torch.sigmoid(a) - y, a.relu()
    compile_with_plan(f, "cpu-inference")(torch.randn(8, 16), torch.randn(8, 16))
    kernel = cpp_kernels_made[0]
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    expected = kernel(x.clone(), y.clone())
    donors = (-1,) * (len(expected) - 1) + (0,)          # the last output into the first input
    plain, donating = launcher(kernel), launcher(kernel, donors)
    for got in (plain(x.clone(), y.clone()), donating(x.clone(), y.clone())):
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    donated = x.clone()
    assert donating(donated, y)[-1] is donated
    strided = torch.randn(16, 8).t()                         # another layout: the group runs eagerly
    for args in ((strided, y), (x.double(), y.double())):
        assert all(torch.equal(a, b) for a, b in zip(plain(*args), kernel.group(*args), strict=True))
