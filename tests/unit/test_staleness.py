"""Version lag and the staleness bound: rollouts older than S never reach the loss; lag > 0 is off-policy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from swarm_node.config import SamplerConfig, TrainConfig
from swarm_node.model.default_model import load_model
from swarm_node.train.batching import collate
from swarm_node.train.staleness import RolloutBuffer, drop_reason, lag, may_generate
from swarm_node.train.trainer import Trainer
from swarm_node.types import TrainSample


def test_lag_and_drop_reasons() -> None:
    assert lag(7, 5) == 2
    assert drop_reason(7, 7, 0) is None
    assert drop_reason(7, 6, 0) == "stale"
    assert drop_reason(7, 5, 2) is None
    assert drop_reason(7, 4, 2) == "stale"
    assert drop_reason(7, 8, 4) == "future_version"


def test_buffer_takes_fifo_within_bound_and_drops_the_rest() -> None:
    buf: RolloutBuffer[str] = RolloutBuffer(max_staleness=1)
    for name, version in [("a", 3), ("b", 4), ("c", 5), ("d", 5), ("e", 9)]:
        buf.add(name, version)
    taken = buf.take(2, current_version=5)  # a (lag 2) is stale; e claims a version we do not have yet
    assert [(v.item, v.version) for v in taken] == [("b", 4), ("c", 5)]
    assert buf.dropped == {"stale": 1, "future_version": 1}
    assert buf.available(5) == 1 and buf.available(7) == 0
    assert [v.item for v in buf.take(5, current_version=7)] == []  # d has lag 2 by now
    assert buf.dropped["stale"] == 2 and len(buf) == 0


def test_buffer_overflow_drops_oldest() -> None:
    buf: RolloutBuffer[int] = RolloutBuffer(max_staleness=4, capacity=2)
    for i in range(3):
        buf.add(i, 0)
    assert [v.item for v in buf.take(3, 0)] == [1, 2]
    assert buf.dropped["overflow"] == 1


def test_negative_bound_rejected() -> None:
    with pytest.raises(ValueError):
        RolloutBuffer(max_staleness=-1)


def test_off_policy_row_uses_proximal_ratio_and_truncated_weight(tiny_model_dir: Path) -> None:
    """Decoupled objective: ratio 1 against the current policy, loss = -A * min(pi/mu, cap) per token (mean)."""
    model, tok = load_model(tiny_model_dir)
    trainer = Trainer(model, TrainConfig(lr=1e-3, minibatches=1, is_cap=2.0), SamplerConfig(), tok.pad_token_id)
    prompt, completion = tok.encode("1 + 2 ="), [10, 1]
    probe = collate([TrainSample(prompt, completion, [0.0, 0.0], 0.0)], tok.pad_token_id)
    with torch.no_grad():
        logp, _ = trainer.token_log_probs(model, probe)
    current = logp[0, probe.mask[0].bool()].tolist()
    # Behaviour policy: token 0 was 4x less likely than now (weight capped at 2), token 1 twice as likely (0.5).
    behaviour = [current[0] - math.log(4.0), current[1] + math.log(2.0)]
    stats = trainer.train_step([TrainSample(prompt, completion, behaviour, 1.0, off_policy=True)])
    assert stats.clip_frac == 0.0
    assert stats.loss == pytest.approx(-(2.0 + 0.5) / 2, rel=1e-5)


def test_worker_flow_control() -> None:
    # S = 0: batch k needs version k (synchronous); S = 1: batch k may use version k - 1 (overlap by one step).
    assert may_generate(batches_done=0, held_version=0, known_version=0, max_staleness=0)
    assert not may_generate(batches_done=1, held_version=0, known_version=0, max_staleness=0)
    assert may_generate(batches_done=1, held_version=0, known_version=0, max_staleness=1)
    assert not may_generate(batches_done=2, held_version=0, known_version=1, max_staleness=1)
    # A learner that ran ahead (other workers fed it): the known version sets the target, not our batch count.
    assert not may_generate(batches_done=1, held_version=1, known_version=5, max_staleness=2)
    assert may_generate(batches_done=1, held_version=3, known_version=5, max_staleness=2)
