"""Shared fixtures.

``sample_plugin`` installs the third-party distribution in ``tests/plugins/pipeline_sample_plugin``
the way a user would (pip, a wheel with an entry point), but into a temporary ``--target`` folder
instead of the project's environment. Entry points are read from ``*.dist-info`` folders on
``sys.path``, so putting that folder on ``sys.path`` is all discovery needs.
"""
from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import pipeline

PLUGINS_DIR = Path(__file__).parent / "plugins"


@attrs.frozen
class InstalledPlugin:
    """A distribution installed for the test session: where it lives and what it is called."""

    path: Path
    distribution: str
    version: str
    module: str


@pytest.fixture(scope="session")
def sample_plugin(tmp_path_factory: pytest.TempPathFactory):
    """Install ``pipeline-sample-plugin`` 0.3.0 into a temporary folder, put it on ``sys.path`` and
    reload the registry; undo all of it at the end of the session."""
    work = tmp_path_factory.mktemp("sample-plugin")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = work / "src"
    shutil.copytree(PLUGINS_DIR / "pipeline_sample_plugin", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "--target", str(target), str(source)],
        capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"pip could not install the sample plugin:\n{result.stdout}\n{result.stderr}")
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    pipeline.reload_registry()
    try:
        yield InstalledPlugin(path=target, distribution="pipeline-sample-plugin", version="0.3.0",
                              module="pipeline_sample_plugin")
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m.split(".")[0] == "pipeline_sample_plugin"]:
            del sys.modules[name]
        importlib.invalidate_caches()
        pipeline.reload_registry()
