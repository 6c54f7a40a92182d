"""The ``cudagraphs`` pass: recorded reasons when a graph cannot be recorded (CPU, always run),
and on a GPU: replays match eager, parameters are used in place, inputs are copied, and outputs
are cloned or handed out under torch's reduce-overhead contract."""
from __future__ import annotations

import pytest
import torch

from pipeline import compilation_of, compile_with_plan
from pipeline.numerics import compare
from pipeline.plan import load_plan

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (run on an H200)")


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()


def cudagraph_notes(compiled) -> list[str]:
    return [n["message"] for r in compilation_of(compiled).graphs for n in r.notes if n.get("topic") == "cudagraphs"]


def test_reduce_overhead_is_the_default_pipeline_plus_cudagraphs():
    default, reduce = load_plan("default"), load_plan("reduce-overhead")
    names = [p.name for p in reduce.passes]
    assert names == [p.name for p in default.passes] + ["cudagraphs"]
    for ours, theirs in zip(reduce.passes, default.passes):
        if ours.name != "capture":
            assert ours.options == theirs.options, ours.name


def test_cpu_graph_is_not_recorded_and_says_why():
    model = mlp()
    compiled = compile_with_plan(model, "reduce-overhead")
    x = torch.randn(8, 32)
    with torch.no_grad():
        assert compare(model(x), compiled(x)) is None
    record = compilation_of(compiled).graphs[0]
    assert not record.cudagraphs
    assert any("not recorded: input 0 is a cpu tensor" in n for n in cudagraph_notes(compiled))


def test_required_cudagraphs_turn_a_skip_into_an_error():
    compiled = compile_with_plan(mlp(), "reduce-overhead", options={"cudagraphs": {"required": True}})
    with pytest.raises(Exception, match="cudagraphs is required but input 0 is a cpu tensor"):
        with torch.no_grad():
            compiled(torch.randn(8, 32))


def test_expect_full_cudagraphs_fails_when_a_graph_is_not_recorded():
    compiled = compile_with_plan(mlp(), "reduce-overhead", expect={"cudagraphs": "full"})
    with pytest.raises(Exception, match="expect.cudagraphs"):
        with torch.no_grad():
            compiled(torch.randn(8, 32))


@needs_cuda
def test_replays_match_eager_and_parameters_are_used_in_place():
    model = mlp().cuda()
    compiled = compile_with_plan(model, "reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 32, device="cuda")
            assert compare(model(x), compiled(x)) is None
        model[0].weight.mul_(2)                     # an in-place update is seen by the replay
        x = torch.randn(8, 32, device="cuda")
        assert compare(model(x), compiled(x)) is None
    record = compilation_of(compiled).graphs[0]
    assert record.cudagraphs
    assert any("1 input(s) copied into static buffers" in n and "4 parameter/buffer input(s) used in place" in n
               for n in cudagraph_notes(compiled))


@needs_cuda
def test_a_graph_with_symbolic_sizes_is_recorded_once_per_size_up_to_the_limit():
    """capture.dynamic: true with cudagraphs: one recording per batch size seen (at most
    max_sizes), each replay matches eager, and sizes past the limit run without CUDA graphs."""
    model = mlp().cuda()
    plan = {"extends": "reduce-overhead", "options": {"capture": {"dynamic": True}, "cudagraphs": {"max_sizes": 3}}}
    compiled = compile_with_plan(model, plan)
    with torch.no_grad():
        for batch in (4, 8, 4, 12, 8, 16, 4):
            x = torch.randn(batch, 32, device="cuda")
            problem = compare(model(x), compiled(x), what=f"batch {batch}")
            assert problem is None, problem
    assert len(compilation_of(compiled).graphs) == 1
    notes = cudagraph_notes(compiled)
    assert sum("of at most 3 recorded" in n for n in notes) == 3, notes
    assert any("more than cudagraphs.max_sizes 3" in n for n in notes), notes
    assert sum(n.startswith("recorded:") for n in notes) == 3, notes


@needs_cuda
def test_cloned_outputs_are_not_overwritten_by_the_next_call():
    model = mlp().cuda()
    compiled = compile_with_plan(model, "reduce-overhead", options={"cudagraphs": {"clone_outputs": True}})
    with torch.no_grad():
        compiled(torch.randn(8, 32, device="cuda"))          # first call records
        a_in, b_in = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
        a = compiled(a_in)
        expected_a = model(a_in)
        compiled(b_in)
        assert compare(expected_a, a) is None


@needs_cuda
def test_reduce_overhead_outputs_are_valid_until_the_next_call_then_unreadable():
    """torch's reduce-overhead contract: no copy per call; what an earlier call returned (and any
    view of it) raises on access once the graph replays again, naming the graph."""
    model = mlp().cuda()
    compiled = compile_with_plan(model, "reduce-overhead")
    with torch.no_grad():
        compiled(torch.randn(8, 32, device="cuda"))          # first call records
        a_in, b_in = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
        a = compiled(a_in)
        row = a[3]
        assert compare(model(a_in), a) is None
        b = compiled(b_in)
        assert compare(model(b_in), b) is None
        b_pointer = b.data_ptr()
        for stale in (a, row):
            with pytest.raises(RuntimeError, match="overwritten by a later call of the same graph"):
                stale.sum().item()
        c_in = torch.randn(8, 32, device="cuda")
        c = compiled(c_in)
        assert compare(model(c_in), c) is None and c.data_ptr() == b_pointer
        with pytest.raises(RuntimeError, match="overwritten"):
            b.sum().item()
    assert any("overwritten by the next call (then unreadable)" in n for n in cudagraph_notes(compiled))


@needs_cuda
def test_handed_out_outputs_of_one_graph_survive_another_graphs_replays():
    """Each graph that hands its outputs out records into a pool of its own: replaying one model's
    graph never writes into what another's returned."""
    first, second = mlp().cuda(), mlp().cuda()
    ours_first = compile_with_plan(first, "reduce-overhead")
    ours_second = compile_with_plan(second, "reduce-overhead")
    with torch.no_grad():
        for _ in range(2):
            ours_first(torch.randn(8, 32, device="cuda"))
            ours_second(torch.randn(8, 32, device="cuda"))
        x = torch.randn(8, 32, device="cuda")
        kept = ours_first(x)
        for _ in range(3):
            ours_second(torch.randn(8, 32, device="cuda"))
        assert compare(first(x), kept) is None


@needs_cuda
def test_outputs_of_a_graph_recorded_per_size_are_unreadable_after_any_size_replays():
    model = mlp().cuda()
    plan = {"extends": "reduce-overhead", "options": {"capture": {"dynamic": True}}}
    compiled = compile_with_plan(model, plan)
    with torch.no_grad():
        for batch in (4, 8, 4, 8):
            compiled(torch.randn(batch, 32, device="cuda"))
        x4 = torch.randn(4, 32, device="cuda")
        a = compiled(x4)
        assert compare(model(x4), a) is None
        compiled(torch.randn(8, 32, device="cuda"))
        with pytest.raises(RuntimeError, match="overwritten"):
            a.sum().item()


@needs_cuda
def test_an_input_the_graph_writes_is_written_back():
    def f(cache, x, pos):
        cache.index_copy_(0, pos, x)
        return cache.sum(0)

    compiled = compile_with_plan(f, "reduce-overhead")
    ours, theirs = torch.zeros(16, 8, device="cuda"), torch.zeros(16, 8, device="cuda")
    for step in range(4):
        x, pos = torch.randn(2, 8, device="cuda"), torch.tensor([step, step + 8], device="cuda")
        assert compare(f(theirs, x, pos), compiled(ours, x, pos)) is None
        assert torch.equal(ours, theirs)


TRAINING_CUDAGRAPHS = "training-reduce-overhead"


def train_steps(model, compiled, steps: int, device: str) -> list[tuple[torch.Tensor, dict]]:
    """Loss and gradients of ``steps`` AdamW steps of ``compiled`` (training ``model``'s weights)."""
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 32, device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = compiled(x).square().mean()
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        optimizer.step()
    return out


def test_training_graphs_are_recorded_only_when_the_plan_lists_their_roles():
    model = mlp().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS, options={"cudagraphs": {"roles": ["inference"]}})
    compiled(torch.randn(8, 32)).sum().backward()
    notes = cudagraph_notes(compiled)
    assert any("forward graphs are not recorded (cudagraphs.roles is ['inference']" in n for n in notes)
    assert any("backward graphs are not recorded" in n for n in notes)
    listed = compile_with_plan(mlp().train(), TRAINING_CUDAGRAPHS)
    listed(torch.randn(8, 32)).sum().backward()
    assert not any("graphs are not recorded" in n for n in cudagraph_notes(listed))
    assert any("not recorded: input 0 is a cpu tensor" in n for n in cudagraph_notes(listed))


def test_an_unknown_role_is_refused_when_the_plan_loads():
    with pytest.raises(Exception, match="unknown role"):
        load_plan({"extends": "reduce-overhead", "options": {"cudagraphs": {"roles": ["training"]}}})


@needs_cuda
def test_training_steps_replayed_as_cuda_graphs_match_eager():
    """Forward and backward recorded once, replayed each step: losses and gradients of every step
    equal eager's from the same weights (the optimizer updates the weights in place between)."""
    eager_model, model = mlp().cuda().train(), mlp().cuda().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS)
    expected, got = train_steps(eager_model, eager_model, 4, "cuda"), train_steps(model, compiled, 4, "cuda")
    for (loss_e, grads_e), (loss, grads) in zip(expected, got):
        assert compare(loss_e, loss) is None
        for name in grads_e:
            assert compare(grads_e[name], grads[name]) is None, name
    records = [r for r in compilation_of(compiled).graphs if r.role in ("forward", "backward")]
    assert {r.role for r in records if r.cudagraphs} == {"forward", "backward"}


@needs_cuda
def test_dropout_in_a_replayed_training_step_draws_a_new_mask_each_step_and_its_backward_uses_it():
    """Under CUDA graphs the generator's offset advances per replay: every step drops a fresh set
    of elements (about p of them), and the gradient is zero exactly where the output was dropped
    and 1 / (1 - p) elsewhere, so the backward read the mask its own forward drew."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Dropout(0.25)).cuda().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS)
    masks = []
    for _ in range(4):
        x = (torch.rand(64, 256, device="cuda") + 1).requires_grad_()
        out = compiled(x)
        out.sum().backward()
        kept = out != 0
        assert torch.equal(x.grad != 0, kept)
        torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.75))
        assert abs(1 - kept.float().mean().item() - 0.25) < 0.03
        masks.append(kept)
    assert all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))
    records = [r for r in compilation_of(compiled).graphs if r.role in ("forward", "backward")]
    assert {r.role for r in records if r.cudagraphs} == {"forward", "backward"}


def test_a_static_buffer_keeps_the_padding_past_a_sliced_row():
    """A slice of a padded matmul result gets a static buffer whose storage also holds the padding
    after the last row (what a pitched kernel reads), with the slice's values and strides; a small
    slice of a large storage gets only its own span."""
    from passes.cudagraphs import static_buffer
    padded = torch.randn(6, 16)
    row = padded[:, :13]
    buffer = static_buffer(row)
    assert torch.equal(buffer, row) and buffer.stride() == row.stride()
    assert buffer.untyped_storage().nbytes() - buffer.storage_offset() * 4 >= \
        row.untyped_storage().nbytes() - row.storage_offset() * 4
    small = torch.randn(1000, 16)[2:4, :13]
    assert static_buffer(small).untyped_storage().nbytes() == (1 * 16 + 13) * 4


def saved_lending_notes(compiled) -> tuple[list[str], list[str]]:
    notes = cudagraph_notes(compiled)
    return ([n for n in notes if "saved output(s) lent" in n], [n for n in notes if "read in place" in n])


@needs_cuda
def test_a_training_forward_lends_its_saved_tensors_to_the_backward_without_copies():
    model = mlp().cuda().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS)
    for _ in range(3):
        model.zero_grad(set_to_none=True)       # else the backward's lent gradients are still held
        compiled(torch.randn(8, 32, device="cuda")).square().mean().backward()
    lent, read = saved_lending_notes(compiled)
    assert lent and read
    assert not any("without replaying" in n for n in cudagraph_notes(compiled))


def steps_match_eager(step, *, inputs: int, device: str = "cuda", plan: str = TRAINING_CUDAGRAPHS):
    """Three training steps ``step(f, xs)`` (gradients cleared before each) of eager and of the
    compiled MLP on the same ``inputs`` random batches per step: their gradients match. Returns
    the compiled model."""
    eager_model, model = mlp().to(device).train(), mlp().to(device).train()
    compiled = compile_with_plan(model, plan)
    for number in range(3):
        torch.manual_seed(number)
        xs = [torch.randn(8, 32, device=device) for _ in range(inputs)]
        for m, f in ((eager_model, eager_model), (model, compiled)):
            m.zero_grad(set_to_none=True)
            step(f, xs)
        for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
            assert compare(p.grad, q.grad) is None, (number, name)
    return compiled


def test_training_steps_match_eager_without_cuda_graphs_too():
    """The step comparison the CUDA-graph tests below use, on the CPU under the ``training`` plan:
    accumulated gradients and two forwards before one backward."""
    def accumulate(f, xs):
        for x in xs:
            f(x).square().mean().backward()
    steps_match_eager(accumulate, inputs=3, device="cpu", plan="training")
    steps_match_eager(lambda f, xs: (f(xs[0]).square().mean() + 2 * f(xs[1]).mean()).backward(),
                      inputs=2, device="cpu", plan="training")


@needs_cuda
def test_a_training_backward_lends_its_gradients_and_steps_match_eager():
    """The backward hands out its gradients in its recorded buffers (no clone launches); with
    zero_grad(set_to_none=True) between steps nothing holds them at the next replay."""
    eager_model, model = mlp().cuda().train(), mlp().cuda().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS)
    for (loss, grads), (ref_loss, ref_grads) in zip(train_steps(model, compiled, 4, "cuda"),
                                                    train_steps(eager_model, eager_model, 4, "cuda")):
        assert compare(ref_loss, loss) is None
        for name, grad in grads.items():
            assert compare(ref_grads[name], grad) is None, name
    notes = cudagraph_notes(compiled)
    assert any("gradient output(s) lent" in n for n in notes)
    assert not any("without replaying" in n for n in notes)


@needs_cuda
def test_gradients_accumulated_over_steps_are_not_overwritten_by_the_next_backward():
    """Two backwards into the same .grad before zero_grad: the second finds the gradients the
    first lent still held (accumulating into them), runs without replaying, and matches eager."""
    def step(f, xs):
        for x in xs:
            f(x).square().mean().backward()
    compiled = steps_match_eager(step, inputs=3)
    assert any("gradients this graph lent on its previous call are still referenced" in n
               for n in cudagraph_notes(compiled))


@needs_cuda
def test_two_forwards_before_one_backward_match_eager():
    """The second forward finds the first one's saved tensors still referenced, so it runs without
    replaying (into new memory); both backwards then read what their own forward saved."""
    compiled = steps_match_eager(lambda f, xs: (f(xs[0]).square().mean() + 2 * f(xs[1]).mean()).backward(),
                                 inputs=2)
    assert any("still referenced" in n for n in cudagraph_notes(compiled))


@needs_cuda
def test_a_graph_kept_for_a_second_backward_keeps_its_saved_tensors():
    """A loss kept with retain_graph is differentiated again after another step ran: its saved
    tensors were not overwritten by that step (which ran without replaying)."""
    eager_model, model = mlp().cuda().train(), mlp().cuda().train()
    compiled = compile_with_plan(model, TRAINING_CUDAGRAPHS)
    for step in range(3):
        torch.manual_seed(step)
        x, other = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
        for m, f in ((eager_model, eager_model), (model, compiled)):
            m.zero_grad(set_to_none=True)
            kept = f(x).square().mean()
            kept.backward(retain_graph=True)
            f(other).mean().backward()
            kept.backward()
        for (name, p), q in zip(eager_model.named_parameters(), model.parameters()):
            assert compare(p.grad, q.grad) is None, (step, name)
    assert any("still referenced" in n for n in cudagraph_notes(compiled))


@needs_cuda
def test_extra_warm_up_runs_do_not_apply_a_graphs_writes_twice():
    """A running average updated in place: with three warm-up runs before recording, the first
    call still updates it once, as eager does."""
    def f(average, x):
        average.mul_(0.9).add_(x.mean(0), alpha=0.1)
        return x - average

    compiled = compile_with_plan(f, "reduce-overhead", options={"cudagraphs": {"warmup_runs": 3}})
    ours, theirs = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    for _ in range(3):
        x = torch.randn(16, 8, device="cuda")
        assert compare(f(theirs, x), compiled(ours, x)) is None
        assert torch.allclose(ours, theirs)


def test_graphs_of_a_cudagraphs_plan_are_stored_in_the_cache_and_artifacts(tmp_path, monkeypatch):
    """What is stored is the graph and its recording policy; the runner rebuilt from the entry
    records again on its first call. On CPU the runner is made to wrap the graph and to run it
    eagerly instead of recording (the recording itself is tested on the GPU)."""
    import pipeline
    import passes.cudagraphs as cudagraphs
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    monkeypatch.setattr(cudagraphs, "static_skip_reason", lambda graph, context, roles: None)
    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_record", lambda self, args: self.graph(*args))
    overrides = {"cache": {"dir": str(tmp_path / "cache")}, "options": {"cudagraphs": {"clone_outputs": False}}}
    model, x = mlp(), torch.randn(8, 32)
    with torch.no_grad():
        first = compile_with_plan(model, "reduce-overhead", **overrides)
        assert compare(model(x), first(x)) is None
        cold = compilation_of(first).graphs[0]
        assert cold.cudagraphs and cold.cache["status"] == "miss" and cold.cache["stored"], cold.cache
        bundle = pipeline.save_artifacts(first, tmp_path / "bundle")
        second = compile_with_plan(mlp(), "reduce-overhead", **overrides)
        assert compare(model(x), second(x)) is None
    warm = compilation_of(second).graphs[0]
    assert warm.cache["status"] == "hit" and warm.passes == []
    assert warm.cudagraphs and "cudagraph_replay" in warm.final_code
    assert warm.kernels == cold.kernels > 0
    assert "1 compiled graph(s)" in pipeline.describe_artifacts(tmp_path / "bundle") and bundle.exists()
    assert pipeline.load_artifacts(tmp_path / "bundle", cache_dir=tmp_path / "replica")["entries"] == 1
    overrides["cache"] = {"dir": str(tmp_path / "replica")}
    with torch.no_grad():
        replica = compile_with_plan(mlp(), "reduce-overhead", **overrides)
        assert compare(model(x), replica(x)) is None
    assert compilation_of(replica).graphs[0].cache["status"] == "hit"


def _second_compile(tmp_path, monkeypatch, **options):
    """A reduce-overhead compile after another one filled the cache: (second model, its
    compilation), after three calls on fresh inputs that matched eager; its graph replays."""
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    overrides = {"cache": {"dir": str(tmp_path)}, **({"options": options} if options else {})}
    model, x = mlp().cuda(), torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        first = compile_with_plan(model, "reduce-overhead", **overrides)
        first(x)
        second = compile_with_plan(model, "reduce-overhead", **overrides)
        for _ in range(3):
            y = torch.randn(8, 32, device="cuda")
            assert compare(model(y), second(y)) is None
    record = compilation_of(second).graphs[0]
    assert record.cache["status"] == "hit" and record.cudagraphs
    assert not [n for n in cudagraph_notes(second) if n.startswith(("not recorded", "a call ran without"))]
    return second, compilation_of(second)


@needs_cuda
def test_a_runner_rebuilt_from_the_cache_records_and_replays(tmp_path, monkeypatch):
    _second_compile(tmp_path, monkeypatch)


@needs_cuda
def test_a_stored_capture_of_a_cudagraphs_plan_records_and_replays_without_tracing(tmp_path, monkeypatch):
    _, compilation = _second_compile(tmp_path, monkeypatch, capture={"precompile": True})
    assert compilation.captures == []      # nothing traced
    assert compilation.runtime["stored_captures"].counts()["stored_capture_hits"] == 3
