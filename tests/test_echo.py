"""ECHO-2 learner and workers on a virtual clock: the bound S holds, workers follow the policy bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations.echo_sim import EchoSimConfig, dissemination_s, run_echo
from swarm_node.delta import state_hash


def test_dissemination_model_numbers() -> None:
    # 8 MB over 4 receivers at 10 MB/s, 1 MB chunks, 10 ms latency: 0.8 s floor + 3 chunk hops + 4 latencies.
    assert dissemination_s(8_000_000, 4, 10.0, 1_000_000, 0.01) == pytest.approx(0.8 + 0.3 + 0.04)


@pytest.mark.parametrize("staleness", [0, 1])
def test_learner_trains_only_within_the_bound(warm_tiny_model_dir: Path, tmp_path: Path, staleness: int) -> None:
    cfg = EchoSimConfig(steps=4, workers=2, max_staleness=staleness, prompts_per_step=4, group_size=4,
                        model_path=str(warm_tiny_model_dir), encoding="dense-bf16",
                        overrides={"task.reward": "score"})
    states = {}

    def on_step(m: dict) -> None:
        states[m["step"]] = m

    result = run_echo(cfg, tmp_path, on_step)
    lags = [m["lag"] for m in result.steps]
    assert [m["step"] for m in result.steps] == [1, 2, 3, 4]
    assert all(0 <= lag <= staleness for lag in lags)
    if staleness == 0:
        assert lags == [0, 0, 0, 0]
    else:
        assert max(lags) == 1  # batch 2 was generated on version 0 while the learner trained version 1
    assert all(m["published_version"] == m["step"] for m in result.steps)


def test_workers_reconstruct_the_published_policy_bit_for_bit(tiny_model_dir: Path, tmp_path: Path) -> None:
    from simulations import echo_sim
    from swarm_node import echo

    seen: list[tuple[str, str]] = []
    real_apply = echo.Worker.apply

    def apply(self: echo.Worker, update) -> None:  # type: ignore[no-untyped-def]
        real_apply(self, update)
        seen.append((state_hash(self.follower.published_state()), update.state_sha256))

    echo.Worker.apply = apply  # type: ignore[method-assign]
    try:
        echo_sim.run_echo(EchoSimConfig(steps=3, workers=2, max_staleness=1, prompts_per_step=4, group_size=4,
                                        model_path=str(tiny_model_dir), encoding="topk"), tmp_path)
    finally:
        echo.Worker.apply = real_apply  # type: ignore[method-assign]
    assert seen and all(ours == theirs for ours, theirs in seen)
