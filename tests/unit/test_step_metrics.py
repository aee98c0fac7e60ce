"""A step's completion-length percentiles and the share of its time spent generating, by hand."""

from __future__ import annotations

import pytest

from swarm_node.train.step_metrics import completion_metrics, percentile


def test_percentiles_interpolate_between_the_closest_ranks() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5  # rank 1.5 of [1, 2, 3, 4]
    assert percentile([4, 1, 3, 2], 95) == pytest.approx(3.85, abs=1e-12)  # rank 2.85: 3 + 0.85
    assert percentile([7], 95) == 7.0
    assert percentile([], 50) == 0.0
    assert percentile([10, 20, 30], 0) == 10.0 and percentile([10, 20, 30], 100) == 30.0


def test_completion_metrics_of_a_step() -> None:
    assert completion_metrics([10, 20, 30, 40, 50], gen_s=1.5, step_s=6.0) == {
        "completion_tokens_p50": 30.0, "completion_tokens_p95": 48.0, "gen_time_frac": 0.25}
    assert completion_metrics([7, 9], gen_s=2.0, step_s=3.0) == {
        "completion_tokens_p50": 8.0, "completion_tokens_p95": 8.9, "gen_time_frac": 0.6667}
    assert completion_metrics([], gen_s=0.0, step_s=0.0) == {
        "completion_tokens_p50": 0.0, "completion_tokens_p95": 0.0, "gen_time_frac": 0.0}
