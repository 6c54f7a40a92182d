"""Portable artifacts: a bundle saved by one process loads in another, whose first call compiles
nothing; bundles made for other versions, or damaged, are refused before anything is copied."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pipeline import cache
from pipeline import ArtifactError, compile_with_plan, describe_artifacts, load_artifacts, save_artifacts
from pipeline.tools.cli import main

from test_cache import Small, run_worker, worker_result


@pytest.fixture(autouse=True)
def graph_cache_on(monkeypatch):
    monkeypatch.delenv("PIPELINE_CACHE_GRAPHS", raising=False)
    # Source fingerprints are taken once per process; the bundle's worker process hashed the
    # sources as they are now (in a checkout being edited, that can differ from this process's).
    cache._tree_hash.cache_clear()
    cache._file_hash.cache_clear()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A bundle of the two-block transformer, saved by a separate process."""
    work = tmp_path_factory.mktemp("artifacts")
    saved = worker_result(run_worker(work / "cache-a", "--save", str(work / "bundle")))
    assert saved["statuses"] == ["miss"]
    return work / "bundle"


def test_artifacts_saved_in_one_process_load_in_another_with_a_zero_compile_first_call(bundle, tmp_path):
    result = worker_result(run_worker(tmp_path / "fresh-cache", "--load", str(bundle)))
    assert result["loaded"]["entries"] == 1 and result["loaded"]["files"] >= 1
    assert result["statuses"] == ["hit"]
    assert result["passes_run"] == 0
    assert result["compile_seconds"] <= 1.0
    assert result["max_error"] < 1e-4


def copy_of(bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(bundle, target)
    return target


def test_a_version_mismatch_is_refused_with_what_differs(bundle, tmp_path):
    edited = copy_of(bundle, tmp_path)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["entries"][0]["environment"]["torch"] = "1.0.0"
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"torch: bundle has '1.0.0', this process has"):
        load_artifacts(edited, tmp_path / "cache")
    assert not (tmp_path / "cache").exists(), "nothing is copied from a refused bundle"


def test_another_device_is_refused(bundle, tmp_path):
    edited = copy_of(bundle, tmp_path)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["entries"][0]["environment"]["device"] = "cuda NVIDIA H200 sm_90"
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="device: bundle has 'cuda NVIDIA H200 sm_90'"):
        load_artifacts(edited, tmp_path / "cache")


def test_a_damaged_kernel_file_is_refused(bundle, tmp_path):
    edited = copy_of(bundle, tmp_path)
    library = next((edited / "files").rglob("*.so"))
    library.write_bytes(library.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="does not match its hash"):
        load_artifacts(edited, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_cli_shows_loads_and_saves_bundles(bundle, tmp_path, capsys):
    assert main(["artifacts", "show", str(bundle)]) == 0
    assert "1 compiled graph(s)" in capsys.readouterr().out
    assert main(["artifacts", "load", str(bundle), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "loaded 1 compiled graph(s)" in capsys.readouterr().out
    assert main(["artifacts", "save", str(tmp_path / "again"), "--cache-dir", str(tmp_path / "cache")]) == 0
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["entries"][0]["key"] == \
        json.loads((bundle / "manifest.json").read_text())["entries"][0]["key"]


def test_saving_a_model_that_never_compiled_says_why(tmp_path):
    compiled = compile_with_plan(Small().eval(), "default", cache={"dir": str(tmp_path)})
    with pytest.raises(ArtifactError, match="nothing to save"):
        save_artifacts(compiled, tmp_path / "bundle")


def test_a_model_saved_in_process_loads_into_another_cache(tmp_path):
    model = Small().eval()
    compiled = compile_with_plan(model, "default", cache={"dir": str(tmp_path / "a")})
    x = torch.randn(8, 32)
    with torch.no_grad():
        compiled(x)
    save_artifacts(compiled, tmp_path / "bundle")
    assert "loads here: yes" in describe_artifacts(tmp_path / "bundle")
    load_artifacts(tmp_path / "bundle", tmp_path / "b")
    assert len(list((tmp_path / "b").glob("graphs/*/*.entry"))) == 1
