"""bench/sapo_regimes.py: the regimes file and its refusal, the budget plan, the per-cell summary, and a 2-round
2-node smoke of the grid on the warm tiny model (the exact JSON keys, the pilot reusing the grid's 8/0 cell, a cell
killed between rounds resuming)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.regimes_budget import grid_plan, solo_ds_factor
from bench.regimes_file import PATH, REGIMES, RegimeNotFixed, load_regimes, parse_regimes, require_fixed
from bench.regimes_summary import CELL_KEYS, best_ij, summarise_cell
from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.train import eval_stats

TINY_MIX = [{"name": "chain_sum", "options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}]


def test_the_committed_regimes_file_holds_candidates_and_the_grid_refuses_until_they_are_fixed() -> None:
    regimes = load_regimes(PATH)
    assert {"default", "harder"} <= set(regimes.candidates)
    assert regimes.candidates["harder"].config()["run"] == {"group_size": 8}
    assert [e["name"] for e in regimes.candidates["default"].config()["task"]["mix"]] == [
        "chain_sum", "basic_arithmetic", "gcd", "count_bits"]
    # the `default` candidate is the node's own default mix, option for option
    assert ([(e["name"], e["options"]) for e in regimes.candidates["default"].config()["task"]["mix"]]
            == [(e["name"], e["options"]) for e in tasks.DEFAULT_MIX])
    if regimes.fixed:  # once the lead fixed them, every fixed regime fits its bound
        require_fixed(regimes, list(regimes.fixed))
    with pytest.raises(RegimeNotFixed, match=r"regime 'hard' is not fixed .*--pilot.*needs >= 0.40"):
        require_fixed(parse_regimes({"candidates": {"hard": {"group_size": 8, "mix": TINY_MIX}}}), ["hard"])


def test_a_fixed_regime_must_fit_its_bound_and_name_a_candidate() -> None:
    candidates = {"a": {"group_size": 8, "mix": TINY_MIX}, "b": {"group_size": 16, "mix": TINY_MIX}}
    regimes = parse_regimes({"candidates": candidates, "fixed": {
        "hard": {"candidate": "a", "no_signal_frac_solo": 0.45, "pilot": "abc"},
        "medium": {"candidate": "b", "no_signal_frac_solo": 0.25}}})
    assert require_fixed(regimes, ["hard"])["hard"].candidate == "a"
    with pytest.raises(RegimeNotFixed, match=r"no_signal_frac_solo 0.250, but medium needs <= 0.20"):
        require_fixed(regimes, ["hard", "medium"])
    assert REGIMES["hard"].fits(0.40) and not REGIMES["hard"].fits(0.39) and REGIMES["medium"].fits(0.20)
    for fixed, message in (({"easy": {"candidate": "a", "no_signal_frac_solo": 0.1}}, "unknown regime"),
                           ({"hard": {"candidate": "c", "no_signal_frac_solo": 0.5}}, "candidate 'c' is not one"),
                           ({"hard": {"candidate": "a", "no_signal_frac_solo": 1.5}}, "in \\[0, 1\\]"),
                           ({"hard": {"candidate": "a", "no_signal_frac_solo": 0.5, "why": 1}}, "unknown key")):
        with pytest.raises(UserError, match=message):
            parse_regimes({"candidates": candidates, "fixed": fixed})
    with pytest.raises(UserError, match="group_size must be an integer >= 2"):
        parse_regimes({"candidates": {"a": {"group_size": 1, "mix": TINY_MIX}}})


def test_the_budget_cuts_rounds_first_not_below_150_then_the_medium_regime() -> None:
    cells = {"hard": dict.fromkeys("abcdefg", 1.0), "medium": dict.fromkeys("abcdef", 1.0)}  # 7 and 6 cells
    within = grid_plan(2.0, cells, seeds=3, nodes=4, rounds=200)  # 13 x 3 x 4 x 200 = 31,200 node-steps
    assert (within.rounds, within.regimes, within.node_steps, within.over_budget) == (200, ("hard", "medium"),
                                                                                      31200, False)
    assert within.hours == pytest.approx(31200 * 2.0 / 3600)
    cut = grid_plan(3.0, cells, seeds=3, nodes=4, rounds=200)  # 26 h as asked: 20 h / 0.13 h per round
    assert (cut.rounds, cut.regimes) == (153, ("hard", "medium")) and cut.asked_hours == pytest.approx(26.0)
    hard_only = grid_plan(4.0, cells, seeds=3, nodes=4, rounds=200)  # 115 rounds < 150: medium goes
    assert (hard_only.rounds, hard_only.regimes, hard_only.over_budget) == (200, ("hard",), False)
    over = grid_plan(10.0, cells, seeds=3, nodes=4, rounds=200)
    assert (over.rounds, over.regimes, over.over_budget) == (150, ("hard",), True)
    assert over.hours == pytest.approx(7 * 12 * 150 * 10.0 / 3600) and "OVER BUDGET" in over.line()
    assert [solo_ds_factor(f, 4) for f in (0.0, 0.5, 0.8, 1.0)] == [1.0, 2.0, 4.0, 4.0]


def _rows(used: list[int], external_signal: int = 0) -> list[dict[str, Any]]:
    """Two nodes x two rounds, 8 groups each, `used` with signal in (node, round) order; 10 tokens a step."""
    return [{"node": str(i // 2), "round": str(i % 2 + 1), "groups_total": "8", "groups_used": str(u),
             "external_signal": str(external_signal), "gen_tokens": "10"} for i, u in enumerate(used)]


def _cell(seed: int, cum: float, per_node: list[dict[str, float]]) -> dict[str, Any]:
    return {"seed": seed, "cum_reward": cum, "final_eval_outcomes_per_node": per_node}


def test_a_cell_summary_has_exactly_the_issue_fields_with_hand_computed_values() -> None:
    zero = {"q1": 0.0, "q2": 0.0}
    base = [_cell(0, 2.0, [zero, zero]), _cell(1, 4.0, [zero, zero])]
    cells = [_cell(0, 3.0, [{"q1": 1.0, "q2": 0.0}, {"q1": 1.0, "q2": 1.0, "q3": 1.0}]), _cell(1, 5.0, [zero, zero])]
    out = summarise_cell(cells, [_rows([8, 4, 6, 2], 3), _rows([0, 0, 8, 8], 1)], base)
    assert tuple(out) == CELL_KEYS
    assert out["no_signal_frac"] == pytest.approx((0 + 4 + 2 + 6 + 8 + 8 + 0 + 0) / 64)
    assert out["signal_groups_per_round"] == pytest.approx(((8 + 4 + 6 + 2) + 4 * 3 + (0 + 0 + 8 + 8) + 4 * 1) / 8)
    assert (out["cum_reward_mean"], out["cum_reward_std"], out["per_seed"]) == (4.0, pytest.approx(2 ** 0.5),
                                                                                [3.0, 5.0])
    # seed 0: q1 1.0, q2 0.5 (q3 is not every node's) -> 0.75; seed 1: 0.0
    assert out["heldout_acc_mean"] == pytest.approx(0.375)
    per_seed = [{"q1": 1.0, "q2": 0.5}, {"q1": 0.0, "q2": 0.0}]  # seeds, then questions, resampled
    assert out["heldout_ci95"] == list(eval_stats.seeds_then_questions(per_seed).ci95)
    # paired with 8/0 (every answer wrong) on the same questions: the differences are seed 0's outcomes
    assert out["heldout_vs_8_0_paired"] == {"diff": pytest.approx(0.375),
                                            "ci95": list(eval_stats.seeds_then_questions(per_seed).ci95)}
    assert out["local_tokens"] == pytest.approx(20.0)  # 2 steps x 10 tokens per node
    itself = summarise_cell(base, [_rows([8] * 4)] * 2, base)["heldout_vs_8_0_paired"]
    assert itself == {"diff": 0.0, "ci95": [0.0, 0.0]}
    assert summarise_cell([], [], base) == {**dict.fromkeys(CELL_KEYS), "per_seed": []}
    summary = {"8/0": {"cum_reward_mean": 50.0}, "4/4": {"cum_reward_mean": 60.0}, "2/6": {"cum_reward_mean": 55.0},
               "4/4-nofilter": {"cum_reward_mean": 90.0}}  # the ablation is no candidate for "best"
    assert best_ij(summary) == {"cell": "4/4", "gain_vs_8_0_pct": pytest.approx(20.0)}
    assert best_ij({"4/4": {"cum_reward_mean": 60.0}}) is None


def test_the_cells_of_each_regime_and_when_the_grid_is_complete() -> None:
    from bench.sapo_regimes import CELLS, complete, regime_cells

    assert regime_cells("medium") == ["8/0", "4/4", "2/6", "4/0", "2/0", "solo_ds"]
    assert regime_cells("hard") == [*regime_cells("medium"), "4/4-nofilter"]  # the ablation in hard only
    assert CELLS["solo_ds"] == {"share": {"local_groups": 8, "external_groups": 0},
                                "run": {"rollout": {"kind": "dynamic", "max_factor": 4}}}
    assert CELLS["4/4-nofilter"] == {"share": {"local_groups": 4, "external_groups": 4, "filter_no_signal": False}}
    hard = {"seeds_done": {c: [1, 0] for c in regime_cells("hard")}}
    assert complete({"hard": hard}, [0, 1]) is True
    assert complete({"hard": hard}, [0, 1, 2]) is False
    assert complete({"hard": {"seeds_done": {"8/0": [0, 1]}}}, [0, 1]) is False


# -- the harness on the warm tiny model ------------------------------------------------------------------------

BASE = """
[simulation]
nodes = 2
rounds = 2
seeds = [0]
mode = "sync"
eval_problems = 4
run_dir = "unused"
checkpoint_rounds = 1

[network]
latency_ms = 5.0
round_s = 1.0

[config.sampler]
kind = "hf"
max_new_tokens = 8

[config.train]
threads = 1
minibatches = 1

[config.share]
max_external_age = 2
"""


def _files(tmp_path: Path, fixed: bool = True) -> list[str]:
    (tmp_path / "base.toml").write_text(BASE)
    mix = ", ".join('{ name = "chain_sum", options = { min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 } }'
                    for _ in TINY_MIX)
    regimes = f"[candidates.tiny]\ngroup_size = 4\nmix = [{mix}]\n\n[fixed]\n"
    if fixed:
        regimes += 'hard = { candidate = "tiny", no_signal_frac_solo = 0.5 }\n'
    (tmp_path / "regimes.toml").write_text(regimes)
    return ["--file", str(tmp_path / "regimes.toml"), "--scenario", str(tmp_path / "base.toml"), "--rounds", "2",
            "--nodes", "2", "--seeds", "0", "--eval-problems", "4", "--run-dir", str(tmp_path / "runs"),
            "--out", str(tmp_path / "out" / "sapo_regimes.json")]


def test_the_grid_refuses_a_regime_the_file_has_not_fixed(tmp_path: Path) -> None:
    from bench.sapo_regimes import main

    with pytest.raises(SystemExit, match="regime 'hard' is not fixed"):
        main([*_files(tmp_path, fixed=False), "--regimes", "hard"])
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_two_cells_write_the_exact_keys_and_the_pilot_reuses_the_grids_8_0(warm_tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    from bench.sapo_regimes import main

    args = [*_files(tmp_path), "--set", f"model.path={warm_tiny_model_dir}"]
    main([*args, "--regimes", "hard", "--cells", "8/0", "4/4-nofilter"])
    result = json.loads((tmp_path / "out" / "sapo_regimes.json").read_text())
    assert (result["seeds"], result["nodes"], result["rounds"]) == ([0], 2, 2)
    assert result["complete"] is False  # two cells of hard's seven are not the grid
    hard = result["regimes"]["hard"]
    assert hard["no_signal_frac_solo"] == 0.5 and hard["candidate"] == "tiny" and hard["group_size"] == 4
    assert list(hard["cells"]) == ["8/0", "4/4-nofilter"]
    for cell in hard["cells"].values():
        assert tuple(cell) == CELL_KEYS and cell["per_seed"] and len(cell["heldout_ci95"]) == 2
        assert set(cell["heldout_vs_8_0_paired"]) == {"diff", "ci95"} and cell["local_tokens"] > 0
    assert hard["cells"]["8/0"]["heldout_vs_8_0_paired"] == {"diff": 0.0, "ci95": [0.0, 0.0]}
    cell_root = tmp_path / "runs" / "tiny"
    nofilter = json.loads((cell_root / "4-4-nofilter" / "seed0" / "result.json").read_text())
    assert "zero_advantage" not in nofilter["external_drops"]  # the filter is off: none refused for it
    for plot in ("gain", "hard"):  # gain against the no-signal fraction; reward against rounds and tokens
        assert (tmp_path / "out" / f"sapo_regimes_{plot}.png").exists()
    # the pilot's 8/0 on the first seed is the grid's cell: reused, so its fraction is the grid's
    main([*args, "--pilot", "--candidates", "tiny"])
    pilot = json.loads((tmp_path / "out" / "sapo_regimes_pilot.json").read_text())
    measured = pilot["candidates"]["tiny"]
    assert set(measured) == {"no_signal_frac_solo", "reward_mean", "final_eval_acc", "s_per_node_step",
                             "step_s_mean", "group_size", "seed"}
    assert measured["no_signal_frac_solo"] == hard["cells"]["8/0"]["no_signal_frac"]
    assert any(line.startswith("grid projection:") for line in pilot["lines"])


class Killed(Exception):
    """Stands for a kill of the session."""


def test_a_cell_killed_between_rounds_resumes_from_its_snapshot(warm_tiny_model_dir: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    import bench.sapo_mix as sapo_mix
    from bench.sapo_regimes import main

    args = [*_files(tmp_path), "--set", f"model.path={warm_tiny_model_dir}", "--regimes", "hard", "--cells", "8/0"]
    real = sapo_mix.run_cell

    def killed_after_round_1(*cell: Any, **kwargs: Any) -> dict[str, Any]:
        def on_round(_name: str, _seed: int, rnd: int, _total: int, _reward: float | None) -> None:
            if rnd == 1:
                raise Killed

        return real(*cell[:4], on_round, kwargs.get("log"))

    monkeypatch.setattr(sapo_mix, "run_cell", killed_after_round_1)
    with pytest.raises(Killed):
        main(args)
    progress = json.loads((tmp_path / "runs" / "tiny" / "8-0" / "seed0" / "progress.json").read_text())
    assert (progress["round"], progress["steps"]) == (1, [1, 1])
    monkeypatch.setattr(sapo_mix, "run_cell", real)
    capsys.readouterr()
    main(args)
    out = capsys.readouterr().out
    assert "resuming cell 8/0/seed0 from round 1" in out
    result = json.loads((tmp_path / "out" / "sapo_regimes.json").read_text())
    cell = result["regimes"]["hard"]["cells"]["8/0"]
    assert tuple(cell) == CELL_KEYS and len(cell["per_seed"]) == 1
    assert result["regimes"]["hard"]["seeds_done"] == {"8/0": [0]}
    rows = (tmp_path / "runs" / "tiny" / "8-0" / "seed0" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2  # header, then each (node, round) once


def test_signal_scan_counts_groups_whose_rewards_all_agree() -> None:
    from bench.signal_scan import group_stats

    # groups (1, 1), (0, 1), (0, 0), (1, 0): two without signal; mean reward 4 / 8 = 0.5; binomial 0.25 + 0.25
    assert group_stats([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]) == {
        "no_signal_frac": 0.5, "reward_mean": 0.5, "binomial_no_signal": 0.5}
    stats = group_stats([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])  # p = 5/6: (5/6)^3 + (1/6)^3
    assert stats["no_signal_frac"] == 0.5 and stats["binomial_no_signal"] == pytest.approx(126 / 216)
