"""The fixed-lag harness (simulations/fixed_lag.py) on the tiny model: the batch trained at version v is sampled by
exactly version max(0, v - S), with that version's weights; and bench/rollout_methods.py's cells: reused when
finished on the same fingerprint, run again otherwise, gathered into the "staleness" part."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import april_arms, rollout_methods, rollout_selection
from simulations.fixed_lag import FixedLagSource
from swarm_node.config import load_config
from swarm_node.node.core import Node, NodeEvents
from swarm_node.node.sources import Item
from swarm_node.types import Draft


class Checked(FixedLagSource):
    """Also checks, at each draft, that the sampler holds the lagged version's weights; and gives every group
    advantages (the untrained tiny model scores 0 everywhere), so that every step trains."""

    def __init__(self, node: Node, lag: int) -> None:
        super().__init__(node, lag)
        self.differs_from_current: list[bool] = []

    def draft(self) -> Item:
        item = super().draft()
        _, sampler_version = self.sampled_by[-1]
        sampler = self.node.sampler
        assert sampler is not None and sampler.version == sampler_version
        held = sampler.model.state_dict()  # type: ignore[attr-defined]
        for name, value in self.snapshots[sampler_version].items():
            assert torch.equal(held[name].cpu(), value), name
        current = self.node.policy_weights()
        self.differs_from_current.append(any(not torch.equal(held[k].cpu(), v.cpu()) for k, v in current.items()))
        assert isinstance(item, Draft) and item.version == sampler_version
        signal = (1.0, -1.0, 0.5, -0.5)
        return dataclasses.replace(item, groups=tuple(dataclasses.replace(g, advantages=signal) for g in item.groups))


def test_the_batch_at_version_v_is_sampled_by_version_v_minus_s(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 5,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "train.warmup_steps": 0, "train.lr": 1e-2,
                             "train.stale_correction.kind": "m2po"})
    steps: list[dict[str, Any]] = []
    node = Node(cfg, events=NodeEvents(log=lambda _m: None, on_step=steps.append))
    node.setup()
    source = Checked(node, lag=2)
    try:
        node.run(source)
    finally:
        node.close()
    assert [m["policy_version"] for m in steps] == [1, 2, 3, 4, 5]  # every step trained
    assert source.sampled_by == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]
    assert [m["lag"] for m in steps] == [0, 1, 2, 2, 2]
    assert source.differs_from_current == [False, True, True, True, True]
    assert sorted(source.snapshots) == [2, 3, 4]  # at most S + 1 copies
    assert all("stale_masked_frac" in m for m in steps[1:]) and "stale_masked_frac" not in steps[0]
    with pytest.raises(ValueError, match="the lag must be >= 0"):
        FixedLagSource(node, -1)


class LastStepIdle(Checked):
    """Every step trains but the last, whose groups have no signal (it trains nothing)."""

    def __init__(self, node: Node, lag: int, steps: int) -> None:
        super().__init__(node, lag)
        self.steps = steps

    def draft(self) -> Item:
        item = super().draft()
        if len(self.sampled_by) < self.steps:
            return item
        assert isinstance(item, Draft)
        return dataclasses.replace(item, groups=tuple(dataclasses.replace(g, advantages=(0.0,) * 4)
                                                      for g in item.groups))


def test_the_final_eval_holds_the_current_policy_after_a_last_step_that_trained_nothing(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 4,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "train.warmup_steps": 0, "train.lr": 1e-2})
    steps: list[dict[str, Any]] = []
    node = Node(cfg, events=NodeEvents(log=lambda _m: None, on_step=steps.append))
    node.setup()
    source = LastStepIdle(node, lag=2, steps=4)
    try:
        node.run(source)
        assert [m.get("policy_version") for m in steps] == [1, 2, 3, 3]  # the last step trained nothing
        assert source.sampled_by[-1] == (3, 1)  # its draft loaded version 1
        sampler = node.sampler
        assert sampler is not None and sampler.version == 3  # the run's end put version 3 back
        held = sampler.model.state_dict()  # type: ignore[attr-defined]
        assert all(torch.equal(held[k].cpu(), v.cpu()) for k, v in node.policy_weights().items())
        source.draft()  # a draft loads the lagged version; an eval inside paused() sees the current one
        assert sampler.version == 1
        with source.paused():
            assert sampler.version == 3
    finally:
        node.close()


def _fake_cell(calls: list[tuple[int, str, int]]) -> Any:
    def run(cfg: Any, lag: int, log: Any = print) -> dict[str, Any]:
        calls.append((lag, cfg.train.stale_correction.kind, cfg.run.seed))
        acc = {"none": 0.25, "tis": 0.5}[cfg.train.stale_correction.kind] + cfg.run.seed / 8 - lag / 100
        return {"lag": lag, "steps": cfg.run.steps, "heldout_acc": acc, "heldout_acc_before": 0.0,
                "wall_s": 0.0}
    return run


def test_cells_are_reused_on_their_fingerprint_and_gathered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[int, str, int]] = []
    monkeypatch.setattr(rollout_methods, "run_fixed_lag_cell", _fake_cell(calls))
    args = argparse.Namespace(lags=[1, 4], corrections=["none", "tis"], seeds=[0, 2], steps=3, run_dir=tmp_path,
                              finished_only=False)
    part = rollout_methods.staleness(args, {})
    assert len(calls) == 8
    assert part["1"]["tis"]["per_seed"] == [0.49, 0.74]
    assert part["4"]["none"] == {"heldout_acc_mean": pytest.approx(0.335), "heldout_acc_std": pytest.approx(0.1767767),
                                 "per_seed": [0.21, 0.46], "seeds_done": [0, 2]}
    assert rollout_methods.staleness(args, {}) == part and len(calls) == 8  # every cell reused
    stored = json.loads((tmp_path / "staleness" / "S4" / "none" / "seed2" / "result.json").read_text())
    assert (stored["lag"], stored["correction"], stored["seed"]) == (4, "none", 2)
    assert stored["overrides"]["train.stale_correction.kind"] == "none"
    rollout_methods.staleness(args, {"train.lr": 1e-3})  # another config: another fingerprint, every cell runs again
    assert len(calls) == 16
    gathered = rollout_methods.staleness(argparse.Namespace(**{**vars(args), "finished_only": True,
                                                               "seeds": [0, 1, 2]}), {"train.lr": 1e-3})
    assert len(calls) == 16 and gathered["1"]["none"]["seeds_done"] == [0, 2]  # nothing run; seed 1 never was


def test_a_selection_cell_trains_up_to_its_token_budget(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    from simulations.selection_cell import run_selection_cell

    cfg = load_config(None, {"model.path": str(warm_tiny_model_dir), "sampler.kind": "hf", "run.steps": 50,
                             "run.prompts_per_step": 4, "run.group_size": 4, "run.eval_problems": 8,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "task.selection": "adaptive", "run.rollout_allocation": "dars",
                             "sampler.max_new_tokens": 8})
    result = run_selection_cell(cfg, 100, log=lambda _m: None)
    per_step = 4 * 4 * cfg.sampler.max_new_tokens  # the most one step can generate
    assert 100 <= result["gen_tokens"] < 100 + per_step and result["steps"] < 50
    assert result["groups"] == 4 * result["steps"]
    assert result["signal_frac"] == result["groups_with_signal"] / result["groups"]
    assert 0 < len(result["heldout_outcomes"]) <= 8 and result["heldout_acc"] is not None
    assert 0.0 <= result["cum_reward"] <= result["steps"]  # a mean reward in [0, 1] per step


def _fake_selection_cell(calls: list[tuple[str, str, int]]) -> Any:
    def run(cfg: Any, tokens: int, log: Any = print) -> dict[str, Any]:
        calls.append((cfg.task.selection, cfg.run.rollout_allocation, cfg.run.seed))
        adaptive = cfg.task.selection == "adaptive"
        right = {"q1": 1.0, "q2": float(adaptive), "q3": float(cfg.run.seed == 1), "q4": 0.0}
        return {"steps": 3, "gen_tokens": tokens + cfg.run.seed, "groups": 10, "groups_with_signal": 5 + 3 * adaptive,
                "signal_frac": (5 + 3 * adaptive) / 10, "cum_reward": 4.0, "heldout_acc": sum(right.values()) / 4,
                "heldout_outcomes": right, "wall_s": 0.0}
    return run


def test_the_selection_part_pairs_every_arm_with_uniform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, str, int]] = []
    monkeypatch.setattr(rollout_selection, "run_selection_cell", _fake_selection_cell(calls))
    args = argparse.Namespace(arms=["adaptive", "adaptive_dars"], seeds=[0, 1], tokens=1000, run_dir=tmp_path,
                              finished_only=False)
    part = rollout_selection.selection(args, {})
    assert calls == [("uniform", "fixed", 0), ("uniform", "fixed", 1), ("adaptive", "fixed", 0),
                     ("adaptive", "fixed", 1), ("adaptive", "dars", 0), ("adaptive", "dars", 1)]
    assert list(part) == ["uniform", "adaptive", "adaptive_dars"]
    uniform, adaptive = part["uniform"], part["adaptive"]
    assert (uniform["signal_frac"], adaptive["signal_frac"]) == (0.5, 0.8)
    assert (uniform["gen_tokens"], uniform["cum_reward"], uniform["seeds_done"]) == (1000.5, 4.0, [0, 1])
    assert uniform["heldout_acc"] == pytest.approx(0.375) and adaptive["heldout_acc"] == pytest.approx(0.625)
    assert "heldout_vs_uniform_paired" not in uniform
    assert adaptive["heldout_vs_uniform_paired"]["diff"] == pytest.approx(0.25)  # q2 right in every seed
    low, high = adaptive["heldout_vs_uniform_paired"]["ci95"]
    assert 0.0 <= low <= 0.25 <= high <= 1.0
    low, high = uniform["heldout_ci95"]
    assert 0.0 <= low <= 0.375 <= high <= 1.0
    assert rollout_selection.selection(args, {}) == part and len(calls) == 6  # every cell reused
    stored = json.loads((tmp_path / "selection" / "adaptive_dars" / "seed1" / "result.json").read_text())
    assert (stored["arm"], stored["seed"]) == ("adaptive_dars", 1)
    assert stored["overrides"]["run.rollout_allocation"] == "dars"


def test_the_swarm_arms_pair_with_uniform_and_adaptive_swarm_also_with_uniform_swarm(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, str, int]] = []
    monkeypatch.setattr(rollout_selection, "run_selection_cell", _fake_selection_cell(calls))
    rounds: list[tuple[str, int, int]] = []

    def fake_swarm(run_dir: Path, arm: str, seed: int, steps: int, external: int, extra: dict[str, Any],
                   finished_only: bool) -> dict[str, Any]:
        rounds.append((arm, seed, steps))
        right = {"q1": 1.0, "q2": 1.0, "q3": float(arm == "adaptive_swarm"), "q4": 0.0}
        return {"arm": arm, "seed": seed, "signal_frac": 0.5, "heldout_acc": sum(right.values()) / 4,
                "heldout_outcomes": right}

    monkeypatch.setattr(rollout_selection, "run_swarm", fake_swarm)
    args = argparse.Namespace(arms=["adaptive_swarm", "uniform_swarm"], seeds=[0, 1], tokens=1000,
                              run_dir=tmp_path, finished_only=False, swarm_external=4)
    part = rollout_selection.selection(args, {})
    assert list(part) == ["uniform", "adaptive_swarm", "uniform_swarm"]
    assert rounds == [("uniform_swarm", 0, 3), ("uniform_swarm", 1, 3), ("adaptive_swarm", 0, 3),
                      ("adaptive_swarm", 1, 3)]  # as many rounds as uniform's cells took steps
    # uniform gets q1 right in both seeds and q3 in seed 1; uniform_swarm q1, q2; adaptive_swarm q1, q2, q3
    assert "heldout_vs_uniform_swarm_paired" not in part["uniform_swarm"]
    assert part["uniform_swarm"]["heldout_vs_uniform_paired"]["diff"] == pytest.approx(0.125)
    assert part["adaptive_swarm"]["heldout_vs_uniform_paired"]["diff"] == pytest.approx(0.375)
    assert part["adaptive_swarm"]["heldout_vs_uniform_swarm_paired"]["diff"] == pytest.approx(0.25)


def test_a_swarm_cell_reads_as_a_selection_cell() -> None:
    rows = [{"node": "0", "gen_tokens": "100", "groups_total": "4", "groups_used": "1"},
            {"node": "1", "gen_tokens": "60", "groups_total": "4", "groups_used": "3"},
            {"node": "0", "gen_tokens": "40", "groups_total": "4", "groups_used": ""}]
    per_node = [{"q1": 1.0, "q2": 0.0, "q3": 1.0}, {"q1": 0.0, "q2": 0.0}]
    out = rollout_selection.swarm_summary("adaptive_swarm", 2, rows, {"rounds": 2, "cum_reward": 0.5,
                                                                      "final_eval_acc": 0.25}, per_node)
    assert out == {"arm": "adaptive_swarm", "seed": 2, "steps": 2, "gen_tokens": 100.0, "groups": 6.0,
                   "groups_with_signal": 2.0, "signal_frac": 4 / 12, "cum_reward": 0.5, "heldout_acc": 0.25,
                   "heldout_outcomes": {"q1": 0.5, "q2": 0.0}}


def test_the_swarm_arm_runs_four_adaptive_nodes_for_the_uniform_cells_steps(warm_tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    extra = {"model.path": str(warm_tiny_model_dir), "sampler.kind": "hf", "run.prompts_per_step": 2,
             "run.group_size": 4, "run.eval_problems": 4, "train.threads": 1}
    out = rollout_selection.run_swarm(tmp_path, "adaptive_swarm", 0, 2, 2, extra, finished_only=False)
    assert out is not None and (out["steps"], out["groups"]) == (2, 4.0)
    assert out["signal_frac"] == out["groups_with_signal"] / out["groups"] and out["gen_tokens"] > 0
    assert 0 < len(out["heldout_outcomes"]) <= 4 and out["heldout_acc"] is not None
    assert rollout_selection.run_swarm(tmp_path, "adaptive_swarm", 0, 2, 2, extra, finished_only=True) == out  # reused


def test_april_throughput_counts_trained_tokens_over_all_generation_time() -> None:
    assert april_arms.throughput([(100, 2.0), (50, 1.0)]) == 50.0
    assert april_arms.throughput([]) == 0.0


def test_april_length_percentiles_are_nearest_rank() -> None:
    lengths = [10] * 10 + [20] * 9 + [100]  # 20 completions: the 10th is the median, the 19th the 95th percentile
    assert april_arms.length_percentiles(lengths) == {"completion_len_p50": 10, "completion_len_p95": 20}
    assert april_arms.length_percentiles(lengths + [100]) == {"completion_len_p50": 20, "completion_len_p95": 100}
    assert april_arms.length_percentiles([]) == {"completion_len_p50": None, "completion_len_p95": None}
    assert april_arms.tail_ratio({"completion_len_p50": 10, "completion_len_p95": 45}) == 4.5
    assert april_arms.tail_ratio(None) is None


def test_april_summary_leaves_what_an_unfinished_arm_decides_unset() -> None:
    arm = {"throughput": 10.0, "heldout_acc": 0.5, "outcomes": {"q": 1.0}, "completion_len_p50": 10,
           "completion_len_p95": 50}
    out = april_arms.summarise({"sync": arm, "april": None}, {"sync": arm, "april": {**arm, "throughput": 12.0}})
    assert out["throughput_ratio_vs_sync"] is None and out["throughput_ratio_long_tail"] == 1.2
    assert out["heldout_at_equal_wall_time"] == {"sync": 0.5, "april": None, "paired_diff_ci95": None}
    assert out["p95_over_median"] == {"base": 5.0, "long_tail": 5.0}
    assert set(out["arms"]["base"]) == {"sync"}


def test_the_april_part_writes_its_keys(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path,
                                        tmp_path: Path) -> None:
    out = tmp_path / "rollout_methods.json"
    out.write_text(json.dumps({"staleness": {"1": {}}}))
    monkeypatch.setattr("sys.argv", [
        "rollout_methods", "--part", "april", "--max-steps", "1", "--wall-s", "600", "--run-dir",
        str(tmp_path / "runs"), "--out", str(out), "--loaded", "--long-tail-set", "sampler.max_new_tokens=12",
        "--set", f"model.path={tiny_model_dir}", "sampler.kind=hf", "run.prompts_per_step=2", "run.group_size=2",
        "run.eval_problems=3", "train.threads=1", "sampler.max_new_tokens=8"])
    rollout_methods.main()
    result = json.loads(out.read_text())
    assert result["staleness"] == {"1": {}}  # the other part is kept
    april = result["april"]
    assert isinstance(april["throughput_ratio_vs_sync"], float)
    assert isinstance(april["throughput_ratio_long_tail"], float)
    equal_wall = april["heldout_at_equal_wall_time"]
    assert set(equal_wall) == {"sync", "april", "paired_diff_ci95"} and len(equal_wall["paired_diff_ci95"]) == 2
    arms = april["arms"]
    assert {(s, m, arms[s][m]["mode"], arms[s][m]["steps"]) for s in arms for m in arms[s]} == {
        ("base", "sync", "sync", 1), ("base", "april", "april", 1), ("long_tail", "sync", "sync", 1),
        ("long_tail", "april", "april", 1)}
    assert arms["base"]["april"]["rollout_counts"]["carried_out"] >= 0
    assert all(arm["completion_len_p50"] <= arm["completion_len_p95"] <= 12 for a in arms.values()
               for arm in a.values())
    assert result["provenance"]["loaded"] is True
    # every arm is a cell: gathering again reuses all four (nothing runs, nothing changes)
    monkeypatch.setattr("sys.argv", [*sys.argv, "--finished-only"])
    rollout_methods.main()
    assert json.loads(out.read_text())["april"] == april
