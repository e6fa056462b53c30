"""The package's layers (docs/architecture.md): what each folder of `trl_rpg` may import, the objective core's
torch-only rule, and no import circle between modules. Read from the source (every `import` statement, those inside
functions included), so a lazy import counts as much as a top-level one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_rpg"

#: Each room of the package and the rooms it may import (besides itself). Lower layers first.
ALLOWED: dict[str, set[str]] = {
    "objectives": set(),
    "_compat": set(),
    "rewards": set(),
    "run": {"_compat"},
    "evaluation": {"rewards"},
    "toy": {"_compat", "evaluation", "rewards"},
    "smollm2": {"evaluation", "rewards"},
    "dynamic_sampling": {"run"},
    "upgrade": {"run", "toy", "_compat"},
    "trainers": {"objectives", "run", "upgrade", "dynamic_sampling", "rewards", "_compat"},
    "cli": {"objectives", "run", "upgrade", "dynamic_sampling", "rewards", "_compat", "trainers", "evaluation", "toy",
            "smollm2", "__init__"},
    "__init__": {"objectives", "trainers"},
    "__main__": {"cli"},
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path, modules=()) -> set[str]:
    """The absolute names of what `path` imports (relative imports resolved); `from X import y` is X.y where that is
    one of `modules`, else X."""
    module = _module_name(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for p in root.rglob("*.py")}


def test_each_folder_imports_only_the_layers_below_it():
    modules = _modules(PACKAGE)
    problems = []
    for name, path in sorted(modules.items()):
        room = _room(name)
        assert room in ALLOWED, f"{room} (trl_rpg/{room}) is a new room: give it a place in ALLOWED and the docs"
        for target in imports(path, PACKAGE, modules):
            if target.startswith("trl_rpg") and target in modules:
                other = _room(target)
                if other != room and other not in ALLOWED[room]:
                    problems.append(f"{name} imports {target} ({room} may import {sorted(ALLOWED[room])})")
    assert not problems, "\n".join(problems)


def test_the_objective_core_imports_torch_only():
    allowed_roots = {"torch", "__future__", *sys.stdlib_module_names}
    problems = []
    for name, path in _modules(PACKAGE).items():
        if _room(name) != "objectives":
            continue
        for target in imports(path, PACKAGE):
            top = target.split(".")[0]
            if not (top in allowed_roots or target.startswith("trl_rpg.objectives")):
                problems.append(f"{name} imports {target}")
    assert not problems, "\n".join(problems)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("folder", ["trl_rpg", "benchmarks"])
def test_no_import_circle_between_modules(folder):
    root = ROOT / folder
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        targets = {t for t in imports(path, root, modules) if t in modules and t != name}
        # `from pkg import x` names pkg too: a package's own __init__ is not a dependency of its modules' circle
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    assert _cycles(graph) == []


def test_a_circle_is_found():
    # the check itself: a two-module circle and a three-module one are reported, a chain is not
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
