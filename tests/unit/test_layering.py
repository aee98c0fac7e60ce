"""The architecture holds: import contracts (pyproject's [tool.importlinter]), no import cycle, small modules.

Imports inside functions and under TYPE_CHECKING count: grimp reads every import statement.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("swarm_node", "protocol", "cli", "simulations", "bench")
MAX_MODULE_LINES = 450
MAX_ROOT_MODULES = 12


def test_lint_imports_keeps_every_contract() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    kept = [line for line in proc.stdout.splitlines() if line.rstrip().endswith("KEPT")]
    assert len(kept) >= 4, proc.stdout


def strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's algorithm over module -> directly imported modules; components of two or more are cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    # A package's __init__ re-exporting its own modules is not a cycle between modules; count module files only.
    for package in [m for m in graph.modules if (REPO / m.replace(".", "/") / "__init__.py").exists()]:
        for child in graph.find_children(package):
            if graph.direct_import_exists(importer=package, imported=child):
                graph.remove_import(importer=package, imported=child)
    assert strongly_connected(graph) == []


def test_tarjan_finds_a_planted_cycle() -> None:
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert strongly_connected(graph) == [{"p.a", "p.b", "p.c"}]


def test_modules_are_small_and_the_root_is_a_map() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES} == {}
    root = sorted(p.name for p in (REPO / "swarm_node").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
