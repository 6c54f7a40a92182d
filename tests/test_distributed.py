"""Distributed training with compiled plans on CPU: two processes, the gloo backend, the
``training`` plan (docs/distributed.md). Each scenario runs two ranks of tests/distributed_worker.py
as separate processes under one deadline; a rank that is still running then is killed and the test
fails with what both ranks wrote, so a hang is a failure, never a stuck CI job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

WORKER = Path(__file__).with_name("distributed_worker.py")
WORLD = 2
DEADLINE_SECONDS = 90

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch build has no torch.distributed gloo backend")


def run_ranks(scenario: str, work: Path, *extra: str, cache: bool = False) -> list[dict]:
    """Start every rank of ``scenario``, wait for all of them under one deadline, and return
    their JSON results in rank order."""
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if cache:
        env.pop("PIPELINE_CACHE_GRAPHS", None)
    else:
        env["PIPELINE_CACHE_GRAPHS"] = "0"   # every compile runs its passes
    ranks = [subprocess.Popen([sys.executable, str(WORKER), scenario, "--rank", str(rank), "--world", str(WORLD),
                               "--work", str(work), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(WORLD)]
    deadline = time.monotonic() + DEADLINE_SECONDS
    outputs: list[tuple[str, str]] = []
    timed_out = []
    for rank, process in enumerate(ranks):
        try:
            outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            timed_out.append(rank)
            process.kill()
            outputs.append(process.communicate())
    if timed_out:
        for process in ranks:
            process.kill()
        pytest.fail(f"{scenario}: rank(s) {timed_out} still running after {DEADLINE_SECONDS} s (killed):\n"
                    + describe(outputs))
    results = []
    for rank, (process, (stdout, _)) in enumerate(zip(ranks, outputs)):
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            pytest.fail(f"{scenario}: rank {rank} exited with {process.returncode} and no result:\n"
                        + describe(outputs))
        result = json.loads(lines[-1])
        if "crashed" in result:
            pytest.fail(f"{scenario}: rank {rank} raised:\n{result['crashed']}")
        results.append(result)
    return results


def describe(outputs: list[tuple[str, str]]) -> str:
    return "\n".join(f"--- rank {rank} stdout:\n{out[-2000:]}\n--- rank {rank} stderr:\n{err[-3000:]}"
                     for rank, (out, err) in enumerate(outputs))


def assert_close_lists(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert abs(a - e) <= 1e-5 * max(1.0, abs(e)), (actual, expected)


def halves(result: dict) -> list[str]:
    """The forward and backward graphs of a compile (the joint graphs are recorded separately)."""
    return [g for g in result["graph_ids"] if not g.endswith(".joint")]


# -- DistributedDataParallel -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> list[dict]:
    return run_ranks("ddp", tmp_path_factory.mktemp("ddp"))


def test_compiled_ddp_training_matches_eager_ddp_on_every_rank(ddp):
    for rank in ddp:
        assert_close_lists(rank["buckets"]["losses"], rank["eager_losses"])
        assert rank["buckets"]["max_parameter_difference"] <= 1e-5
    assert ddp[0]["eager_losses"] != ddp[1]["eager_losses"], "each rank trains on its own data"


def test_ddp_buckets_split_the_captured_graph_into_several_compiled_graphs(ddp):
    for rank in ddp:
        assert rank["buckets"]["graph_count"] == 2, rank["buckets"]["graph_ids"]
        assert sorted(halves(rank["buckets"])) == ["g0.backward", "g0.forward", "g1.backward", "g1.forward"]


def test_without_dynamos_ddp_optimizer_the_model_is_one_graph_and_still_matches(ddp):
    for rank in ddp:
        assert rank["no_split"]["graph_count"] == 1, rank["no_split"]["graph_ids"]
        assert_close_lists(rank["no_split"]["losses"], rank["eager_losses"])
        assert rank["no_split"]["max_parameter_difference"] <= 1e-5


# -- FSDP2 -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory) -> list[dict]:
    return run_ranks("fsdp2", tmp_path_factory.mktemp("fsdp2"))


def test_fsdp2_blocks_compiled_as_regions_train_as_eager_fsdp2(fsdp2):
    for rank in fsdp2:
        assert_close_lists(rank["losses"], rank["eager_losses"])
        assert rank["max_parameter_difference"] <= 1e-5
        # One compiled graph for the six sharded layers (hooks eager, forward compiled), reused by
        # every later layer and every step (the unsharded parameters keep their identity between
        # steps), plus one for the first layer, whose input does not require gradients.
        assert rank["graph_count"] == 2, rank["graph_ids"]
        assert len(rank["recompiles"]) == 1 and "requires_grad mismatch" in rank["recompiles"][0]
        assert rank["graph_breaks"] == []


def test_fsdp2_model_compiled_whole_breaks_at_the_hooks_and_warns_with_the_regions_to_use(fsdp2):
    for rank in fsdp2:
        whole = rank["whole"]
        assert_close_lists(whole["losses"], rank["eager_losses"][:1])
        assert whole["graph_breaks"], "Dynamo breaks the graph at FSDP2's hooks"
        assert len(whole["warnings"]) == 1, whole["warnings"]
        assert "capture: {regions: ['Layer']}" in whole["warnings"][0]


# -- fleet start: rank 0 compiles, the others load its artifacts ------------------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> list[dict]:
    return run_ranks("fleet", tmp_path_factory.mktemp("fleet"), cache=True)


def test_a_rank_starting_from_rank_0s_artifacts_runs_no_pass_on_its_first_call(fleet):
    saved = fleet[0]["saved"]
    assert set(saved["statuses"].values()) == {"miss"}, saved["statuses"]
    other = fleet[1]
    # Per training graph: the joint graph's forward and backward split, and the compiled halves.
    assert other["loaded"]["entries"] == 2 * len(halves(saved))
    first = other["first_step"]
    assert first["graph_count"] == saved["graph_count"] == 2
    assert set(first["statuses"].values()) == {"hit"}, first["statuses"]
    assert all(passes == [] for passes in first["passes_run"].values()), first["passes_run"]


def test_ranks_that_start_from_artifacts_stay_in_step_with_rank_0(fleet):
    assert fleet[0]["parameter_sum"] == fleet[1]["parameter_sum"]


# -- one rank recompiles -----------------------------------------------------------------------------

def test_one_rank_recompiling_for_a_new_shape_keeps_training_in_step(tmp_path):
    ranks = run_ranks("recompile", tmp_path)
    assert ranks[0]["recompiles"] == []
    assert ranks[1]["graph_count"] == 2 * ranks[0]["graph_count"]
    assert any("expected 16, actual 8" in reason for reason in ranks[1]["recompiles"]), ranks[1]["recompiles"]
    for rank in ranks:
        assert "error" not in rank
        assert_close_lists(rank["losses"], rank["eager_losses"])
        assert rank["max_parameter_difference"] <= 1e-5


def test_a_refused_recompile_on_one_rank_fails_both_ranks_without_hanging(tmp_path):
    started = time.monotonic()
    ranks = run_ranks("recompile", tmp_path, "--stance", "fail_on_recompile", "--collective-timeout", "20")
    refused, waiting = ranks[1]["error"], ranks[0]["error"]
    assert refused["type"] == "RecompileError"
    assert "size mismatch at index 0. expected 16, actual 8" in refused["message"]
    # Rank 0 was in the backward's all-reduce, waiting for rank 1: its peer left, or the collective
    # timed out, and it raises instead of waiting.
    assert waiting["type"] in ("RuntimeError", "DistBackendError"), waiting
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == 2
    assert time.monotonic() - started < DEADLINE_SECONDS
