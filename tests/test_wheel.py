"""``pip install .`` gives a working project: the wheel built from this tree holds every subpackage
and plan file, and once it is installed into a fresh virtual environment away from the source tree,
``pipeline passes``, ``pipeline demo`` and a compile checked against eager work from it alone.

The wheel is built from a copy of the tree (setuptools writes ``build/`` next to the sources it
builds) with this environment's setuptools, so no network is needed. The fresh environment gets
the project only from the wheel (``pip install --no-deps``). Its dependencies (torch and the rest,
already installed for the suite) come from this interpreter's site-packages through a ``.pth``
file: a folder named in a ``.pth`` file joins ``sys.path`` without its own ``.pth`` files being
run, so the editable install of the project there stays inactive, and the fresh site-packages
comes first.
Installing torch into the environment instead would add about 45 s to CI for no extra coverage of
the wheel. Every command runs with its working directory outside the repository, and the smoke
test first checks that each package was imported from the fresh environment.

These tests are marked ``packaging`` (about 30 s on a 2-core machine; ``-m "not packaging"``
leaves them out).
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import attrs
import pytest

from build_checks import build_wheel

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "passes", "plans")
# Not part of the distribution, and large or changing while the suite runs.
NOT_COPIED = (".git", ".venv", ".hypothesis", ".pytest_cache", "pipeline-repro")

pytestmark = pytest.mark.packaging


@attrs.frozen
class FreshEnvironment:
    """A virtual environment holding the project only as installed from its wheel."""

    wheel: Path
    prefix: Path
    site_packages: Path
    workdir: Path      # outside the repository: the cwd of every command run there
    build_warnings: tuple[str, ...]

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.prefix / "bin" / "python"

    def run(self, *argv: str | os.PathLike, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a command of the environment (``python``, ``pipeline``) in ``workdir``."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONNOUSERSITE="1", PATH=f"{self.prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   PIPELINE_CACHE_DIR=str(self.workdir / "cache"), PIPELINE_REPRO_DIR=str(self.workdir / "repro"))
        return subprocess.run([str(a) for a in argv], cwd=self.workdir, env=env, capture_output=True,
                              text=True, timeout=timeout)


def dependency_folders() -> list[str]:
    """Where this interpreter finds the project's dependencies (its site-packages)."""
    folders = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    return list(dict.fromkeys(str(Path(f).resolve()) for f in folders if Path(f).is_dir()))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> FreshEnvironment:
    work = tmp_path_factory.mktemp("wheel")
    assert not work.resolve().is_relative_to(ROOT), "the temporary folder must lie outside the repository"
    wheel, warnings = build_wheel(ROOT, work, skip=NOT_COPIED)
    assert wheel is not None, warnings
    prefix = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site_packages = Path(subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    (site_packages / "suite_dependencies.pth").write_text("\n".join(dependency_folders()) + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install",
                           "--no-deps", "--no-index", "-q", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip install of {wheel.name} failed:\n{done.stdout}\n{done.stderr}"
    workdir = work / "elsewhere"
    workdir.mkdir()
    return FreshEnvironment(wheel=wheel, prefix=prefix, site_packages=site_packages, workdir=workdir,
                            build_warnings=tuple(warnings))


def source_files_the_wheel_needs() -> list[str]:
    """Every module of the three packages and every built-in plan file, relative to the root."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or (package == "plans" and path.suffix == ".yaml"):
                found.append(path.relative_to(ROOT).as_posix())
    return found


def test_wheel_builds_without_warnings(fresh):
    assert fresh.build_warnings == ()


def test_wheel_holds_every_module_of_every_subpackage_and_every_plan_file(fresh):
    names = set(zipfile.ZipFile(fresh.wheel).namelist())
    missing = [f for f in source_files_the_wheel_needs() if f not in names]
    assert missing == [], f"{fresh.wheel.name} lacks {missing}"
    assert "passes/codegen/__init__.py" in names and "plans/default.yaml" in names


SMOKE = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch

    import passes.codegen
    import pipeline
    import plans

    site = Path(sys.argv[1]).resolve()
    for module in (pipeline, passes.codegen, plans):
        assert Path(module.__file__).resolve().is_relative_to(site), f"{module.__name__} from {module.__file__}"
    dist = pipeline.get_registry().passes["codegen"].plugin
    print("builtin passes from", dist)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(64)
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            return torch.nn.functional.gelu(self.proj(self.norm(x))) + x

    torch.manual_seed(0)
    model = Block().eval()
    compiled = pipeline.compile_with_plan(model, "default")
    with torch.no_grad():
        for seed in (1, 2):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(compiled(x), model(x))
    record = pipeline.compilation_of(compiled).graphs[0]
    assert record.kernels >= 1, record
    print("compiled like eager with", record.kernels, "kernel(s)")
""")


def test_installed_wheel_compiles_a_model_like_eager_from_its_own_files(fresh):
    script = fresh.workdir / "smoke.py"
    script.write_text(SMOKE)
    done = fresh.run(fresh.python, script, fresh.site_packages)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "builtin passes from plan-pipeline 0.1.0 (passes)" in done.stdout
    assert "compiled like eager" in done.stdout


def test_installed_pipeline_passes_lists_the_builtin_passes(fresh):
    done = fresh.run(fresh.prefix / "bin" / "pipeline", "passes")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("capture", "fuse", "codegen"):
        assert f"\n{name}  (v" in "\n" + done.stdout, f"'{name}' missing from:\n{done.stdout}"


def test_installed_pipeline_demo_runs_and_matches_eager(fresh):
    done = fresh.run(fresh.prefix / "bin" / "pipeline", "demo", "--iterations", "10")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("correctness vs eager (fresh random inputs): OK") == 2, done.stdout
