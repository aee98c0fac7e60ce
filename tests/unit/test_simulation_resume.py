"""Cells that resume mid-run: a cell killed after a snapshot continues from it and ends as if never interrupted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import simulations.memory_cell as memory_cell
from simulations.cells import SimNode, cell_dir
from simulations.runner import RESULT_FILE, read_rows, run_cell
from simulations.scenario import Scenario, parse_scenario
from simulations.snapshots import PROGRESS_FILE
from swarm_node.errors import UserError

ROUNDS, EVERY = 6, 2
# J = 0: the experience pools (not snapshotted) never reach training, so a resumed cell must match exactly.
SMALL = {"run": {"group_size": 4, "prompts_per_step": 4}, "sampler": {"kind": "hf", "max_new_tokens": 8},
         "train": {"threads": 1, "minibatches": 1}, "share": {"local_groups": 4, "external_groups": 0}}


class Killed(Exception):
    """Stands for a kill of the session."""


def _scenario(model: Path, mode: str, rounds: int = ROUNDS) -> Scenario:
    return parse_scenario({"simulation": {"nodes": 2, "rounds": rounds, "eval_problems": 0, "seeds": [0],
                                          "mode": mode, "checkpoint_rounds": EVERY},
                           "network": {"latency_ms": 5.0, "round_s": 1.0}, "config": SMALL,
                           "node": [{"index": i, "model": str(model)} for i in range(2)]}, "resume")


def _run(scn: Scenario, run_dir: Path, kill_at: int = 0, at_round: Any = None) -> dict[str, Any]:
    """run_cell, killed after round `kill_at` (0: never); what it returns, the rounds `on_round` saw, the log, and
    each node's (step, policy version) at the end."""
    built: list[list[SimNode]] = []
    seen: list[int] = []
    logs: list[str] = []

    def build(*args: Any, **kwargs: Any) -> list[SimNode]:
        built.append(real_build(*args, **kwargs))
        return built[-1]

    def on_round(_variant: str, _seed: int, rnd: int, _total: int, _reward: float | None) -> None:
        seen.append(rnd)
        if at_round is not None:
            at_round(rnd)
        if rnd == kill_at:
            raise Killed

    real_build = memory_cell.build_nodes
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(memory_cell, "build_nodes", build)
        try:
            result: dict[str, Any] | None = run_cell(scn, scn.variants[0], 0, run_dir, on_round, logs.append)
        except Killed:
            result = None
    return {"result": result, "rounds": seen, "log": logs,
            "nodes": [(n.node.step, n.node.version) for n in built[-1]]}


def _rows(scn: Scenario, run_dir: Path) -> list[dict[str, Any]]:
    return read_rows(cell_dir(run_dir, scn.variants[0].name, 0) / "metrics.csv")


LEARNT = ("reward_mean", "accuracy", "groups_used", "loss")  # what depends on the policy, not on the clock


@pytest.fixture(scope="module")
def uninterrupted(warm_tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for mode in ("sync", "async"):
        scn = _scenario(warm_tiny_model_dir, mode)
        run_dir = tmp_path_factory.mktemp(f"full-{mode}")
        out[mode] = {**_run(scn, run_dir), "rows": _rows(scn, run_dir)}
    return out


def _check_finished_like(full: dict[str, Any], got: dict[str, Any], rows: list[dict[str, Any]],
                         root: Path) -> None:
    pairs = [(r["node"], r["round"]) for r in rows]
    assert sorted(pairs, key=lambda p: (int(p[1]), int(p[0]))) == [(str(n), str(r)) for r in range(1, ROUNDS + 1)
                                                                   for n in range(2)]  # each (node, round) once
    assert got["nodes"] == full["nodes"]  # every node's (step, policy version)
    assert [step for step, _version in got["nodes"]] == [ROUNDS, ROUNDS]
    assert [{k: r[k] for k in ("node", "round", *LEARNT)} for r in rows] == [
        {k: r[k] for k in ("node", "round", *LEARNT)} for r in full["rows"]]  # exactly, row by row
    result, expected = got["result"], full["result"]
    assert list(result) == list(expected)  # result.json: the same keys in the same order
    assert {k: result[k] for k in ("cum_reward_per_node", "cum_reward", "rounds", "nodes", "fingerprint")} == {
        k: expected[k] for k in ("cum_reward_per_node", "cum_reward", "rounds", "nodes", "fingerprint")}
    assert json.loads((root / RESULT_FILE).read_text()) == result
    assert not (root / PROGRESS_FILE).exists() and not list(root.glob("node*/checkpoints"))  # snapshots cleared


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_cell_resumes_from_its_last_snapshot(warm_tiny_model_dir: Path, tmp_path: Path, mode: str,
                                                    uninterrupted: dict[str, Any]) -> None:
    """Killed during round 3 (snapshots after rounds 2, 4, 6): the next run resumes from round 2, redoes round 3
    and ends with the rows, steps, policy versions and rewards of a run that was never interrupted."""
    scn = _scenario(warm_tiny_model_dir, mode)
    root = cell_dir(tmp_path, scn.variants[0].name, 0)
    cut = _run(scn, tmp_path, kill_at=3)
    assert cut["result"] is None and not (root / RESULT_FILE).exists()
    progress = json.loads((root / PROGRESS_FILE).read_text())
    assert (progress["round"], progress["steps"], progress["rows"]) == (2, [2, 2], 4)
    resumed = _run(scn, tmp_path)
    assert "resuming cell default/seed0 from round 2" in resumed["log"]
    assert resumed["rounds"] == list(range(3, ROUNDS + 1))  # continues from R + 1
    assert resumed["result"]["wall_s"] >= progress["wall_s"]  # the sessions add up
    _check_finished_like(uninterrupted[mode], resumed, _rows(scn, tmp_path), root)


def test_kill_mid_snapshot_falls_back_to_the_previous_one(warm_tiny_model_dir: Path, tmp_path: Path,
                                                          uninterrupted: dict[str, Any]) -> None:
    """A kill after round 4's node checkpoints and metrics.csv but before its progress.json: the cell resumes
    from round 2 (the nodes' step-4 checkpoints are dropped, metrics.csv is cut back to round 2)."""
    scn = _scenario(warm_tiny_model_dir, "sync")
    root = cell_dir(tmp_path, scn.variants[0].name, 0)

    def keep_round_2(rnd: int) -> None:
        if rnd == 2:
            shutil.copy(root / PROGRESS_FILE, tmp_path / "progress-2.json")

    _run(scn, tmp_path, kill_at=4, at_round=keep_round_2)
    assert (root / "node1" / "checkpoints" / "step-00000004").is_dir() and len(_rows(scn, tmp_path)) == 8
    shutil.copy(tmp_path / "progress-2.json", root / PROGRESS_FILE)  # round 4's progress.json was never written
    resumed = _run(scn, tmp_path)
    assert "resuming cell default/seed0 from round 2" in resumed["log"]
    assert resumed["rounds"] == list(range(3, ROUNDS + 1))
    _check_finished_like(uninterrupted["sync"], resumed, _rows(scn, tmp_path), root)


def test_snapshot_of_another_scenario_is_not_resumed(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    scn = _scenario(warm_tiny_model_dir, "sync", rounds=3)
    _run(scn, tmp_path, kill_at=2)
    other = _scenario(warm_tiny_model_dir, "sync", rounds=4)  # another fingerprint
    again = _run(other, tmp_path)
    assert any("snapshot of a different scenario" in line for line in again["log"])
    assert again["rounds"] == [1, 2, 3, 4] and [step for step, _version in again["nodes"]] == [4, 4]
    assert [(r["node"], r["round"]) for r in _rows(other, tmp_path)] == [(str(n), str(r)) for r in range(1, 5)
                                                                         for n in range(2)]


def test_checkpoint_rounds_is_checked_and_not_in_the_fingerprint() -> None:
    from simulations.results import cell_fingerprint

    with pytest.raises(UserError, match=r"^simulation.checkpoint_rounds must be >= 0 \(0 = off\), got -1$"):
        parse_scenario({"simulation": {"checkpoint_rounds": -1}}, "t")
    a, b = (parse_scenario({"simulation": {"checkpoint_rounds": k}}, "t") for k in (0, 7))
    assert cell_fingerprint(a, a.variants[0]) == cell_fingerprint(b, b.variants[0])
