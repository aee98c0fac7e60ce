"""The `provenance` object every benchmark result carries: what code, on what machine, under what load.

`begin()` at a benchmark's start notes the command, the start date and the 1-minute load average (and, for a
benchmark that reports a time or a rate, applies the load guard, `bench/load_guard.py`); `stamp(result, run,
runs)` at the end returns the result with `provenance` = {commit, dirty (uncommitted changes outside
bench/results/), sources_fingerprint (sha256 over the repository modules the benchmark imported, read from
sys.modules now, plus the default model's recipe key and constraints.txt), sources (those modules, so
`python -m bench.report --stale` can recompute it), default_model_recipe, command, date (ISO-8601 UTC, at the
start), machine {cores, mem_gib, load_avg_start, load_avg_end}, runs, loaded}. `stamp_lines` does the same for
a .jsonl file: its first line is {"provenance": ...}, which readers skip.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load_guard import refuse_if_loaded
from simulations.code_version import CONSTRAINTS, REPO, files_fingerprint

RESULTS_DIR = "bench/results/"
LoadAvgFn = Callable[[], tuple[float, float, float]]


@dataclass(frozen=True)
class Run:
    """What is known when a benchmark starts."""

    command: str
    date: str
    load_avg_start: float
    loaded: bool


def begin(timed: bool = False, loaded: bool = False, load_avg: LoadAvgFn = os.getloadavg) -> Run:
    """`timed`: the benchmark reports a time or a rate, so it refuses a loaded machine unless `loaded`."""
    load = load_avg()[0]
    if timed:
        refuse_if_loaded(load, loaded)
    command = shlex.join([Path(sys.executable).name, *_invocation()])
    return Run(command, utc_now(), round(load, 2), loaded)


def stamp(result: dict[str, Any], run: Run, runs: int | None, child_sources: Iterable[str] = ()) -> dict[str, Any]:
    """The result with its provenance (replacing any older one); `child_sources`: modules that child processes
    imported and reported (`imported_sources()` there), measured too."""
    prov = provenance(run, runs, child_sources=child_sources)
    return {**{k: v for k, v in result.items() if k != "provenance"}, "provenance": prov}


def stamp_lines(lines: list[dict[str, Any]], run: Run, runs: int | None) -> list[dict[str, Any]]:
    """A .jsonl file's records under a first {"provenance": ...} line (an older one is dropped)."""
    return [{"provenance": provenance(run, runs)}, *(r for r in lines if "provenance" not in r)]


def head_commit(root: Path = REPO) -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    return _git(root, "rev-parse", "HEAD")


def provenance(run: Run, runs: int | None, root: Path = REPO, child_sources: Iterable[str] = ()) -> dict[str, Any]:
    recipe = recipe_key()
    sources = sorted({*imported_sources(root), *child_sources})
    return {
        "commit": head_commit(root),
        "dirty": dirty(root),
        "sources_fingerprint": sources_fingerprint(root, sources, recipe),
        "sources": sources,
        "default_model_recipe": recipe,
        "command": run.command,
        "date": run.date,
        "machine": {"cores": os.cpu_count(), "mem_gib": mem_gib(),
                    "load_avg_start": run.load_avg_start, "load_avg_end": round(os.getloadavg()[0], 2)},
        "runs": runs,
        "loaded": run.loaded,
    }


def sources_fingerprint(root: Path, sources: list[str], recipe: str) -> str:
    """What the measured code was: the modules' files, constraints.txt and the default model's recipe key."""
    return files_fingerprint(root, [*sources, CONSTRAINTS], extra=[f"default_model_recipe={recipe}"])


def imported_sources(root: Path = REPO) -> list[str]:
    """Repository-relative files of the modules imported now (the virtual environment excluded)."""
    found = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not os.path.isabs(file):  # some extension modules name a bare file
            continue
        path = Path(file).resolve()
        if path.is_relative_to(root) and ".venv" not in path.relative_to(root).parts:
            found.add(str(path.relative_to(root)))
    return sorted(found)


def recipe_key() -> str:
    from swarm_node.model.default_model import default_model_key  # heavy (torch): only when a result is written

    return default_model_key()


def dirty(root: Path = REPO) -> bool | None:
    """Uncommitted changes outside bench/results/ (None outside a git checkout)."""
    status = _git(root, "status", "--porcelain", strip=False)  # untracked files too: an untracked module counts
    if status is None:
        return None
    # each line is "XY path": two status columns (the first may be a space), a space, the path
    return any(not line[3:].startswith(RESULTS_DIR) for line in status.splitlines() if line.strip())


def mem_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _invocation() -> list[str]:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return list(sys.argv)


def _git(root: Path, *args: str, strip: bool = True) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if strip else done.stdout
