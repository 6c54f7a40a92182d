"""Building a distribution the way ``pip install .`` does, to see what its build backend warns
about: the plugin guide's example and the example plugins must build without warnings (a
setuptools warning such as "Package 'x.plans' is absent from the `packages` configuration"
announces files that a later setuptools leaves out)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

BUILD = r"""
import importlib, json, sys, warnings
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    system = tomllib.load(f).get("build-system")
if not system or "build-backend" not in system:
    print(json.dumps(["pyproject.toml has no [build-system] table naming a build-backend"]))
    sys.exit()
backend = importlib.import_module(system["build-backend"])
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    backend.build_wheel(sys.argv[1])
print(json.dumps([f"{w.category.__name__}: {' '.join(str(w.message).split())[:300]}" for w in seen]))
"""


NOT_COPIED = ("build", "dist", "*.egg-info", "__pycache__")


def build_wheel(source: Path, work: Path, *, skip: Sequence[str] = ()) -> tuple[Path | None, list[str]]:
    """Build a wheel of the distribution in ``source`` with the backend its ``pyproject.toml``
    names, from a copy in ``work`` without the names in ``skip`` (setuptools writes ``build/``
    next to the sources). Returns the wheel (None when the pyproject names no backend) and every
    warning the build raised (empty when clean)."""
    copy, dist = work / "build-src", work / "build-dist"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*NOT_COPIED, *skip))
    dist.mkdir()
    done = subprocess.run([sys.executable, "-c", BUILD, str(dist)], cwd=copy,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"building {source} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = sorted(dist.glob("*.whl"))
    return (wheels[0] if wheels else None), json.loads(done.stdout.strip().splitlines()[-1])


def build_warnings(source: Path, work: Path) -> list[str]:
    """Every warning building a wheel of the distribution in ``source`` raises (see :func:`build_wheel`)."""
    return build_wheel(source, work)[1]
