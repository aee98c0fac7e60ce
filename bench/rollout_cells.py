"""The cells of bench/rollout_methods.py's parts: a cell is one run (a staleness lag x correction x seed, a selection
arm x seed, an april arm) kept in its own directory with a result.json written last, under a fingerprint of what
its result depends on; a finished cell with the same fingerprint is reused, any other runs again from its start.

- `fingerprint(size, overrides)`: the cell's size (a lag, a token budget, a wall time), its config (seed included),
  the default model's recipe and the code version (simulations/code_version.py);
- `finished(root, key)`: the stored result, or None; `fresh_cell(...)`: run and store one; `cell_log(name)`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulations.code_version import code_version
from swarm_node.config import load_config
from swarm_node.model.default_model import default_model_key

RESULT_FILE = "result.json"


def fingerprint(size: int, overrides: dict[str, Any]) -> str:
    """What a cell's result depends on: its size, its config (seed included), the default model and the code."""
    what = {"lag": size, "overrides": overrides, "default_model": default_model_key(), "code": code_version()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finished(root: Path, key: str) -> dict[str, Any] | None:
    path = root / RESULT_FILE
    if not path.exists():
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result if result.get("fingerprint") == key else None


def cell_log(name: str) -> Callable[[str], None]:
    return lambda line: print(f"  [{name}] {line}", flush=True)


def fresh_cell(root: Path, key: str, overrides: dict[str, Any], labels: dict[str, Any],
               run: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """Run a cell from its start in `root` (another fingerprint or a cut run is discarded) and store its result,
    labelled, with its fingerprint and overrides; the result file is written last, so a cell with one is complete."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    result = run(load_config(None, {**overrides, "run.run_dir": str(root / "run")}))
    result.update(**labels, fingerprint=key, overrides=overrides)
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(root / RESULT_FILE)
    return result
