"""Eval statistics: repeated questions count once, exact McNemar values, paired differences, intervals that carry
the noise of seeds and questions."""

from __future__ import annotations

import math

import pytest

from swarm_node.train import eval_stats


def test_a_repeated_question_counts_once_with_its_mean_score() -> None:
    assert eval_stats.per_question([("q1", 1.0), ("q1", 0.0), ("q2", 1.0)]) == {"q1": 0.5, "q2": 1.0}


def test_mcnemar_exact_values() -> None:
    a = {f"q{i}": 1.0 for i in range(8)} | {"q8": 0.0, "q9": 1.0, "q10": 0.0}
    b = {f"q{i}": 0.0 for i in range(8)} | {"q8": 1.0, "q9": 1.0, "q10": 0.0}
    # 9 discordant questions, 8 one way: 2 * (C(9,0) + C(9,1)) / 2^9
    assert eval_stats.mcnemar_p(a, b) == pytest.approx(2 * 10 / 512)
    assert eval_stats.mcnemar_p(a, a) == 1.0
    balanced = {"x": 1.0, "y": 0.0}
    assert eval_stats.mcnemar_p(balanced, {"x": 0.0, "y": 1.0}) == 1.0  # min(1, 2 * 3/4)
    with pytest.raises(ValueError, match="0/1 outcomes"):
        eval_stats.mcnemar_p({"x": 0.5}, {"x": 1.0})


def test_paired_difference_uses_only_common_questions() -> None:
    a = {"q1": 1.0, "q2": 1.0, "q3": 0.0}
    b = {"q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 1.0}
    est = eval_stats.paired_diff(a, b)
    assert est.mean == pytest.approx(1 / 3) and est.n == 3
    assert est.ci95[0] <= est.mean <= est.ci95[1]
    with pytest.raises(ValueError, match="share no question"):
        eval_stats.paired_diff({"x": 1.0}, {"y": 1.0})


def test_interval_of_a_proportion_has_the_normal_width() -> None:
    outcomes = {f"q{i}": float(i % 2) for i in range(400)}
    est = eval_stats.mean_ci95(outcomes)
    assert est.mean == 0.5 and est.n == 400
    half = (est.ci95[1] - est.ci95[0]) / 2
    assert half == pytest.approx(1.96 * math.sqrt(0.25 / 400), rel=0.1)
    assert eval_stats.mean_ci95(outcomes) == est  # deterministic for a seed
    assert eval_stats.mean_ci95({f"q{i}": 1.0 for i in range(50)}).ci95 == (1.0, 1.0)
    assert str(eval_stats.mean_ci95({"q": 0.25})) == "0.250 [0.250, 0.250]"


def test_seed_noise_widens_the_interval_beyond_question_noise() -> None:
    per_seed = [{f"q{i}": float(i % 10 < level) for i in range(200)} for level in (2, 5, 8)]
    est = eval_stats.seeds_then_questions(per_seed)
    assert est.mean == pytest.approx(0.5) and est.n == 3
    one_seed = eval_stats.mean_ci95(per_seed[1])
    assert est.ci95[1] - est.ci95[0] > 3 * (one_seed.ci95[1] - one_seed.ci95[0])
    same = eval_stats.seeds_then_questions([per_seed[1]] * 3)  # no seed noise: about the question interval
    assert same.ci95[1] - same.ci95[0] < 1.2 * (one_seed.ci95[1] - one_seed.ci95[0])
    with pytest.raises(ValueError, match="at least one question"):
        eval_stats.seeds_then_questions([per_seed[0], {}])


def test_gains_per_question_feed_the_seed_bootstrap() -> None:
    before = {"q1": 0.0, "q2": 1.0, "q3": 0.0, "q4": 0.0}
    after = {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0}
    gains = eval_stats.paired_values(after, before)
    assert gains == {"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 0.0}
    est = eval_stats.seeds_then_questions([gains, gains])
    assert est.mean == 0.5 and est.ci95[0] >= 0.0 and est.ci95[1] <= 1.0


def test_nodes_as_one_arm_average_each_question_they_all_answered() -> None:
    from swarm_node.train.eval_stats import mean_over_nodes

    # q3 was answered by the first node only: left out; q1 (1 + 0) / 2, q2 (1 + 1) / 2
    assert mean_over_nodes([{"q1": 1.0, "q2": 1.0, "q3": 0.0}, {"q1": 0.0, "q2": 1.0}]) == {"q1": 0.5, "q2": 1.0}
    assert mean_over_nodes([]) == {}
