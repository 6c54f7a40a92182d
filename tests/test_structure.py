"""The layout the project keeps: an engine that knows no pass, no import cycles, an engine small
enough to read in an afternoon, results that are data, a short README, no self-references to
sessions in tracked files."""
from __future__ import annotations

import ast
import subprocess
from collections import defaultdict
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parent.parent
ENGINE_BUDGET = 3500            # lines of pipeline/*.py (the engine proper, subpackages apart)
README_LIMIT = 12000            # characters
# Imports the CLI makes inside its commands, so `pipeline --help` starts without loading torch.
LAZY_BY_DESIGN = {"pipeline.tools.cli"}


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("pipeline", "passes"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(modules: dict[str, Path]) -> tuple[dict, dict]:
    """(module-level, function-level) import edges between the project's modules."""
    top: dict = defaultdict(set)
    local: dict = defaultdict(set)
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text())

        def target(module: str) -> str | None:
            while module and module not in modules:
                module = module.rpartition(".")[0]
            return module or None

        def visit(node: ast.AST, at_top: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    found = [target(a.name) for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = name.split(".") if is_package else name.split(".")[:-1]
                        parts = parts[:len(parts) - (child.level - 1)]
                        base = ".".join(parts + ([child.module] if child.module else []))
                    found = [target(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else target(base)
                             for a in child.names]
                elif isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                    continue       # names for annotations only: never imported at run time
                else:
                    visit(child, at_top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
                    continue
                (top if at_top else local)[name].update(t for t in found if t and t != name)
        visit(tree, True)
    return top, local


def _cycles(edges: dict) -> list[list[str]]:
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found: list = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            strongconnect(v)
    return found


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return modules, *_imports(modules)


def test_no_import_cycles_even_through_function_level_imports(graph):
    modules, top, local = graph
    edges = {m: top[m] | (set() if m in LAZY_BY_DESIGN else local[m]) for m in modules}
    assert _cycles(edges) == []


def test_the_engine_imports_no_pass(graph):
    modules, top, local = graph
    wrong = sorted((m, t) for m in modules if m.startswith("pipeline")
                   for t in top[m] | local[m] if t.startswith("passes"))
    assert wrong == []


def test_function_level_imports_are_the_cli_only(graph):
    modules, top, local = graph
    hidden = sorted((m, t) for m in modules if m.startswith("pipeline") and m not in LAZY_BY_DESIGN
                    for t in local[m])
    assert hidden == []


def test_engine_fits_its_line_budget():
    lines = sum(len(p.read_text().splitlines()) for p in (REPO / "pipeline").glob("*.py"))
    assert lines <= ENGINE_BUDGET, f"the engine (pipeline/*.py) has {lines} lines, over {ENGINE_BUDGET}"


def test_engine_names_no_pass_concept():
    """Kernels, fused groups and CUDA graphs are the passes' concepts: the engine's record,
    expectations and report see them only as registered metrics."""
    words = ("count_kernels", "FusedGroup", "graph_contents", ".cudagraphs", "max_kernels")
    hits = [f"{p.name}:{i}: {line.strip()}" for p in (REPO / "pipeline").glob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if any(w in line for w in words) and "MOVED_MODULES" not in line and "passes.kernel_ir" not in line]
    assert hits == []


def test_kernel_ir_loop_nests_carry_no_backend_fields():
    from passes.kernel_ir.loops import LoopNest
    names = {f.name for f in attrs.fields(LoopNest)}
    assert not names & {"pitch", "aten_statistics"}, names


def test_old_import_paths_still_work():
    import pipeline
    import importlib
    for old, new in pipeline.MOVED_MODULES.items():
        assert importlib.import_module(old) is importlib.import_module(new), old


def _tracked() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [f for f in done.stdout.split() if (REPO / f).is_file()]


def test_results_hold_data_only():
    data = {".json", ".md", ".png", ".csv", ".txt"}
    scripts = [f for f in _tracked() if f.startswith("benchmarks/results/") and Path(f).suffix not in data]
    assert scripts == []


def test_readme_is_short():
    size = len((REPO / "README.md").read_text())
    assert size <= README_LIMIT, f"README.md has {size} characters, over {README_LIMIT}"


def test_no_tracked_file_speaks_of_sessions():
    import re
    pattern = re.compile(r"\bsessions?\b", re.IGNORECASE)
    allowed = re.compile(r'scope="session"|pytest session|test session|sessionstart|sessionfinish', re.IGNORECASE)
    hits = []
    for name in _tracked():
        if Path(name).suffix not in {".py", ".md", ".yaml", ".toml", ".txt", ".cfg"} and name != "Makefile":
            continue
        for i, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1):
            if pattern.search(line) and not allowed.search(line) and name != "tests/test_structure.py":
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert hits == []


def test_python_files_compile_without_warnings():
    """An invalid escape in a docstring is a SyntaxWarning at import (an error in a later Python)."""
    import warnings
    problems = []
    for name in _tracked():
        if not name.endswith(".py"):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile((REPO / name).read_text(), name, "exec")
        problems += [f"{name}:{w.lineno}: {w.message}" for w in caught]
    assert problems == []
