"""Realistic rollout messages for the libp2p tests: one RolloutBatch of one group, 8 completions x 64 tokens."""

from __future__ import annotations

import os
import random
import time

from protocol.codec import encode
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, CompletionWire, RolloutBatch, RolloutGroup, TaskRefWire
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.transport.base import ValidationResult, Validator

TOPIC = TOPIC_ROLLOUTS
TASK = ("chain_sum", "{}")


def rollout_batch(policy_id: str, index: int, completions: int = 8, tokens: int = 64,
                  group_id: bytes | None = None, created_at: float | None = None) -> tuple[bytes, bytes]:
    """(group_id, encoded RolloutBatch) attributed to `policy_id`."""
    rng = random.Random(index)
    gid = group_id if group_id is not None else os.urandom(16)
    group = RolloutGroup(
        group_id=gid, policy_id=policy_id, policy_version=index, task=TaskRefWire(TASK[0], TASK[1], 0, index),
        completions=tuple(CompletionWire(tuple(rng.randrange(64) for _ in range(tokens)), "7+8=15" * (tokens // 6),
                                         tuple(-rng.random() for _ in range(tokens)), 1.0)
                          for _ in range(completions)),
        tokenizer_hash="char-v1", model_family="qwen2", created_at=time.time() if created_at is None else created_at)
    return gid, encode(RolloutBatch((group,)))


def protocol_validator(topic: str = TOPIC) -> Validator:
    """The protocol's gossip validation (limits, schema, attribution, freshness, replay) as a transport validator."""
    limits = Limits(vocab_size=64)
    policy = AcceptPolicy(tasks=frozenset({TASK}), max_index=1 << 20)
    replay = ReplayGuard(limits.max_age_s)

    def validate(signer: str, data: bytes) -> ValidationResult:
        result = validate_gossip(topic, data, signer, limits=limits, policy=policy, now=time.time(), replay=replay)
        return ValidationResult[result.verdict.name]

    return validate


def group_ids(data: bytes) -> list[bytes]:
    from protocol.codec import decode

    msg = decode(data, Limits(vocab_size=64))
    assert isinstance(msg, RolloutBatch)
    return [g.group_id for g in msg.groups]
