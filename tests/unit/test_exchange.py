"""TransportExchange over MemoryTransport: publish/flush/drain, and a rejected message queued as a drop."""

from __future__ import annotations

import asyncio
import time

from protocol.codec import encode
from protocol.limits import Limits
from protocol.messages import CompletionWire, RolloutBatch, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import Received, RoundStats, TransportExchange, accept_policy_for
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr

TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()


def _group(sender: str, index: int, vocab_id: int = 5) -> RolloutGroup:
    ids = (vocab_id, TOK.eos_token_id)
    return RolloutGroup(bytes([index]) * 16, sender, 0, TaskRefWire(SOURCE.name, SOURCE.config, SOURCE.seed, index),
                        (CompletionWire(ids, "x", (-0.5, -0.5), 0.0),), tokenizer_hash(TOK), "qwen2", time.time())


def _exchange_pair(limits: Limits) -> list[list[Received]]:
    async def main() -> list[list[Received]]:
        hub = MemoryHub()
        a, b = MemoryTransport(hub, "peerA"), MemoryTransport(hub, "peerB")
        ea = TransportExchange(a, limits, accept_policy_for(SOURCE))
        eb = TransportExchange(b, limits, accept_policy_for(SOURCE))
        for t, e in ((a, ea), (b, eb)):
            await t.start()
            await e.start()
        await a.connect(memory_addr("peerB"))
        await hub.settle()
        ea.publish([_group("peerA", 1), _group("peerA", 2)])
        assert await ea.flush() == 1 and await ea.flush() == 0  # one message; the outbox is empty after
        await hub.settle()
        first = eb.drain()
        second = eb.drain()
        ea.publish([_group("peerA", 3, vocab_id=limits.vocab_size + 7 if limits.vocab_size else 5)])
        await ea.flush()
        await hub.settle()
        third = eb.drain()
        for t in (a, b):
            await t.stop()
        return [first, second, third]

    return asyncio.run(main())


def test_published_groups_arrive_once_and_drain_clears() -> None:
    first, second, _third = _exchange_pair(Limits(vocab_size=len(TOK)))
    assert [(r.sender, r.group.task.index if r.group else None) for r in first] == [("peerA", 1), ("peerA", 2)]
    assert all(r.reason == "" for r in first)
    assert second == []


def test_a_rejected_message_is_queued_as_a_drop_with_its_reason() -> None:
    _first, _second, third = _exchange_pair(Limits(vocab_size=len(TOK)))
    assert len(third) == 1 and third[0].group is None and third[0].sender == "peerA"
    assert third[0].reason  # e.g. a token id beyond the vocabulary


def test_a_round_counts_every_message_validated_and_flush_hands_it_on() -> None:
    limits = Limits(vocab_size=len(TOK))

    async def main() -> tuple[list[RoundStats], RoundStats, int]:
        hub = MemoryHub()
        a, b = MemoryTransport(hub, "peerA"), MemoryTransport(hub, "peerB")
        ea, eb = (TransportExchange(t, limits, accept_policy_for(SOURCE)) for t in (a, b))
        finished: list[RoundStats] = []
        eb.on_round = finished.append
        for t, e in ((a, ea), (b, eb)):
            await t.start()
            await e.start()
        await a.connect(memory_addr("peerB"))
        groups = [_group("peerA", 1), _group("peerA", 2)]
        ea.publish(groups)
        await ea.flush()
        ea.publish([_group("peerA", 3, vocab_id=limits.vocab_size + 7)])  # rejected: out of the vocabulary
        await ea.flush()
        await hub.settle()
        await eb.flush()
        for t in (a, b):
            await t.stop()
        return finished, eb.round_stats, len(encode(RolloutBatch(tuple(groups))))

    finished, current, batch_bytes = asyncio.run(main())
    assert len(finished) == 1 and current == RoundStats(1)
    assert finished[0].inbound_messages == 2 and finished[0].pulls_sent == finished[0].pulls_served == 0
    assert finished[0].by_reason == {"token_out_of_vocab": 1}
    bad = _group("peerA", 3, vocab_id=limits.vocab_size + 7)
    assert finished[0].inbound_bytes == batch_bytes + len(encode(RolloutBatch((bad,))))
