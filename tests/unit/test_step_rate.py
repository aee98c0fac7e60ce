"""bench.step_rate's arithmetic: steps/min from a run's step times, the timing window of two joined nodes, and the
paired ratios over rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import step_rate


def test_rate_counts_steps_between_the_first_and_last_in_the_window() -> None:
    times = [(1, 0.0), (2, 10.0), (3, 12.0), (4, 20.0), (5, 30.0), (6, 40.0)]
    assert step_rate.solo_rate(times, skip=1) == pytest.approx(4 / 30 * 60)  # steps 2..6: 4 intervals in 30 s
    assert step_rate.rate_in(times, 11.0, 31.0) == pytest.approx(2 / 18 * 60)  # steps 3, 4, 5
    with pytest.raises(RuntimeError, match="raise --steps above --skip"):
        step_rate.solo_rate(times, skip=5)


def test_step_times_skip_non_steps_and_skipped_steps(tmp_path: Path) -> None:
    lines = [{"step": 1, "time": 5.0}, {"step": 2, "skipped": "non-finite", "time": 6.0}, {"event": "x"},
             {"step": 3, "time": 7.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    assert step_rate.step_times(tmp_path) == [(1, 5.0), (3, 7.5)]
    assert step_rate.step_times(tmp_path / "missing") == []


def test_summary_is_the_median_of_per_round_ratios() -> None:
    rounds = [{"solo": {"then": 40.0, "now": 20.0, "now+mix": 10.0, "now-microbatch": 22.0},
               "join": {"then": 50.0, "now": 25.0, "now+mix": 20.0, "now-budgets": 25.0}},
              {"solo": {"then": 30.0, "now": 24.0, "now+mix": 18.0, "now-microbatch": 24.0},
               "join": {"then": 40.0, "now": 40.0, "now+mix": 30.0, "now-budgets": 44.0}},
              {"solo": {"then": 36.0, "now": 24.0, "now+mix": 6.0, "now-microbatch": 12.0},
               "join": {"then": 50.0, "now": 30.0, "now+mix": 30.0, "now-budgets": 33.0}}]
    summary = step_rate.summarise(rounds)
    assert summary["ratio_now_over_then"] == {"solo": pytest.approx(2 / 3), "join": pytest.approx(0.6)}
    assert summary["factors"] == {"task_mix": pytest.approx(0.5), "microbatch_limits": pytest.approx(1.0),
                                  "validation_budgets": pytest.approx(1.1)}  # the join-only factor from join
    assert summary["factors_by_role"]["task_mix"]["join"] == pytest.approx(0.8)
