"""A cell's files: metrics.csv rows, result.json (written last: a cell with one is complete) and its fingerprint.

metrics.csv is written atomically (a temporary file renamed into place), also by the mid-run snapshots
(snapshots.py); `read_rows` gives its strings, `typed_rows` the values a cell produced (None for an empty field).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from simulations.code_version import code_version
from simulations.scenario import Scenario, Variant
from swarm_node.model.default_model import default_model_key

CSV_FIELDS = ["variant", "seed", "node", "round", "time_s", "reward_mean", "accuracy", "groups_used",
              "external_used", "external_reward_mean", "pool_size", "received", "dropped", "loss", "step_s",
              "gen_tokens", "groups_total", "external_signal"]
RESULT_FILE = "result.json"
METRICS_CSV = "metrics.csv"
_NOT_IN_FINGERPRINT = ("seeds", "run_dir", "variants", "checkpoint_rounds")  # how often a cell snapshots: no result


def cell_fingerprint(scn: Scenario, variant: Variant) -> str:
    """What a cell's result depends on besides its seed: the scenario (less seeds and run dir), the variant, the
    embedded default model's recipe and the code (`code_version`: cells run on different code are never pooled).
    A stored result with another fingerprint is run again, not reused."""
    what = {k: v for k, v in dataclasses.asdict(scn).items() if k not in _NOT_IN_FINGERPRINT}
    if scn.sampler == "per-node":
        del what["sampler"]  # the default: results stored before the option existed stay valid
    if not scn.attackers:
        del what["attackers"]  # likewise (mode "attack" only)
    what.update(variant=dataclasses.asdict(variant), default_model=default_model_key(), code=code_version())
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finish_cell(root: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    write_csv(root / METRICS_CSV, rows)
    done = root / RESULT_FILE
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(done)
    return result



def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomically: a kill leaves the previous file or the new one, never a cut one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def typed_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.csv as the cell's rows were: ints, floats (repr round-trips exactly), None for "", the variant a str.
    Written again by `write_csv`, they give the same text."""
    return [{k: v if k == "variant" else _value(v) for k, v in r.items()} for r in read_rows(path)]


def _value(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
