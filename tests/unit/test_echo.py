"""ECHO-2 learner and workers on a virtual clock: the bound S holds, workers follow the policy bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch import nn

from simulations.echo_sim import EchoSimConfig, dissemination_s, run_echo
from swarm_node import tasks
from swarm_node.echo.learner import Learner
from swarm_node.policy_sync.delta import state_hash
from swarm_node.status.stats import NodeStats
from swarm_node.types import WORKER, Completion, Draft, ScoredGroup


def test_updates_reach_workers_when_the_broadcast_model_says() -> None:
    # 8 MB to 4 workers at 10 MB/s over a chain of 1 MB chunks, no latency: the last one holds it after the 8 chunk
    # times of the floor plus one chunk time per hop behind the first.
    cfg = EchoSimConfig(bandwidth_mb_s=10.0, chunk_bytes=1_000_000, latency_s=0.0, schedule="chain")
    assert dissemination_s(8_000_000, 4, cfg) == pytest.approx([0.8, 0.9, 1.0, 1.1])


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
    from swarm_node.echo import worker as echo

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


def test_echo_scenario_runs_through_simulate(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    from simulations.runner import run_cell
    from simulations.scenario import parse_scenario

    scn = parse_scenario({"simulation": {"nodes": 3, "rounds": 3, "mode": "echo", "seeds": [0]},
                          "network": {"latency_ms": 5.0, "uplink_mbps": 100.0},
                          "config": {"run": {"prompts_per_step": 4, "group_size": 4}, "echo": {"encoding": "topk"}},
                          "variants": [{"name": "S1", "config": {"train": {"max_staleness": 1}}}],
                          "node": [{"index": i, "model": str(warm_tiny_model_dir)} for i in range(3)]}, "echo")
    result = run_cell(scn, scn.variants[0], 0, tmp_path)
    assert result["max_staleness"] == 1 and result["rounds"] == 3
    assert 0.0 < result["learner_utilization"] <= 1.0
    rows = (tmp_path / "S1" / "seed0" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3  # header + one row per learner step


def test_echo_scenario_needs_a_worker() -> None:
    from simulations.scenario import parse_scenario
    from swarm_node.errors import UserError

    with pytest.raises(UserError, match="nodes >= 2"):
        parse_scenario({"simulation": {"nodes": 1, "mode": "echo"}}, "echo")


def test_worker_cost_travels_as_a_status_capability() -> None:
    from swarm_node.echo.admission import reported_cost

    assert reported_cost(("sampler:vllm", "cost_per_hour:0.35")) == 0.35
    assert reported_cost(("sampler:hf",)) == 0.0
    assert reported_cost(("cost_per_hour:nan",)) == 0.0 and reported_cost(("cost_per_hour:-1",)) == 0.0
    assert reported_cost(("cost_per_hour:lots",)) == 0.0


def test_the_simulated_learner_publishes_as_configured(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    """Drift: echo_sim built its learner by hand and ignored `echo.publish_every` and `echo.keep_versions` (its
    workers read `publish_every`); every ECHO-2 learner is now built by the one assembly."""
    from simulations import echo_sim

    cfg = EchoSimConfig(steps=4, workers=2, max_staleness=1, prompts_per_step=4, group_size=4,
                        model_path=str(warm_tiny_model_dir), encoding="dense-bf16",
                        overrides={"task.reward": "score", "echo.publish_every": 2, "echo.keep_versions": 3})
    kept: list[int] = []
    real_learner = echo_sim.Assembly.learner

    def learner(self: echo_sim.Assembly) -> Any:
        built = real_learner(self)
        kept.append(built.publisher.keep)
        return built

    echo_sim.Assembly.learner = learner  # type: ignore[method-assign]
    try:
        result = run_echo(cfg, tmp_path)
    finally:
        echo_sim.Assembly.learner = real_learner  # type: ignore[method-assign]
    assert kept == [3]
    assert [m.get("published_version") for m in result.steps] == [None, 1, None, 2]  # every 2nd learner step


class _TrainingSide:
    """A learner's host with a tiny model; the test moves its version by hand."""

    def __init__(self) -> None:
        self.version = 0
        self.step = 0
        self.model = nn.Linear(2, 2)
        self.stats = NodeStats()

    def mix_and_train(self, item: Draft) -> dict[str, Any]:
        raise AssertionError("not used")


def _worker_group(*completions: Completion) -> ScoredGroup:
    inst = tasks.instance(tasks.TaskRef("chain_sum", "{}", 0, 7))
    return ScoredGroup(inst, (1, 2), completions, (1.0, 0.0), (1.0, -1.0), WORKER)


def test_the_learner_maps_every_span_and_buffers_a_group_by_its_oldest() -> None:
    host = _TrainingSide()
    learner = Learner(host, batch_groups=1, max_staleness=2, max_new_tokens=8, encoding="dense-bf16")
    for host.step, host.version in ((1, 3), (2, 5), (3, 5)):  # published v1 at learner v3, v2 and v3 both at v5
        learner.published({})
    assert learner.step_of_published == {0: 0, 1: 3, 2: 5, 3: 5}
    # A worker resumed a completion under published v1, v2 and v3 (APRIL); the other was sampled by v2 alone.
    resumed = Completion((1, 2, 3, 4), "", (-0.5,) * 4, 3, ((0, 1), (2, 2), (3, 3)))
    assert learner.admit(_worker_group(resumed, Completion((1, 2), "", (-0.5,) * 2, 2))) is None
    # v2 and v3 are one learner version: one span. Buffered under learner v3 (its oldest span), not v5 (its newest):
    # at v6 the group lags 3 > S = 2 by its oldest tokens and is not trainable, though its newest lag only 1.
    assert learner.buffer.available(5) == 1 and learner.buffer.available(6) == 0
    (taken,) = learner.buffer.take(1, 5)
    assert taken.version == 3
    assert [(c.version, c.spans) for c in taken.item.completions] == [(5, ((0, 3), (2, 5))), (5, ())]
    # A span of a version this learner never published (forgotten here: another lineage's) refuses the group, even
    # when its newest span is known.
    del learner.step_of_published[1]
    assert learner.offer([_worker_group(resumed, Completion((1, 2), "", (-0.5,) * 2, 2))]) == 1
    assert learner.admit(_worker_group(resumed, Completion((1, 2), "", (-0.5,) * 2, 2))) == "unknown_version"
    assert len(learner.buffer) == 0
