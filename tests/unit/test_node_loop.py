"""The node loop `for item in source: train_on(item)`: exact steps, metrics lines and counts."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm_node.config import load_config
from swarm_node.node.core import Node, NodeEvents
from swarm_node.node.sources import BaseSource, Item
from swarm_node.tasks.pass_rates import PassRateParams
from swarm_node.types import Draft, SkippedStep


class Scripted(BaseSource):
    """Yields a skipped step, then drafts the node samples itself; records what the loop told it."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.seen: list[dict[str, Any]] = []
        self.closed = False

    def __iter__(self) -> Iterator[Item]:
        yield SkippedStep("non-finite reward (test)")
        while True:
            groups, gen_s, tokens = self.node.generate_groups()
            yield Draft(groups, gen_s, tokens, time.monotonic(), self.node.version)

    def trained(self, metrics: dict[str, Any]) -> None:
        metrics["seen_by_source"] = True
        self.seen.append(dict(metrics))

    def close(self) -> None:
        self.closed = True


def test_a_source_of_one_skipped_step_and_drafts(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 3,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "task.reward": "score"})
    steps: list[dict[str, Any]] = []
    node = Node(cfg, events=NodeEvents(log=lambda _m: None, on_step=steps.append))
    node.setup()
    source = Scripted(node)
    try:
        summary = node.run(source)
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["skipped"] == "non-finite reward (test)" and "reward_mean" not in rows[0]
    assert all("reward_mean" in r and r["seen_by_source"] for r in rows[1:])
    assert node.cfg.sampler.max_new_tokens == 8  # the model declares no budget of its own
    assert all(1 <= r["completion_tokens_p50"] <= r["completion_tokens_p95"] <= 8 for r in rows[1:])
    assert all(r["gen_time_frac"] > 0 for r in rows[1:])
    assert [m["step"] for m in source.seen] == [1, 2, 3] and source.closed
    assert [m["step"] for m in steps] == [1, 2, 3]  # events.on_step once per step, with what was written
    assert summary.steps == 3 and summary.skipped_steps == 1 and node.stats.errors["skipped_step"] == 1
    assert [h["step"] for h in node.stats.history] == [1, 2, 3]
    assert rows[1]["policy_version"] <= 1 and rows[2]["policy_version"] <= 2
    assert (tmp_path / "run" / "checkpoints").is_dir()  # the last step checkpoints


def test_skipped_minibatches_are_said_counted_and_leave_the_version(tiny_model_dir: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose minibatches were all skipped (non-finite loss or gradient) trains nothing: the log says so, the
    error is counted, and the policy version stays."""
    from swarm_node.train.trainer import StepStats

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 2,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.run_dir": str(tmp_path / "run"), "train.threads": 1,
                             "status.port": -1, "task.reward": "score"})
    lines: list[str] = []
    node = Node(cfg, events=NodeEvents(log=lines.append))
    node.setup()
    monkeypatch.setattr(node.trainer, "train_step", lambda samples: StepStats(minibatches=2, skipped_minibatches=2))
    try:
        node.run()
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["policy_version"], r["skipped_minibatches"]) for r in rows] == [(0, 2), (0, 2)]
    said = [line for line in lines if "minibatches skipped" in line]
    assert said == [f"step {k}: 2 of 2 minibatches skipped (non-finite loss or gradient): they did not train"
                    for k in (1, 2)]
    assert node.stats.errors["nonfinite_loss"] == 4


def run_node(model_dir: Path, run_dir: Path, steps: int, resume: bool,
             extra: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], object]:
    cfg = load_config(None, {"model.path": str(model_dir), "sampler.kind": "hf", "run.steps": steps,
                             "run.prompts_per_step": 12, "run.group_size": 6, "run.eval_problems": 0,
                             "run.checkpoint_every": 2, "run.run_dir": str(run_dir), "run.resume": resume,
                             "train.threads": 1, "train.minibatches": 2, "status.port": -1, "task.reward": "score",
                             **(extra or {})})
    node = Node(cfg, events=NodeEvents(log=lambda _m: None))
    node.setup()
    try:
        node.run()
    finally:
        node.close()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, (node.streams.task.getstate(), node.trainer.rng.getstate(), node.streams.share.getstate(),
                  node.task_source.book.state())


def test_a_resumed_run_continues_exactly_as_an_uninterrupted_one(warm_tiny_model_dir: Path, tmp_path: Path) -> None:
    """The checkpoint holds every random stream the loop uses (tasks, minibatch shuffle, external selection)."""
    whole, whole_rngs = run_node(warm_tiny_model_dir, tmp_path / "whole", 4, resume=False)
    run_node(warm_tiny_model_dir, tmp_path / "cut", 2, resume=False)
    resumed, resumed_rngs = run_node(warm_tiny_model_dir, tmp_path / "cut", 4, resume=True)
    keys = ("step", "policy_version", "reward_mean", "loss", "grad_norm")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in whole]
    assert resumed_rngs == whole_rngs


def test_adaptive_selection_and_dars_resume_exactly_within_the_budget(warm_tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    """The pass-rate estimates the draws and the allocation read are checkpointed with the streams; the groups vary
    in size, and every step generates exactly prompts_per_step x group_size completions."""
    extra = {"task.selection": "adaptive", "run.rollout_allocation": "dars"}
    whole, whole_state = run_node(warm_tiny_model_dir, tmp_path / "whole", 4, False, extra)
    run_node(warm_tiny_model_dir, tmp_path / "cut", 2, False, extra)
    resumed, resumed_state = run_node(warm_tiny_model_dir, tmp_path / "cut", 4, True, extra)
    keys = ("step", "policy_version", "reward_mean", "loss", "grad_norm", "gen_tokens")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in whole]
    assert resumed_state == whole_state
    book = whole_state[3]  # type: ignore[index]
    assert sum(counts[""][1] for _d, _c, counts in book["families"]) == 4 * 12 * 6
    # own trials per instance: a group of 3 to 12 (G = 6 under dars), and more for an instance the selection
    # replayed, which it does only below replay_trials
    sizes = {int(counts[""][1]) for *_ref, counts in book["instances"]}
    assert len(sizes) > 1 and max(sizes) < PassRateParams().replay_trials + 12 and min(sizes) >= 3


def test_an_assembled_node_refuses_attribute_assignment(tiny_model_dir: Path, tmp_path: Path) -> None:
    """What a node is built from goes to its constructor or the assembly; nothing is patched in afterwards."""
    from swarm_node.node.assembly import Sharing, assemble
    from swarm_node.transport.memory import MemoryHub, MemoryTransport

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 1,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1})
    assembly = assemble(cfg, Sharing.SAPO, transport=MemoryTransport(MemoryHub(), "node0"),
                        events=NodeEvents(log=lambda _m: None))
    node = assembly.node
    try:
        for name, value in (("pool", None), ("exchange", None), ("step", 7), ("version", 3), ("trainer", None),
                            ("task_source", None)):
            with pytest.raises(AttributeError, match="cannot be assigned once the node is set up"):
                setattr(node, name, value)
        assert node.step == 0 and node.version == 0 and not hasattr(node, "pool")
        with pytest.raises(dataclasses.FrozenInstanceError):
            assembly.peer = None  # type: ignore[misc]
    finally:
        assembly.close()


@pytest.mark.parametrize(("overrides", "keeps"), [({}, False), ({"share.filter_no_signal": False}, True)])
def test_the_zero_advantage_filter_setting_reaches_the_pool(tiny_model_dir: Path, tmp_path: Path,
                                                            overrides: dict[str, object], keeps: bool) -> None:
    from swarm_node.node.assembly import Sharing, assemble
    from swarm_node.transport.memory import MemoryHub, MemoryTransport

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 1,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1,
                             **overrides})
    assembly = assemble(cfg, Sharing.SAPO, transport=MemoryTransport(MemoryHub(), "node0"),
                        events=NodeEvents(log=lambda _m: None))
    try:
        assert assembly.peer is not None and assembly.peer.pool.keep_no_signal is keeps
    finally:
        assembly.close()


def test_a_solo_node_builds_no_sharing(tiny_model_dir: Path, tmp_path: Path) -> None:
    from swarm_node.node.assembly import assemble

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 1,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1})
    assembly = assemble(cfg, events=NodeEvents(log=lambda _m: None))
    try:
        assert (assembly.guard, assembly.context, assembly.exchange, assembly.peer) == (None, None, None, None)
        assert not (tmp_path / "run" / "peers.json").exists()
        assert type(assembly.source()).__name__ == "SequentialSource"
    finally:
        assembly.close()


def test_a_budget_past_the_models_context_says_which_setting_to_lower(tiny_model_dir: Path, tmp_path: Path) -> None:
    from swarm_node.errors import UserError

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 1,
                             "run.prompts_per_step": 2, "run.group_size": 2, "run.eval_problems": 0,
                             "sampler.max_new_tokens": 256, "run.run_dir": str(tmp_path / "run"),
                             "train.threads": 1, "status.port": -1})
    node = Node(cfg, events=NodeEvents(log=lambda _m: None))
    node.setup()
    try:
        with pytest.raises(UserError, match=r"with 256 new tokens it exceeds the model's context of 256 \(lower "
                                            r"sampler\.max_new_tokens, or on vLLM raise sampler\.max_model_len"):
            node.draft()
    finally:
        node.close()


def test_checkpoints_come_every_k_steps_or_every_t_seconds_whichever_first() -> None:
    from swarm_node.node.resume import CheckpointSchedule

    schedule = CheckpointSchedule(every_steps=25, every_s=60.0, last_s=0.0)
    saved = []
    # Slow steps (40 s each): the clock, not the step count, says when.
    for step, now in [(1, 40.0), (2, 80.0), (3, 120.0), (4, 160.0), (5, 200.0)]:
        if schedule.due(step, 200, now):
            saved.append(step)
            schedule.saved(now)
    assert saved == [2, 4]
    fast = CheckpointSchedule(every_steps=2, every_s=60.0, last_s=0.0)
    assert [s for s in range(1, 6) if fast.due(s, 5, 1.0 * s)] == [2, 4, 5]  # steps first; the last step always
    steps_only = CheckpointSchedule(every_steps=25, every_s=0.0, last_s=0.0)
    assert not steps_only.due(1, 200, 1e9) and steps_only.due(25, 200, 0.0)


def test_a_slow_run_checkpoints_by_time(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run killed within its first minute resumed from step 0 (checkpoints every 25 steps only); by a clock that
    moves 40 s a step, a 60 s schedule writes steps 2 and 4 (and the last)."""
    from swarm_node.model.checkpoint import CHECKPOINT_DIR

    now = [0.0]  # a clock that moves 40 s with each recorded step

    def step_done(_metrics: dict[str, Any]) -> None:
        now[0] += 40.0

    cfg = load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 5,
                             "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                             "run.checkpoint_every": 100, "run.checkpoint_every_s": 60.0, "run.keep_checkpoints": 10,
                             "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1})
    node = Node(cfg, events=NodeEvents(log=lambda _m: None, on_step=step_done), clock=lambda: now[0])
    try:
        node.run()
    finally:
        node.close()
    written = sorted(p.name for p in (tmp_path / "run" / CHECKPOINT_DIR).glob("step-*"))
    assert written == ["step-00000002", "step-00000004", "step-00000005"]
