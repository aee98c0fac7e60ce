"""The architecture holds: import contracts (pyproject's [tool.importlinter]), no import cycle, small modules,
and boundary types that cannot change under a component (frozen, no lists).

Imports inside functions and under TYPE_CHECKING count: grimp reads every import statement.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import grimp

from swarm_node import types as boundary

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("swarm_node", "protocol", "cli", "simulations", "bench")
MAX_MODULE_LINES = 400
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


def mutable_boundary_types(module: object) -> dict[str, str]:
    """Dataclasses of `module` that are not frozen or that hold a list (in a field's type or its value)."""
    found: dict[str, str] = {}
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__ or not dataclasses.is_dataclass(cls):  # type: ignore[attr-defined]
            continue
        if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            found[name] = "not frozen"
            continue
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "list[" in str(hints[f.name]).lower() or isinstance(f.default, list):
                found[name] = f"field {f.name} holds a list"
    return found


def test_boundary_types_are_frozen_and_hold_no_list() -> None:
    assert mutable_boundary_types(boundary) == {}


def test_the_boundary_check_finds_a_mutable_type() -> None:
    planted = type(sys)("planted")

    @dataclasses.dataclass
    class Loose:
        ids: tuple[int, ...]

    @dataclasses.dataclass(frozen=True)
    class Listy:
        ids: list[int]

    for cls in (Loose, Listy):
        cls.__module__ = "planted"
        setattr(planted, cls.__name__, cls)
    assert mutable_boundary_types(planted) == {"Loose": "not frozen", "Listy": "field ids holds a list"}


def test_a_boundary_value_given_lists_stores_tuples() -> None:
    c = boundary.Completion([1, 2], "x", [-0.5, -0.25], 0)
    assert c.token_ids == (1, 2) and c.logprobs == (-0.5, -0.25)
    sample = boundary.TrainSample([3], [4], [-1.0], 1.0, token_weights=[0.5])
    assert (sample.prompt_ids, sample.token_weights) == ((3,), (0.5,))
