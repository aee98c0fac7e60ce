"""A cell's files: metrics.csv rows, result.json (written last: a cell with one is complete) and its fingerprint."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from simulations.scenario import Scenario, Variant
from swarm_node.model.default_model import DefaultModelRecipe

CSV_FIELDS = ["variant", "seed", "node", "round", "time_s", "reward_mean", "accuracy", "groups_used",
              "external_used", "external_reward_mean", "pool_size", "received", "dropped", "loss", "step_s"]
RESULT_FILE = "result.json"


def cell_fingerprint(scn: Scenario, variant: Variant) -> str:
    """What a cell's result depends on besides its seed: the scenario (less seeds and run dir), the variant and the
    embedded default model's recipe. A stored result with another fingerprint is run again, not reused."""
    what = {k: v for k, v in dataclasses.asdict(scn).items() if k not in ("seeds", "run_dir", "variants")}
    if scn.sampler == "per-node":
        del what["sampler"]  # the default: results stored before the option existed stay valid
    what.update(variant=dataclasses.asdict(variant), default_model=DefaultModelRecipe().key())
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finish_cell(root: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    write_csv(root / "metrics.csv", rows)
    done = root / RESULT_FILE
    tmp = root / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(done)
    return result



def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
