"""The attack cell (simulations/attack_cell.py): honest nodes beside attackers, what reached their loss, and a cell
that resumes mid-run like any memory cell."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from simulations.cells import cell_dir
from simulations.runner import run_cell
from simulations.scenario import Scenario, parse_scenario

SMALL = {"run": {"group_size": 4, "prompts_per_step": 2}, "sampler": {"kind": "hf", "max_new_tokens": 8},
         "train": {"threads": 1, "minibatches": 1}, "share": {"local_groups": 2, "external_groups": 2}}


class Killed(Exception):
    """Stands for a kill of the session."""


def scenario(model: Path, attackers: list[dict[str, Any]], nodes: int, rounds: int, share: dict[str, Any],
             eval_problems: int = 0) -> Scenario:
    honest = [i for i in range(nodes) if i not in {a["index"] for a in attackers}]
    return parse_scenario({"simulation": {"nodes": nodes, "rounds": rounds, "eval_problems": eval_problems,
                                          "mode": "attack", "checkpoint_rounds": 2},
                           "network": {"latency_ms": 5.0, "round_s": 1.0},
                           "config": {**SMALL, "share": share}, "attacker": attackers,
                           "node": [{"index": i, "model": str(model)} for i in honest]}, "attack")


def test_honest_nodes_train_on_each_other_and_never_on_attackers(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    scn = scenario(warm_tiny_model_dir, [{"index": 2, "kind": "forged_reward"}, {"index": 3, "kind": "sybil"},
                                         {"index": 4, "kind": "replay"}], 5, 4,
                   {"local_groups": 2, "external_groups": 2}, eval_problems=4)
    result = run_cell(scn, scn.variants[0], 0, tmp_path)
    assert result["honest"] == [0, 1] and result["attackers"] == {"2": "forged_reward", "3": "sybil", "4": "replay"}
    assert result["bad_groups_trained"] == {"forged_reward": 0, "replay": 0, "sybil": 0}
    assert sorted(result["final_eval_acc_per_node"]) == ["0", "1"]
    assert len(result["rounds_to_block"]["sybil"]) == 2  # node3s0 (rounds 0-1), node3s1 (rounds 2-3)
    drops = result["external_drops"]
    # re-scored; replays are caught by their content (a copy of ours, of the other node's, or a copycat's)
    assert drops["forged_reward"] >= 1 and sum(drops.get(r, 0) for r in ("duplicate", "copied", "copycat")) >= 1
    with open(cell_dir(tmp_path, scn.variants[0].name, 0) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted({r["node"] for r in rows}) == ["0", "1"] and len(rows) == 8  # honest nodes' rows only


LEARNT = ("reward_mean", "accuracy", "groups_used", "loss")


def _run(scn: Scenario, run_dir: Path, kill_at: int = 0) -> tuple[dict[str, Any] | None, list[str]]:
    logs: list[str] = []

    def on_round(_variant: str, _seed: int, rnd: int, _total: int, _reward: float | None) -> None:
        if rnd == kill_at:
            raise Killed

    try:
        return run_cell(scn, scn.variants[0], 0, run_dir, on_round, logs.append), logs
    except Killed:
        return None, logs


def test_an_attack_cell_resumes_from_its_snapshot_as_if_never_interrupted(tmp_path: Path,
                                                                          warm_tiny_model_dir: Path) -> None:
    # J = 0: the pools (not snapshotted) never reach training, so the resumed cell must match exactly.
    scn = scenario(warm_tiny_model_dir, [{"index": 2, "kind": "junk"}], 3, 4, {"local_groups": 2,
                                                                              "external_groups": 0})
    full, _ = _run(scn, tmp_path / "full")
    killed, _ = _run(scn, tmp_path / "cut", kill_at=3)  # snapshots at rounds 2 and 4: round 3 is lost
    assert killed is None
    resumed, logs = _run(scn, tmp_path / "cut")
    assert "resuming cell default/seed0 from round 2" in logs
    assert resumed is not None and full is not None
    assert {k: resumed[k] for k in ("honest", "attackers", "bad_groups_trained", "cum_reward_per_node")} == \
        {k: full[k] for k in ("honest", "attackers", "bad_groups_trained", "cum_reward_per_node")}

    def learnt(root: Path) -> list[tuple[str, ...]]:
        with open(cell_dir(root, "default", 0) / "metrics.csv") as f:
            return [tuple(r[k] for k in ("node", "round", *LEARNT)) for r in csv.DictReader(f)]
    assert learnt(tmp_path / "cut") == learnt(tmp_path / "full")


def test_mode_attack_needs_the_memory_transport(tmp_path: Path, warm_tiny_model_dir: Path) -> None:
    from simulations.attack_cell import attack_cell
    from swarm_node.errors import UserError

    scn = scenario(warm_tiny_model_dir, [], 2, 1, {})
    with pytest.raises(UserError, match="mode 'attack' runs over transport 'memory' with sampler 'per-node'"):
        attack_cell(scn.__class__(**{**scn.__dict__, "sampler": "shared-lora"}), scn.variants[0], 0, tmp_path,
                    None, print)
