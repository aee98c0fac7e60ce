"""Dynamic sampling for a node alone (`[run.rollout] kind = "dynamic"`): rounds until I groups have signal, the
max_factor x I cap, every generated group and token counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm_node.config import DynamicRolloutConfig, load_config
from swarm_node.errors import ConfigError
from swarm_node.node.core import Node, NodeEvents
from swarm_node.sampler.base import SamplingParams
from swarm_node.tasks import TaskInstance
from swarm_node.train.dynamic_sampling import next_count, sample_until_signal
from swarm_node.train.partial import ROLLOUT_MODES, DynamicRollouts, PendingGroup, RolloutRequest, StepTurns
from tests.unit.test_april import EOS, LengthSampler


def scripted(flags: list[bool]) -> tuple[list[tuple[int, int]], object]:
    """A generator handing out groups whose signal is `flags` in order; it records (round, count) per call."""
    calls: list[tuple[int, int]] = []
    left = list(flags)

    def generate(round_: int, count: int) -> list[bool]:
        calls.append((round_, count))
        taken, left[:] = left[:count], left[count:]
        return taken

    return calls, generate


def test_each_round_asks_only_for_the_groups_with_signal_still_missing() -> None:
    calls, generate = scripted([True, False, False, True, False, True, False, True, True])
    got = sample_until_signal(generate, bool, target=4, max_factor=4)  # type: ignore[arg-type]
    # round 0: 4 groups, 2 with signal; round 1: the 2 missing, 1 with signal; round 2: 1, none; round 3: 1, signal
    assert calls == [(0, 4), (1, 2), (2, 1), (3, 1)]
    assert (got.generated, got.with_signal, got.rounds) == (8, 4, 4)
    assert got.groups == (True, False, False, True, False, True, False, True)  # every generated group, in order


def test_no_more_than_max_factor_times_target_groups_are_generated() -> None:
    calls, generate = scripted([False] * 100)
    got = sample_until_signal(generate, bool, target=3, max_factor=4)  # type: ignore[arg-type]
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert (got.generated, got.with_signal, got.rounds) == (12, 0, 4)
    # the cap cuts the last round short: 4 + 3 = 7 of the 8 allowed, then 1
    calls, generate = scripted([True, False, False, False] + [False] * 10)
    got = sample_until_signal(generate, bool, target=4, max_factor=2)  # type: ignore[arg-type]
    assert calls == [(0, 4), (1, 3), (2, 1)] and (got.generated, got.with_signal) == (8, 1)
    # every group with signal at once: one round, exactly the target
    calls, generate = scripted([True] * 10)
    got = sample_until_signal(generate, bool, target=4)  # type: ignore[arg-type]
    assert calls == [(0, 4)] and (got.generated, got.with_signal, got.rounds) == (4, 4, 1)


def test_next_count_and_bad_arguments() -> None:
    assert next_count(target=8, cap=32, generated=0, with_signal=0) == 8
    assert next_count(target=8, cap=32, generated=30, with_signal=3) == 2  # 5 missing, 2 left under the cap
    assert next_count(target=8, cap=32, generated=12, with_signal=8) == 0
    assert next_count(target=8, cap=32, generated=32, with_signal=1) == 0
    calls, generate = scripted([])  # a source with nothing left ends the step
    assert sample_until_signal(generate, bool, target=2).rounds == 1  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sample_until_signal(generate, bool, target=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sample_until_signal(generate, bool, target=2, max_factor=0)  # type: ignore[arg-type]


def test_the_dynamic_mode_counts_every_generated_group_and_token() -> None:
    """LengthSampler: a prompt [L, 100] gets completions of L tokens, G = 2 each; signal here: L even."""
    sampler = LengthSampler()
    lengths, drawn = [4, 3, 5, 6, 7, 8], []
    inst = TaskInstance.__new__(TaskInstance)

    def draw(count: int) -> list[tuple[TaskInstance, list[int]]]:
        drawn.append(count)
        taken, lengths[:] = lengths[:count], lengths[count:]
        return [(inst, [length, 100]) for length in taken]

    def even(g: PendingGroup) -> bool:
        return g.prompt_ids[0] % 2 == 0

    mode = ROLLOUT_MODES["dynamic"](DynamicRolloutConfig(max_factor=4))
    assert isinstance(mode, DynamicRollouts)
    got = mode.step(RolloutRequest(sampler, draw, 2, 2, SamplingParams(max_new_tokens=64, seed=5), frozenset({EOS}),
                                   has_signal=even))
    assert drawn == [2, 1, 1]  # 4 and 3 (one with signal), then 5 (none), then 6
    assert [g.prompt_ids[0] for g in got.groups] == [4, 3, 5, 6]
    assert got.gen_tokens == 2 * (4 + 3 + 5 + 6)
    assert dict(got.counts) == {"groups": 4, "rounds": 3, "signal_groups": 2}
    assert sampler.calls == [(4, 64), (2, 64), (2, 64)]  # rows per generate call: count x G
    with pytest.raises(ValueError, match="has_signal"):
        mode.step(RolloutRequest(sampler, draw, 2, 2, SamplingParams(max_new_tokens=64), frozenset({EOS})))


def test_a_refill_goes_on_rotating_the_selection_shifted_each_step() -> None:
    """Step 2 of 8 prompts: its first draw at turn 16 (as a sync step's), refills after the prompts drawn, shifted by
    the step number; with the balanced selection over 4 specialties the refills of steps 2 and 3 start at 2 and 3."""
    turns = StepTurns(start=16, shift=2)
    assert [turns.next(8), turns.next(3), turns.next(1)] == [16, 16 + 8 + 2, 16 + 11 + 2]
    assert StepTurns(start=24, shift=3).next(8) == 24
    step3 = StepTurns(start=24, shift=3)
    step3.next(8)
    assert step3.next(2) % 4 == 3


def test_the_dynamic_rollout_config_is_a_variant_section() -> None:
    cfg = load_config(None, {"run.rollout.kind": "dynamic"})
    assert isinstance(cfg.run.rollout, DynamicRolloutConfig) and cfg.run.rollout.max_factor == 4
    assert load_config(None, {"run.rollout.kind": "dynamic", "run.rollout.max_factor": 2}).run.rollout.max_factor == 2
    with pytest.raises(ConfigError):
        load_config(None, {"run.rollout.max_factor": 2})  # a key of a mode not selected
    with pytest.raises(ConfigError):
        load_config(None, {"run.rollout.kind": "dynamic", "run.rollout.max_factor": 0})
    with pytest.raises(ConfigError, match="dynamic sampling"):
        load_config(None, {"run.rollout.kind": "dynamic", "run.rollout_allocation": "dars"})


def test_a_node_with_dynamic_sampling_counts_its_generated_groups_and_trains_on_those_with_signal(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 2,
                             "run.prompts_per_step": 2, "run.group_size": 2, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "task.reward": "score", "sampler.max_new_tokens": 8,
                             "run.rollout.kind": "dynamic", "run.rollout.max_factor": 3})
    node = Node(cfg, events=NodeEvents(log=lambda _m: None))
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        assert r["groups_total"] == r["rollout_groups"] <= 2 * 3  # every generated group is the step's, capped
        assert r["groups_used"] == r["rollout_signal_groups"] <= 2
        # it stops as soon as 2 have signal, else at the cap
        assert r["groups_used"] == 2 or r["groups_total"] == 6
        assert r["gen_tokens"] > 0
