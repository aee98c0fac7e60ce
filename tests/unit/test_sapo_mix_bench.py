"""bench/sapo_mix.py's pure parts: the specialised arms' node mixes and the own-specialty accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.sapo_mix import OWN_SHARE, SCENARIO, own_specialty_acc, specialised_arms
from simulations.scenario import Variant, load_scenario


def test_specialised_nodes_draw_their_own_specialty_70_percent_and_accept_the_whole_mix(tmp_path: Path) -> None:
    scn = load_scenario(SCENARIO)
    nodes, generalists, own = specialised_arms(scn)
    names = ["chain_sum", "basic_arithmetic", "gcd", "count_bits"]
    assert own == names and generalists.nodes == scn.nodes and generalists.node_specs == ()
    for i in range(scn.nodes):
        task = nodes.node_config(Variant("swarm"), i, 0, tmp_path).task
        source = task.build_source()
        assert source.names == tuple(names) and task.selection == "weighted"
        # 0.7 + 0.3 / 4 for its own specialty, 0.3 / 4 for each other one: 77.5% of its draws are its own
        assert source.weights == pytest.approx([OWN_SHARE + 0.075 if n == own[i] else 0.075 for n in names])
        assert {name for name, _ in source.accepted} == set(names)  # learns every specialty from its peers


def test_own_specialty_accuracy_of_specialists_and_of_generalists() -> None:
    per_node = [{"a": 0.5, "b": 0.1}, {"a": 0.2, "b": 0.3}]
    cells = [{"final_eval_per_task_per_node": per_node}]
    assert own_specialty_acc(cells, ["a", "b"]) == pytest.approx((0.5 + 0.3) / 2)  # node i on own[i]
    assert own_specialty_acc(cells, ["a", "b"], generalist=True) == pytest.approx((0.5 + 0.1 + 0.2 + 0.3) / 4)
    assert own_specialty_acc([], ["a"]) is None


def test_a_grid_in_progress_reports_only_cells_finished_for_this_very_scenario(tmp_path: Path) -> None:
    """--finished-only runs nothing: a finished cell with this scenario's fingerprint counts, one from another
    scenario (another fingerprint) and one still running (no result file) do not."""
    import json

    from bench.sapo_mix import run_configs
    from simulations.results import RESULT_FILE
    from simulations.runner import cell_dir, cell_fingerprint

    scn = load_scenario(SCENARIO)
    variants = [Variant("8/0"), Variant("4/4")]
    mine = {"seed": 0, "cum_reward": 1.5, "fingerprint": cell_fingerprint(scn, variants[0])}
    cell_dir(tmp_path, "8/0", 0).mkdir(parents=True)
    (cell_dir(tmp_path, "8/0", 0) / RESULT_FILE).write_text(json.dumps(mine))
    cell_dir(tmp_path, "8/0", 1).mkdir(parents=True)
    (cell_dir(tmp_path, "8/0", 1) / RESULT_FILE).write_text(json.dumps({**mine, "seed": 1, "fingerprint": "other"}))
    cell_dir(tmp_path, "4/4", 0).mkdir(parents=True)  # in progress
    results = run_configs(scn, variants, tmp_path, None, finished_only=True)
    assert results == {"8/0": [mine], "4/4": []}


def test_sharing_gain_over_its_control_counts_only_seeds_both_finished() -> None:
    from bench.sapo_mix import sharing_gain_pct

    control = [{"seed": 1, "cum_reward": 60.0}, {"seed": 2, "cum_reward": 70.0}]
    sharing = [{"seed": 1, "cum_reward": 66.0}, {"seed": 3, "cum_reward": 80.0}]
    seeds, gain = sharing_gain_pct(control, sharing)
    assert seeds == [1] and gain == pytest.approx(10.0)  # 66 / 60 - 1; seeds 2 and 3 have no pair
    assert sharing_gain_pct(control, []) == ([], None)


def test_gains_over_8_0_beside_the_papers() -> None:
    from bench.sapo_paper import PAPER, add_gains_vs_8_0

    configs = {"8/0": {"cum_reward_mean": 50.0}, "4/4": {"cum_reward_mean": 55.0},
               "4/4+is": {"cum_reward_mean": None}}
    add_gains_vs_8_0(configs)
    assert configs["8/0"] == {"cum_reward_mean": 50.0, "gain_vs_8_0_pct": 0.0, "paper_cum_reward": 561.79,
                              "paper_gain_vs_8_0_pct": 0.0}
    assert configs["4/4"]["gain_vs_8_0_pct"] == pytest.approx(10.0)
    assert configs["4/4"]["paper_gain_vs_8_0_pct"] == pytest.approx(100 * (1093.31 / 561.79 - 1))
    assert configs["4/4+is"] == {"cum_reward_mean": None, "gain_vs_8_0_pct": None}  # not one of the paper's
    assert set(PAPER) == {"8/0", "6/2", "4/4", "2/6"}
