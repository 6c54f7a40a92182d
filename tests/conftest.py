"""Shared fixtures.

``sample_plugin`` installs the third-party distribution in ``tests/plugins/pipeline_sample_plugin``
the way a user would (pip, a wheel with an entry point), but into a temporary ``--target`` folder
instead of the project's environment; ``miscompile_plugin`` does the same for the deliberately
broken ``tests/plugins/pipeline_miscompile_plugin``. Entry points are read from ``*.dist-info`` folders on
``sys.path``, so putting that folder on ``sys.path`` is all discovery needs.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import attrs
import pytest

import pipeline

PLUGINS_DIR = Path(__file__).parent / "plugins"

# Most tests observe the passes of a compile (times, notes, dumps, faults), and the same small models
# recur across tests: the compiled-graph cache would turn their later compiles into hits that run no
# pass. It is off for the suite; tests/test_cache.py, test_artifacts.py and test_regional.py turn it on.
os.environ.setdefault("PIPELINE_CACHE_GRAPHS", "0")


@pytest.fixture(autouse=True)
def _same_torch_seed_in_any_order() -> None:
    """Every test starts from torch's seed 0, so the inputs a test draws with ``torch.randn`` do not
    depend on which tests ran before it (a fresh clone once drew signed sums that cancelled past a
    comparison's tolerance). Input spaces are explored by the hypothesis tests instead."""
    import torch
    torch.manual_seed(0)


@attrs.frozen
class InstalledPlugin:
    """A distribution installed for the test session: where it lives and what it is called."""

    path: Path
    distribution: str
    version: str
    module: str


@contextlib.contextmanager
def installed_plugin(folder: str | Path, work: Path, *, distribution: str, version: str,
                     module: str) -> Iterator[InstalledPlugin]:
    """Install the distribution in ``tests/plugins/<folder>`` (or at the path ``folder``, such as
    ``examples/<name>``) into ``work`` with pip, put it on ``sys.path`` and reload the registry;
    undo all of it on exit."""
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = work / "src"
    shutil.copytree(PLUGINS_DIR / folder, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "--target", str(target), str(source)],
        capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"pip could not install {distribution}:\n{result.stdout}\n{result.stderr}")
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    pipeline.reload_registry()
    try:
        yield InstalledPlugin(path=target, distribution=distribution, version=version, module=module)
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m.split(".")[0] == module]:
            del sys.modules[name]
        importlib.invalidate_caches()
        pipeline.reload_registry()


@pytest.fixture(scope="session")
def sample_plugin(tmp_path_factory: pytest.TempPathFactory):
    """Install ``pipeline-sample-plugin`` 0.3.0 into a temporary folder, put it on ``sys.path`` and
    reload the registry; undo all of it at the end of the test run."""
    with installed_plugin("pipeline_sample_plugin", tmp_path_factory.mktemp("sample-plugin"),
                          distribution="pipeline-sample-plugin", version="0.3.0",
                          module="pipeline_sample_plugin") as plugin:
        yield plugin


@pytest.fixture(scope="module")
def miscompile_plugin(tmp_path_factory: pytest.TempPathFactory):
    """Install ``pipeline-miscompile-plugin`` 1.0.0 (passes that break divisions on purpose) for
    the tests of one module; uninstalled again after them."""
    with installed_plugin("pipeline_miscompile_plugin", tmp_path_factory.mktemp("miscompile-plugin"),
                          distribution="pipeline-miscompile-plugin", version="1.0.0",
                          module="pipeline_miscompile_plugin") as plugin:
        yield plugin


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters reset before and after the test (modules use it with
    ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cpp_kernels_made(monkeypatch) -> list:
    """A list that collects every C++ kernel ``codegen`` makes during the test."""
    import passes.codegen as codegen
    made: list = []
    original = codegen.Codegen.generate_cpp

    def recording(self, graph, context):
        out = original(self, graph, context)
        made.extend(n.target for n in out.graph.nodes if isinstance(n.target, codegen.CppKernel))
        return out

    monkeypatch.setattr(codegen.Codegen, "generate_cpp", recording)
    return made


def triton_interpreter_ready(request: pytest.FixtureRequest) -> bool:
    """For modules whose tests run Triton kernels under the interpreter: skip the test when
    ``TRITON_INTERPRET`` is set to something other than 1; return False (the test should run
    without setting anything up) for such a module's ``test_module_in_a_fresh_process`` when
    triton was already imported without the interpreter, which skips the module's other tests."""
    from passes.codegen.triton import runtime as triton_runtime
    if not triton_runtime.interpreting():
        pytest.skip("TRITON_INTERPRET is set to something other than 1 in the environment")
    if triton_runtime.interpreter_problem():
        if request.node.name != "test_module_in_a_fresh_process":
            pytest.skip("triton was imported in interpreter-less mode before this module: "
                        "test_module_in_a_fresh_process runs these tests in a new process")
        return False
    return True


def record_triton_graphs(monkeypatch: pytest.MonkeyPatch, seen) -> None:
    """Call ``seen(graph)`` with every graph the Triton branch of ``codegen`` produces (for the
    interpreter modules, which inspect the kernels it made)."""
    from passes.codegen.triton import generate as triton_generate
    original = triton_generate.generate

    def recording(graph, context, **kwargs):
        out = original(graph, context, **kwargs)
        seen(out)
        return out

    monkeypatch.setattr(triton_generate, "generate", recording)


def record_kernels(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, into: list,
                   keep) -> None:
    """The set-up of an interpreter module's autouse fixture: a fresh Dynamo and seed (sums of
    thousands of fp32 values: the same inputs in any test order), then, when the interpreter is
    usable, ``into`` refilled after every compile with the final graph's call targets that
    ``keep`` accepts."""
    import torch
    torch._dynamo.reset()
    torch.manual_seed(0)
    if not triton_interpreter_ready(request):
        return

    def seen(graph):
        into[:] = [n.target for n in graph.graph.nodes if keep(n.target)]

    record_triton_graphs(monkeypatch, seen)


def rerun_with_interpreter(module_file: str) -> None:
    """The body of an interpreter module's ``test_module_in_a_fresh_process``: only when something
    imported triton before the module could set ``TRITON_INTERPRET`` (the interpreter needs it at
    import time), run the module's tests again in a new process; else skip."""
    from passes.codegen.triton import runtime as triton_runtime
    if triton_runtime.interpreter_problem() is None:
        pytest.skip("the interpreter works in this process; the module's tests ran here")
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module_file],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
