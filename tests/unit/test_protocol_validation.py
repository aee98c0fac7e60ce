"""Gossip validation: topic, attribution, task policy, tokenizer, freshness, replay, and verdict precedence."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest

from protocol.codec import encode
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import (
    TOPIC_POLICY,
    TOPIC_ROLLOUTS,
    TOPIC_STATUS,
    CompletionWire,
    PolicyAnnounce,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
)
from protocol.validation import (
    AcceptPolicy,
    ReplayGuard,
    Validated,
    check_attribution,
    check_task_ref,
    validate_gossip,
)

A = "12D3KooWAlice"
B = "12D3KooWBob"
NOW = 1_700_000_000.0
CONFIG = '{"max_terms":2}'
LIMITS = Limits(max_age_s=60.0, max_clock_skew_s=5.0)
POLICY = AcceptPolicy(tasks=frozenset({("chain_sum", CONFIG)}), max_index=1000)


def group(n: int = 0, **overrides: Any) -> RolloutGroup:
    fields: dict[str, Any] = dict(
        group_id=bytes([n]) * 16, policy_id=A, policy_version=1, task=TaskRefWire("chain_sum", CONFIG, 0, n),
        completions=(CompletionWire((5, 6), "12", (-0.5, -0.25), 1.0),), tokenizer_hash="h1", model_family="qwen2",
        created_at=NOW - 1.0)
    fields.update(overrides)
    return RolloutGroup(**fields)


def batch(*groups: RolloutGroup) -> bytes:
    return encode(RolloutBatch(groups or (group(),)))


def announce(owner: str = A, created_at: float = NOW) -> bytes:
    return encode(PolicyAnnounce(owner, 3, 2, 100, b"\x01" * 32, 2, "dense-bf16", created_at))


def status(created_at: float = NOW) -> bytes:
    return encode(Status("worker", ("rollouts",), 10.0, 3, A + "/main", created_at))


def validate(data: bytes, signer: str = A, topic: str = TOPIC_ROLLOUTS, policy: AcceptPolicy = POLICY,
             now: float = NOW, replay: ReplayGuard | None = None) -> Validated:
    return validate_gossip(topic, data, signer, limits=LIMITS, policy=policy, now=now,
                           replay=replay if replay is not None else ReplayGuard(LIMITS.max_age_s))


def outcome(result: Validated) -> tuple[Verdict, str]:
    return result.verdict, result.reason


def test_accepts_a_valid_message_of_each_type() -> None:
    result = validate(batch())
    assert result.verdict == Verdict.ACCEPT
    assert result.message == RolloutBatch((group(),))
    assert validate(announce(), topic=TOPIC_POLICY).verdict == Verdict.ACCEPT
    # A worker's status names the learner it follows; that claim is informational, not attributed.
    assert validate(status(), signer=B, topic=TOPIC_STATUS).verdict == Verdict.ACCEPT


def test_policy_id_must_belong_to_the_signer() -> None:
    assert validate(batch(group(policy_id=A + "/lora-1"))).verdict == Verdict.ACCEPT
    assert outcome(validate(batch(), signer=B)) == (Verdict.REJECT, "forged_attribution")
    # One foreign group taints the whole message.
    mixed = batch(group(0), group(1, policy_id=B))
    assert outcome(validate(mixed)) == (Verdict.REJECT, "forged_attribution")
    # "<peer>x" is not "<peer>/name": a prefix match is not ownership.
    assert outcome(validate(batch(group(policy_id=A + "x")))) == (Verdict.REJECT, "forged_attribution")
    assert outcome(validate(announce(owner=B), topic=TOPIC_POLICY)) == (Verdict.REJECT, "forged_attribution")


def test_delegates_may_sign_rollouts_but_never_announces() -> None:
    learner_workers = AcceptPolicy(tasks=POLICY.tasks, max_index=1000, delegates={A: frozenset({B})})
    assert validate(batch(), signer=B, policy=learner_workers).verdict == Verdict.ACCEPT
    assert outcome(validate(announce(), signer=B, topic=TOPIC_POLICY, policy=learner_workers)) == (
        Verdict.REJECT, "forged_attribution")
    with pytest.raises(WireError) as info:
        check_attribution(RolloutBatch((group(),)), "12D3KooWCarol", {A: frozenset({B})})
    assert info.value.reason == "forged_attribution"


def test_message_on_the_wrong_topic_is_rejected() -> None:
    assert outcome(validate(status(), topic=TOPIC_ROLLOUTS)) == (Verdict.REJECT, "wrong_topic")
    assert outcome(validate(batch(), topic=TOPIC_STATUS)) == (Verdict.REJECT, "wrong_topic")
    assert outcome(validate(batch(), topic="other/topic")) == (Verdict.REJECT, "wrong_topic")


def test_only_allowed_task_references_are_accepted() -> None:
    cases = [
        (TaskRefWire("chain_sum", CONFIG, 0, 999), (Verdict.ACCEPT, "")),
        (TaskRefWire("chain_sum", CONFIG, 0, 1000), (Verdict.IGNORE, "task_index_out_of_range")),
        (TaskRefWire("chain_sum", '{"max_terms":9}', 0, 1), (Verdict.IGNORE, "task_not_allowed")),
        (TaskRefWire("basic_arithmetic", CONFIG, 0, 1), (Verdict.IGNORE, "task_not_allowed")),
    ]
    for ref, expected in cases:
        assert outcome(validate(batch(group(task=ref)))) == expected, ref
    seeded = AcceptPolicy(tasks=POLICY.tasks, max_index=1000, seeds=frozenset({0}))
    assert validate(batch(), policy=seeded).verdict == Verdict.ACCEPT
    assert outcome(validate(batch(group(task=TaskRefWire("chain_sum", CONFIG, 7, 1))), policy=seeded)) == (
        Verdict.IGNORE, "task_not_allowed")
    with pytest.raises(WireError) as info:
        check_task_ref(TaskRefWire("chain_sum", CONFIG, 0, 10**6), POLICY)
    assert info.value.verdict == Verdict.IGNORE


def test_tokenizer_filter_ignores_other_tokenizers() -> None:
    only_h1 = AcceptPolicy(tasks=POLICY.tasks, max_index=1000, tokenizer_hashes=frozenset({"h1"}))
    assert validate(batch(), policy=only_h1).verdict == Verdict.ACCEPT
    assert outcome(validate(batch(group(tokenizer_hash="h2")), policy=only_h1)) == (
        Verdict.IGNORE, "tokenizer_mismatch")


def test_stale_future_and_unknown_version_are_ignored() -> None:
    assert outcome(validate(batch(group(created_at=NOW - 61.0)))) == (Verdict.IGNORE, "stale")
    assert outcome(validate(batch(group(created_at=NOW + 6.0)))) == (Verdict.IGNORE, "future")
    assert outcome(validate(status(NOW - 61.0), topic=TOPIC_STATUS)) == (Verdict.IGNORE, "stale")
    newer = msgpack.packb({"v": 6, "type": "rollouts", "body": {"groups": "new layout"}}, use_bin_type=True)
    assert outcome(validate(newer)) == (Verdict.IGNORE, "unknown_version")
    # A schema-4 peer's batch (its completions have no version spans) is ignored too, not penalised.
    older = msgpack.unpackb(batch(), raw=False)
    older["v"] = 4
    for g in older["body"]["groups"]:
        for c in g["completions"]:
            del c["spans"]
    assert outcome(validate(msgpack.packb(older, use_bin_type=True))) == (Verdict.IGNORE, "unknown_version")


def test_reject_class_checks_come_before_ignore_class_ones() -> None:
    stale_forged = batch(group(created_at=NOW - 600.0))
    assert outcome(validate(stale_forged, signer=B)) == (Verdict.REJECT, "forged_attribution")
    stale_wrong_topic = status(NOW - 600.0)
    assert outcome(validate(stale_wrong_topic, topic=TOPIC_ROLLOUTS)) == (Verdict.REJECT, "wrong_topic")
    obj = msgpack.unpackb(batch(group(created_at=NOW - 600.0)), raw=False)
    obj["body"]["groups"][0]["completions"][0]["reward"] = math.inf
    assert outcome(validate(msgpack.packb(obj, use_bin_type=True))) == (Verdict.REJECT, "non_finite")


def test_garbage_is_rejected_not_raised() -> None:
    for data in (b"", b"\xc1", b"\x00" * 10, b"\xff" * 600_000):
        assert validate(data).verdict == Verdict.REJECT


def test_replay_is_accepted_once_then_ignored_within_the_window() -> None:
    guard = ReplayGuard(LIMITS.max_age_s)
    data = batch()
    assert validate(data, replay=guard).verdict == Verdict.ACCEPT
    assert outcome(validate(data, replay=guard, now=NOW + 30.0)) == (Verdict.IGNORE, "replay")
    # A re-encoding with another key order is the same message.
    obj = msgpack.unpackb(data, raw=False)
    obj["body"]["groups"][0] = dict(reversed(list(obj["body"]["groups"][0].items())))
    reordered = msgpack.packb(obj, use_bin_type=True)
    assert outcome(validate(reordered, replay=guard, now=NOW + 30.0)) == (Verdict.IGNORE, "replay")
    # A batch that repeats an accepted group is a replay too, and its new group is not remembered.
    rebundled = batch(group(0), group(1))
    assert outcome(validate(rebundled, replay=guard)) == (Verdict.IGNORE, "replay")
    assert validate(batch(group(1)), replay=guard).verdict == Verdict.ACCEPT
    # After the window the message is stale for the decoder and forgotten by the guard.
    assert outcome(validate(data, replay=guard, now=NOW + 60.0)) == (Verdict.IGNORE, "stale")
    assert len(guard) == 2
    guard.expire(NOW + 60.0)
    assert len(guard) == 0


def test_rejected_and_ignored_messages_are_not_remembered() -> None:
    guard = ReplayGuard(LIMITS.max_age_s)
    assert validate(batch(), signer=B, replay=guard).verdict == Verdict.REJECT
    assert validate(batch(group(tokenizer_hash="x")), replay=guard,
                    policy=AcceptPolicy(POLICY.tasks, 1000, tokenizer_hashes=frozenset({"h1"}))).verdict == (
        Verdict.IGNORE)
    assert len(guard) == 0


def test_replay_guard_memory_is_bounded_and_raises_its_floor() -> None:
    guard = ReplayGuard(max_age_s=100.0, capacity=3)
    for i, created_at in enumerate((10.0, 20.0, 30.0, 40.0, 50.0)):
        assert not guard.is_replay(bytes([i]), created_at, now=60.0)
        guard.remember(bytes([i]), created_at, now=60.0)
    assert len(guard) == 3
    assert guard.floor == 20.0  # ids created at 10 and 20 were forgotten
    assert guard.is_replay(b"\x00", 10.0, now=60.0)  # forgotten, but below the floor: still refused
    assert guard.is_replay(b"\x01", 20.0, now=60.0)
    assert guard.is_replay(b"\x04", 50.0, now=60.0)  # still remembered
    assert guard.is_replay(b"new", 15.0, now=60.0)  # fresh id, but inside the shrunken window
    assert not guard.is_replay(b"new", 25.0, now=60.0)
    # Time passing frees memory: at now=135 everything created before 35 has left the window.
    assert not guard.is_replay(b"later", 130.0, now=135.0)
    assert len(guard) == 2
    assert guard.is_replay(b"old", 34.0, now=135.0)


def test_replay_guard_remember_is_idempotent() -> None:
    guard = ReplayGuard(max_age_s=10.0, capacity=2)
    guard.remember(b"a", 1.0, now=2.0)
    guard.remember(b"a", 1.0, now=2.0)
    assert len(guard) == 1
    assert guard.floor == -math.inf
