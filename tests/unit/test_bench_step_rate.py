"""bench.step_rate's summary: the now/old ratio and each factor's ratio are medians of per-round ratios, the factor
arm (its factor at the old value) over today's arm; hand-computed values."""

from __future__ import annotations

from bench.step_rate import ARMS, Runs, summarize


def test_prompts_per_step_is_a_factor_with_the_old_value_of_16() -> None:
    assert ARMS["now_prompts16"].toml == "[run]\nprompts_per_step = 16\n"
    runs = Runs(rates={"solo": {"old": [40.0, 40.0, 50.0], "now": [30.0, 32.0, 25.0],
                                "now_prompts16": [45.0, 48.0, 50.0]}})
    out = summarize(runs)
    # now/old per round 0.75, 0.8, 0.5: median 0.75; now_prompts16/now 1.5, 1.5, 2.0: median 1.5
    assert out["ratio_now_over_then"] == {"solo": 0.75}
    assert out["factors"] == {"prompts_per_step": {"solo": 1.5}}
    assert out["factors_per_round"]["prompts_per_step"]["solo"] == [1.5, 1.5, 2.0]
