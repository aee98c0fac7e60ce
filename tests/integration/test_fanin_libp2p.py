"""Bounded fan-in over real libp2p hosts (child processes) on 127.0.0.1: three FaninExchanges on one shard.

a and b publish one signal-bearing group each, c two without signal. After one round of digests each node pulls
what its digests offer (one group per sender, signal only) over /swarm-node/pull-stream/5 (one stream per sender,
kept); c's groups, pulled by nobody, are pushed over /swarm-node/push/5 to one neighbour each once push_after_s has
passed. A stream that announces a frame over the size limit is reset unread and reported, on both pull protocols.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator

import pytest

from protocol.limits import Limits
from protocol.messages import (
    PULL_PROTOCOL,
    PULL_STREAM_PROTOCOL,
    CompletionWire,
    RolloutGroup,
    TaskRefWire,
    digest_topic,
)
from swarm_node import tasks
from swarm_node.identity import generate
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.exchange import Received, RoundStats, accept_policy_for
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.base import Stream, StreamReset, ValidationResult
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport
from swarm_node.transport.supervisor import Backoff

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(120)]

TOK = build_char_tokenizer()
SOURCE = tasks.TaskSource()
LIMITS = Limits(vocab_size=len(TOK))
PARAMS = FanInParams(shard_size=4, pull_target=3, max_pulls_per_sender=1)  # 3 nodes: one shard
SHARD = digest_topic(0)


def _group(sender: str, node: int, k: int, created_at: float, signal: bool) -> RolloutGroup:
    ids = (5, TOK.eos_token_id)
    completions = (CompletionWire(ids, "x", (-0.5, -0.5), 0.0),
                   CompletionWire(ids, "y", (-0.5, -0.5), 1.0 if signal else 0.0))
    return RolloutGroup(bytes([node, k]) * 8, sender, 0, TaskRefWire(SOURCE.name, SOURCE.config, SOURCE.seed,
                                                                    2 * node + k),
                        completions, tokenizer_hash(TOK), "qwen2", created_at)


@contextlib.asynccontextmanager
async def transports(n: int) -> AsyncIterator[list[LibP2PTransport]]:
    settings = HostSettings(listen=("/ip4/127.0.0.1/tcp/0",))
    cfg = LibP2PConfig(host=settings, restart=Backoff(initial_s=0.1, max_s=1.0), health_interval_s=1.0)
    nodes = [LibP2PTransport(generate(), cfg) for _ in range(n)]
    try:
        await asyncio.gather(*(t.start() for t in nodes))
        yield nodes
    finally:
        await asyncio.gather(*(t.stop() for t in nodes), return_exceptions=True)


async def until(predicate, what: str, timeout: float = 30.0, detail=lambda: "") -> None:  # type: ignore[no-untyped-def]
    async def poll() -> None:
        while not await predicate():
            await asyncio.sleep(0.1)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what} {detail()}") from None


def _senders(got: list[Received], names: dict[str, str]) -> list[str]:
    return sorted(names[r.sender] for r in got if r.group is not None)


def _drops(got: list[Received], names: dict[str, str]) -> list[tuple[str, str]]:
    return sorted((names[r.sender], r.reason) for r in got if r.group is None)


async def test_pulls_push_and_an_oversized_frame_over_libp2p() -> None:
    offset = [0.0]
    async with transports(3) as (ta, tb, tc):
        names = {ta.peer_id: "a", tb.peer_id: "b", tc.peer_id: "c"}
        ex = {name: FaninExchange(t, LIMITS, accept_policy_for(SOURCE), PARAMS, f"seed-{name}".encode(), 3,
                                  clock=lambda: time.time() + offset[0])
              for name, t in zip("abc", (ta, tb, tc), strict=True)}
        finished: dict[str, list[RoundStats]] = {name: [] for name in "abc"}
        for name in "abc":
            ex[name].on_round = finished[name].append
            await ex[name].start()
        await ta.connect(tb.listen_addrs()[0])
        await ta.connect(tc.listen_addrs()[0])
        await tb.connect(tc.listen_addrs()[0])

        async def all_subscribed() -> bool:
            for t in (ta, tb, tc):
                if sum(SHARD in p.topics for p in await t.peers()) != 2:
                    return False
            return True

        def total(name: str, field: str) -> int:
            return sum(getattr(s, field) for s in [*finished[name], ex[name].round_stats])

        await until(all_subscribed, "every node to see the two others on the shard topic")
        now = time.time()
        for i, (name, t) in enumerate(zip("abc", (ta, tb, tc), strict=True)):
            groups = [_group(t.peer_id, i, k, now, signal=name != "c") for k in ((0, 1) if name == "c" else (0,))]
            ex[name].publish(groups)
        for name in "abc":
            assert await ex[name].flush() == 1

        async def digests_heard() -> bool:  # their digests, not any two messages: a pull's answer counts in those
            return all(len(ex[name].shard_neighbours) == 2 for name in "abc")

        await until(digests_heard, "each node to hear its two neighbours' digest batches",
                    detail=lambda: f"{[[*finished[n], ex[n].round_stats] for n in 'abc']}")
        # Peers' rounds are not in step: a digest heard before a node's own first flush was pulled by that flush,
        # the others by its next one. c's groups carry no signal: nobody pulls them, so c's next flush,
        # push_after_s later, pushes each to one neighbour, which takes it while it holds c's digest (until its
        # own next flush).
        got: dict[str, list[Received]] = {name: [] for name in "abc"}
        offset[0] += PARAMS.push_after_s
        assert await ex["c"].flush() == 0

        async def pushes_arrived() -> bool:
            for name in "ab":
                got[name] += ex[name].drain()
            return sum(r.sender == tc.peer_id for name in "ab" for r in got[name]) >= 2

        await until(pushes_arrived, "c's two pushed groups")
        for name in "ab":
            assert await ex[name].flush() == 0

        async def c_pulled_both() -> bool:  # c's pulls (from its flush above) are answered in their own time
            got["c"] += ex["c"].drain()
            return sorted({r.sender for r in got["c"] if r.group is not None}, key=str) == sorted(
                [ta.peer_id, tb.peer_id], key=str)

        await until(c_pulled_both, "c's pulls of a's and b's groups")
        got = {name: got[name] + ex[name].drain() for name in "abc"}
        pushed = sorted((r.group.group_id, name) for name in "ab" for r in got[name]
                        if r.group is not None and r.sender == tc.peer_id)
        assert [gid for gid, _ in pushed] == [bytes([2, 0]) * 8, bytes([2, 1]) * 8]  # each exactly once
        to_a = sum(name == "a" for _, name in pushed)
        assert {name: _senders(got[name], names) for name in "abc"} == {
            "a": sorted(["b"] + ["c"] * to_a), "b": sorted(["a"] + ["c"] * (2 - to_a)), "c": ["a", "b"]}
        assert all(_drops(got[name], names) == [] for name in "abc")
        totals = {name: tuple(total(name, f) for f in ("inbound_messages", "pulls_sent", "pulls_served",
                                                       "pushes_sent")) for name in "abc"}
        # Two digest batches each, one pull response per sender pulled from, one message per pushed group.
        assert totals == {"a": (3 + to_a, 1, 2, 0), "b": (5 - to_a, 1, 2, 0), "c": (4, 2, 0, 2)}

        # A requester announcing a frame past max_message_bytes: reset before a byte of the body is read, unanswered
        # (py-libp2p's yamux may hand the reset to the requester as a plain end of stream).
        for n, protocol in enumerate((PULL_PROTOCOL, PULL_STREAM_PROTOCOL), start=1):
            stream = await ta.open_stream(tb.peer_id, protocol)
            await stream.write(struct.pack(">I", LIMITS.max_message_bytes + 1))
            assert await _answer_bytes(stream) == b""

            async def reported(n: int = n) -> bool:
                return ex["b"].round_stats.by_reason.get("message_too_large", 0) == n

            await until(reported, f"b to report the oversized frame on {protocol}")
        assert ex["b"].round_stats.by_reason == {"message_too_large": 2}
        assert _drops(ex["b"].drain(), names) == [("a", "message_too_large")] * 2


async def _answer_bytes(stream: Stream) -> bytes:
    """What the server sent before it ended or reset the stream."""
    got = b""
    try:
        while chunk := await stream.read():
            got += chunk
    except StreamReset:
        pass
    return got


async def test_unsubscribe_over_libp2p_leaves_the_topic_and_a_new_subscribe_rejoins_it() -> None:
    """b leaves a shard topic (its peers are told; nothing more is delivered to it), then joins it again."""
    async with transports(2) as (ta, tb):
        got: list[bytes] = []
        validated: list[bytes] = []

        def validator(_signer: str, data: bytes) -> ValidationResult:
            validated.append(data)
            return ValidationResult.ACCEPT

        tb.set_validator(SHARD, validator)
        await tb.subscribe(SHARD, lambda d: got.append(d.data))
        await ta.subscribe(SHARD, lambda d: None)
        await ta.connect(tb.listen_addrs()[0])

        async def a_sees_b(subscribed: bool) -> None:
            async def check() -> bool:
                return any(p.peer_id == tb.peer_id and (SHARD in p.topics) == subscribed for p in await ta.peers())
            await until(check, f"a to see b {'on' if subscribed else 'off'} the shard topic")

        async def publish_until_received(prefix: bytes) -> None:
            async def received() -> bool:
                await ta.publish(SHARD, prefix + b"-%d" % len(got))
                await asyncio.sleep(0.3)
                return any(data.startswith(prefix) for data in got)
            await until(received, f"b to receive {prefix!r}")

        await a_sees_b(True)
        await publish_until_received(b"before")
        await tb.unsubscribe(SHARD)
        await a_sees_b(False)
        for i in range(3):
            await ta.publish(SHARD, b"during-%d" % i)
        await asyncio.sleep(2 * HostSettings().heartbeat_s)  # gossip to b would have gone out by now
        assert {data.split(b"-")[0] for data in got + validated} == {b"before"}  # nothing reached b's node
        # Back on the topic (no validator now); gossip may still hand b what it missed (IHAVE/IWANT).
        await tb.subscribe(SHARD, lambda d: got.append(d.data))
        await a_sees_b(True)
        await publish_until_received(b"after")
        assert got[0].startswith(b"before") and any(data.startswith(b"after") for data in got)
        assert {data.split(b"-")[0] for data in validated} == {b"before"}
        assert (ta.stats.restarts, tb.stats.restarts) == (0, 0)
