"""The example plugins in ``examples/`` are real third-party distributions: each installs with pip
(into a temporary ``--target`` folder, no network, as the ``sample_plugin`` fixture does), is found
through the ``pipeline.plugins`` entry point, registers its pass and its plan, and changes what a
compile produces when its plan is used. Their own hypothesis tests (``examples/*/tests``, written
with ``pipeline.testing``) run against the installed distributions, and their sources import only
the public API.
"""
from __future__ import annotations

import ast
import contextlib
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Iterator

import attrs
import pytest
import torch

import pipeline
from build_checks import build_warnings
from conftest import InstalledPlugin, installed_plugin

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "examples"
# What a plugin may import from this project (docs/plugin-guide.md, "The public API").
PUBLIC_MODULES = {"pipeline", "pipeline.testing", "passes.kernel_ir.groups", "passes.kernel_ir.rules", "pipeline.ir",
                  "pipeline.compat"}


@attrs.frozen
class Example:
    """One example distribution as its ``pyproject.toml`` declares it."""

    folder: Path
    distribution: str
    version: str
    module: str


def declared_examples() -> list[Example]:
    out = []
    for pyproject in sorted(EXAMPLES_DIR.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        (module,) = project["entry-points"]["pipeline.plugins"].values()
        out.append(Example(pyproject.parent, project["name"], project["version"], module))
    return out


EXAMPLES = declared_examples()
IDS = [e.distribution for e in EXAMPLES]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, InstalledPlugin]]:
    """Every example installed and on ``sys.path`` for this module's tests; removed after them."""
    with contextlib.ExitStack() as stack:
        yield {e.distribution: stack.enter_context(
            installed_plugin(e.folder, tmp_path_factory.mktemp(e.folder.name), distribution=e.distribution,
                             version=e.version, module=e.module)) for e in EXAMPLES}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_there_are_a_pattern_rewrite_and_a_backend_example():
    assert {"pipeline-reduction-rewrites", "pipeline-numpy-backend"} <= set(IDS)


# -- installed, discovered, registered -----------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_example_is_discovered_through_the_entry_point_with_its_passes_and_plans(installed, example):
    registry = pipeline.get_registry()
    (plugin,) = [p for p in registry.plugins if p.distribution == example.distribution]
    assert (plugin.version, plugin.module) == (example.version, example.module)
    assert Path(plugin.obj.__file__).is_relative_to(installed[example.distribution].path)
    assert [n for n, e in registry.passes.items() if e.plugin == plugin]
    assert [n for n, e in registry.plans.items() if e.plugin == plugin]


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_example_builds_without_warnings(example, tmp_path):
    assert build_warnings(example.folder, tmp_path) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_every_plan_an_example_ships_uses_one_of_its_passes(installed, example):
    registry = pipeline.get_registry()
    own = {n for n, e in registry.passes.items() if e.plugin.distribution == example.distribution}
    for name, entry in registry.plans.items():
        if entry.plugin.distribution == example.distribution:
            assert own & set(pipeline.load_plan(name).pass_names()), f"plan {name} uses none of {own}"


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_example_imports_only_the_public_api(example):
    for path in sorted(example.folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.split(".")[0] == "pipeline":
                    assert name in PUBLIC_MODULES, f"{path.relative_to(ROOT)} imports {name}"


# -- the plans change what a compile produces ----------------------------------------------------
def residual_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMS norm written with the 2-norm, after a residual add."""
    h = x + residual
    return h / (h.norm(dim=-1, keepdim=True) * h.shape[-1] ** -0.5 + 1e-6) * weight


def scaled_softmax(x: torch.Tensor) -> torch.Tensor:
    """Stable softmax written by hand with ``max(...).values``."""
    s = x * 0.125
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("fn, inputs, rule, default_kernels", [
    (residual_rms_norm, (torch.randn(8, 64), torch.randn(8, 64), torch.randn(64)), "vector-norm", 1),
    (scaled_softmax, (torch.randn(8, 64),), "max-values", 2),
], ids=["rms-norm", "softmax"])
def test_fusable_reductions_plan_makes_one_kernel(installed, fn, inputs, rule, default_kernels):
    """``max(...).values`` splits the default plan's kernel around an extern call, which the plugin's
    rewrite removes; a 2-norm the built-in fuser reduces itself (fuse 18), so there the rewrite
    changes the graph but not the kernel count."""
    kernels = {}
    for plan in ("default", "fusable-reductions"):
        compiled = pipeline.compile_with_plan(fn, plan)
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))
        record = pipeline.compilation_of(compiled).graphs[0]
        kernels[plan] = record.kernels
        rewrites = [n["message"] for n in record.notes if n["pass"] == "fusable-reductions"]
        assert rewrites == ([f"{rule}: rewrote 1 node(s)"] if plan == "fusable-reductions" else [])
    assert kernels == {"default": default_kernels, "fusable-reductions": 1}


class SoftmaxGate(torch.nn.Module):
    """A reduction group (softmax) and a separate pointwise group (sigmoid gate)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.softmax(x, dim=-1), torch.sigmoid(gate) * 3.0


@pytest.fixture
def numpy_calls(installed, monkeypatch) -> list:
    """The groups each numpy kernel call ran, in call order."""
    import numpy_backend
    calls: list = []
    original = numpy_backend.NumpyKernel.__call__

    def counting(self, *args):
        calls.append(self.group.kind)
        return original(self, *args)

    monkeypatch.setattr(numpy_backend.NumpyKernel, "__call__", counting)
    return calls


def test_numpy_reference_plan_runs_every_fused_group_through_numpy(numpy_calls):
    model, inputs = SoftmaxGate(), (torch.randn(4, 32), torch.randn(4, 32))
    compiled = pipeline.compile_with_plan(model, "numpy-reference")
    for got, want in zip(compiled(*inputs), model(*inputs)):
        torch.testing.assert_close(got, want)
    record = pipeline.compilation_of(compiled).graphs[0]
    assert record.kernels == 2
    assert record.verified.startswith("passed")
    assert set(numpy_calls) == {"pointwise", "reduction"}


def test_numpy_backend_can_take_the_reductions_and_leave_the_rest_to_codegen(numpy_calls):
    default = pipeline.load_plan("default")
    passes = []
    for spec in default.to_data()["passes"]:
        passes.append(spec)
        if (spec if isinstance(spec, str) else next(iter(spec))) == "fuse":
            passes.append({"numpy-backend": {"kinds": ["reduction"]}})
    model, inputs = SoftmaxGate(), (torch.randn(4, 32), torch.randn(4, 32))
    compiled = pipeline.compile_with_plan(model, {"name": "reductions-in-numpy", "passes": passes,
                                                  "target": "cpu"})
    for got, want in zip(compiled(*inputs), model(*inputs)):
        torch.testing.assert_close(got, want)
    record = pipeline.compilation_of(compiled).graphs[0]
    assert record.kernels == 2                # one numpy kernel, one C++ kernel
    assert numpy_calls == ["reduction"]


# -- the examples' own tests ---------------------------------------------------------------------
def test_examples_own_property_tests_pass_against_the_installed_distributions(installed, tmp_path):
    """Run ``examples/*/tests`` with pytest, as a plugin author would, in a fresh process that sees
    the installed distributions (not the source folders) and the project."""
    folders = []
    for example in EXAMPLES:
        folder = tmp_path / example.distribution
        shutil.copytree(example.folder / "tests", folder, ignore=shutil.ignore_patterns("__pycache__"))
        folders.append(str(folder))
    report = tmp_path / "junit.xml"
    env = dict(os.environ)
    env.pop("PIPELINE_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(p.path) for p in installed.values()] + [str(ROOT)])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junit-xml={report}", *folders], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    ran: dict[str, int] = {}
    for case in cases:
        (module,) = [part for part in case.get("classname", "").split(".") if part.startswith("test_")]
        ran[module] = ran.get(module, 0) + 1
    assert set(ran) == {"test_fusable_reductions", "test_numpy_backend"}, ran
