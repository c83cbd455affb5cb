"""The shape of the code base: no import circles, a sealed engine.

These read the sources (and, for the boundary, import in a fresh interpreter), so they guard
structure the way the behaviour tests guard answers: a cycle or an app import slipped into the
engine fails here with the modules named, before it becomes the next round's refactor.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "specchat")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``module`` imports anywhere in its body (lazy imports count: they are edges too)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _graph(*, packages: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports; ``packages=False`` leaves the ``__init__`` modules out.

    A package's ``__init__`` importing its own submodules is how packages re-export; an edge from a
    submodule back to its package is then not a circle worth naming, so the cycle check leaves
    packages out (the boundary check keeps them: ``from specchat import x`` is an app import)."""
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    if packages:
        return graph
    inits = {name for name, path in modules.items() if path.name == "__init__.py"}
    return {name: deps - inits for name, deps in graph.items() if name not in inits}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_among_the_project_modules() -> None:
    cycles = _cycles(_graph(packages=False))
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_engine_never_imports_the_app() -> None:
    graph = _graph()
    leaks = sorted(f"{name} -> {dep}" for name, deps in graph.items() if name.startswith("engine")
                   for dep in deps if dep.startswith("specchat"))
    assert not leaks, "the engine imports the app: " + ", ".join(leaks)


@pytest.mark.parametrize("module", ["engine.session", "engine.api", "engine.train.trainer"])
def test_importing_the_engine_loads_neither_the_app_nor_textual(module: str) -> None:
    code = (f"import sys, {module}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('specchat', 'textual', 'rich')); "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import {module} loaded {out.stdout.strip()}"


def test_shipped_heads_record_no_machine_paths() -> None:
    """A head card says how it was trained, never where on the trainer's disk."""
    for config in sorted((ROOT / "assets").glob("*/config.json")):
        text = json.dumps(json.loads(config.read_text(encoding="utf-8")))
        for marker in ("/root/", "/home/", "/Users/", "/tmp/", "/work/"):
            assert marker not in text, f"{config.relative_to(ROOT)} records a local path ({marker})"


# the bench, its warm-up, tune and the calibration time the engine from outside it (issue 57)
MEASURERS = ("specchat/bench*.py", "specchat/llamacpp_peer.py", "specchat/tune.py", "specchat/gpu_bench.py",
             "engine/calibrate.py")


def _private_reads(source: str) -> list[str]:
    """Reads of another object's private attribute in ``source``: ``x._name`` (x not self or cls) and
    ``getattr(x, "_name")``; dunders are no one's private."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name, owner = None, None
        if isinstance(node, ast.Attribute):
            name, owner = node.attr, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            key = node.args[1] if len(node.args) > 1 else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                name, owner = key.value, node.args[0]
        if name is None or not name.startswith("_") or name.startswith("__"):
            continue
        if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_private_read_finder_finds_one() -> None:
    code = "session._cache.k\nmodel._static\ngetattr(s, '_budget')('x')\nself._own\nx.__class__\n"
    assert sorted(_private_reads(code)) == ["1: session._cache", "2: model._static", "3: getattr(s, '_budget')"]


def test_the_bench_and_the_calibration_reach_the_engine_through_its_public_api() -> None:
    """Once specchat/bench_warmup.py read ``session._cache``, ``session._capture`` and
    ``model._static``: a refactor of the session broke the bench, and the bench's timings depended
    on the session's insides. They use ``Session.reserve``, ``capture_graphs`` and
    ``graph_counts`` now; this keeps every module that times the engine on its public side."""
    paths = sorted({p for pattern in MEASURERS for p in ROOT.glob(pattern)})
    assert len(paths) >= 10
    reads = [f"{p.relative_to(ROOT)}:{r}" for p in paths for r in _private_reads(p.read_text(encoding="utf-8"))]
    assert not reads, "private reads: " + ", ".join(reads)
