"""Rollout batching: a full RolloutBatch round-trips byte-exact, batches over the receivers' limits are refused with
their reason, the flush decision on a virtual clock, and bench.gossip counting groups rather than messages."""

from __future__ import annotations

import asyncio

import pytest

from bench.gossip_groups import delivered_groups, publish_groups
from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import CompletionWire, RolloutBatch, RolloutGroup, Status, TaskRefWire
from swarm_node.sharing.accepted import AcceptedMessages
from swarm_node.sharing.batching import BatchPolicy, GroupBatcher, flush_due

PEER = "12D3KooWBatchPeer"


def group(index: int, created_at: float = 1000.0) -> RolloutGroup:
    completions = tuple(CompletionWire(tuple((index + k) % 64 for k in range(8)), f"answer {index}",
                                       tuple(-0.25 * (k + 1) for k in range(8)), 1.0) for _ in range(4))
    return RolloutGroup(bytes([index]) * 16, PEER, index, TaskRefWire("chain_sum", "{}", 0, index), completions,
                        "char-v1", "qwen2", created_at)


def refusal(data: bytes, limits: Limits) -> str:
    with pytest.raises(WireError) as info:
        decode(data, limits)
    return info.value.reason


# ------------------------------------------------------------------------------------------------ the codec
def test_a_full_batch_of_16_groups_round_trips_byte_exact() -> None:
    batch = RolloutBatch(tuple(group(i) for i in range(16)))
    data = encode(batch)
    decoded = decode(data, Limits(vocab_size=64))
    assert decoded == batch
    assert encode(decoded) == data


def test_a_batch_over_the_group_limit_is_refused_with_its_reason() -> None:
    data = encode(RolloutBatch(tuple(group(i) for i in range(17))))
    assert refusal(data, Limits(vocab_size=64)) == "too_many_groups"
    assert len(decode(data, Limits(vocab_size=64, max_groups_per_message=17)).groups) == 17  # type: ignore[union-attr]


def test_a_batch_over_the_byte_limit_is_refused_with_its_reason() -> None:
    data = encode(RolloutBatch(tuple(group(i) for i in range(16))))
    assert refusal(data, Limits(vocab_size=64, max_message_bytes=len(data) - 1)) == "message_too_large"
    assert decode(data, Limits(vocab_size=64, max_message_bytes=len(data))) is not None


def test_a_policy_over_the_receivers_limit_is_refused_naming_both_numbers() -> None:
    assert BatchPolicy().checked(Limits()) == BatchPolicy(16, 0.05)
    with pytest.raises(ValueError, match="a batch of 17 groups is over the receivers' limit of 16 groups"):
        BatchPolicy(max_groups=17).checked(Limits())
    with pytest.raises(ValueError):
        BatchPolicy(max_groups=0)
    with pytest.raises(ValueError):
        BatchPolicy(max_delay_s=-0.01)


# ---------------------------------------------------------------------------------- the flush decision
def test_flush_is_due_for_a_full_batch_or_once_the_oldest_waited_50_ms() -> None:
    policy = BatchPolicy(max_groups=16, max_delay_s=0.05)
    assert flush_due(policy, 0, 0.0, 10.0) is False  # nothing queued: nothing to send, however late
    assert flush_due(policy, 15, 1.0, 1.049) is False
    assert flush_due(policy, 15, 1.0, 1.05) is True
    assert flush_due(policy, 16, 1.0, 1.0) is True
    assert flush_due(policy, 1, 1.0, 1.0) is False
    assert flush_due(BatchPolicy(max_groups=1), 1, 1.0, 1.0) is True  # today's path: one group, one message


def test_batcher_on_a_virtual_clock_sends_full_batches_at_once_and_the_rest_at_its_deadline() -> None:
    batcher: GroupBatcher[int] = GroupBatcher(BatchPolicy(max_groups=4, max_delay_s=0.05))
    assert batcher.deadline() is None
    assert [batcher.add(i, 0.01 * i) for i in range(3)] == [[], [], []]
    assert batcher.deadline() == 0.05
    assert batcher.add(3, 0.03) == [(0, 1, 2, 3)]  # full: sent at once, before any deadline
    assert batcher.deadline() is None
    assert batcher.add(4, 0.04) == []
    assert batcher.add(5, 0.07) == []
    assert batcher.deadline() == pytest.approx(0.09)  # the oldest still queued (queued at 0.04) sets it
    assert batcher.take_due(0.089) == []
    assert batcher.take_due(0.04 + 0.05) == [(4, 5)]
    assert len(batcher) == 0 and batcher.take_due(100.0) == []


def test_batcher_late_check_sends_every_batch_in_order_and_take_all_empties_it() -> None:
    batcher: GroupBatcher[int] = GroupBatcher(BatchPolicy(max_groups=2, max_delay_s=0.05))
    assert batcher.add(0, 0.0) == []
    assert batcher.add(2, 0.0) == [(0, 2)]
    assert batcher.add(4, 0.0) == []
    assert batcher.take_due(1.0) == [(4,)]  # checked late: sent then, nothing lost
    for i in range(5):
        assert batcher.add(i, 2.0) == ([(i - 1, i)] if i % 2 else [])
    assert batcher.take_all() == [(4,)]
    assert batcher.take_all() == [] and batcher.deadline() is None


# ------------------------------------------------------------------------------------- bench.gossip counts groups
def test_bench_parser_counts_the_groups_of_a_message_and_each_groups_latency() -> None:
    data = encode(RolloutBatch((group(1, created_at=99.5), group(2, created_at=99.75), group(3, created_at=100.0))))
    assert delivered_groups(data, Limits(vocab_size=64), now=100.25) == (3, [0.75, 0.5, 0.25])
    status = Status("peer", ("rollouts",), 1.0, 0, "", 100.0)
    assert delivered_groups(encode(status), Limits(vocab_size=64), now=100.25) == (0, [])


def test_bench_publisher_sends_35_groups_as_16_16_3_and_today_path_one_per_message() -> None:
    sent: list[bytes] = []

    async def publish(data: bytes) -> None:
        sent.append(data)

    def counts(policy: BatchPolicy) -> list[int]:
        sent.clear()
        errors = asyncio.run(publish_groups(publish, group, 35, 0.0, None, policy))
        assert errors == 0
        return [delivered_groups(d, Limits(vocab_size=64), 1000.0)[0] for d in sent]

    assert counts(BatchPolicy(16, 0.05)) == [16, 16, 3]
    assert counts(BatchPolicy(1, 0.05)) == [1] * 35
    assert [g.group_id[0] for d in sent for g in decode(d, Limits(vocab_size=64)).groups] == list(range(35))  # type: ignore[union-attr]


def test_bench_publisher_counts_failed_publishes_instead_of_stopping() -> None:
    async def failing(_data: bytes) -> None:
        raise RuntimeError("host restarting")

    assert asyncio.run(publish_groups(failing, group, 20, 0.0, None, BatchPolicy(16, 0.05))) == 2


# ------------------------------------------------------------------------- a delivery reuses its validation
def test_accepted_message_is_taken_once_and_the_oldest_is_evicted_past_capacity() -> None:
    accepted = AcceptedMessages(capacity=2)
    batches = [RolloutBatch((group(i),)) for i in range(3)]
    data = [encode(b) for b in batches]
    for d, b in zip(data, batches, strict=True):
        accepted.remember(d, b)
    assert len(accepted) == 2
    assert accepted.take(data[0]) is None  # evicted: the caller decodes it itself
    assert accepted.take(bytes(data[1])) is batches[1]  # equal bytes from another frame find it
    assert accepted.take(data[1]) is None
    assert delivered_groups(data[2], Limits(vocab_size=64), 1000.5, accepted) == (1, [0.5])
    assert len(accepted) == 0
    with pytest.raises(ValueError):
        AcceptedMessages(capacity=0)
