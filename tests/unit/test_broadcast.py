"""swarm_node.policy_sync.broadcast over the in-memory transport: pipelined delivery, corruption, a killed relay,
late joiners, and bad frames from either side of a chunk stream."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator

import pytest

from protocol.chunks import PROTOCOL_ID, ChunkRequest, encode_frame
from protocol.limits import Limits
from protocol.messages import PolicyAnnounce
from swarm_node.policy_sync.broadcast import PolicyBroadcaster
from swarm_node.policy_sync.store import BroadcastError
from swarm_node.transport.base import Stream, StreamHandler
from swarm_node.transport.memory import MemoryHub, MemoryTransport, memory_addr
from swarm_node.transport.shaping import Shaper

pytestmark = pytest.mark.timeout(60)

LEARNER = "learner"
WORKERS = [f"w{i}" for i in range(6)]
STATE = "sha256:" + "ab" * 32


def payload_of(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


class FlippingStream(Stream):
    """Passes frames through and flips one byte in every larger write (the chunk bytes)."""

    def __init__(self, inner: Stream) -> None:
        self.inner, self.remote_peer, self.protocol_id = inner, inner.remote_peer, inner.protocol_id

    async def read(self, max_bytes: int = 1 << 16) -> bytes:
        return await self.inner.read(max_bytes)

    async def write(self, data: bytes) -> None:
        if len(data) > 256:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        await self.inner.write(data)

    async def close(self) -> None:
        await self.inner.close()

    async def reset(self) -> None:
        await self.inner.reset()


class CorruptingTransport(MemoryTransport):
    """A relay whose served chunks arrive corrupted (a bad disk, a bad actor)."""

    async def serve_stream(self, protocol_id: str, handler: StreamHandler) -> None:
        async def corrupting(stream: Stream) -> None:
            await handler(FlippingStream(stream))

        await super().serve_stream(protocol_id, corrupting)


@contextlib.asynccontextmanager
async def swarm(names: list[str], *, corrupt: tuple[str, ...] = (), shaper_bytes_s: float | None = None,
                chunk_bytes: int = 4096, **kwargs: object) -> AsyncIterator[dict[str, PolicyBroadcaster]]:
    """Fully connected nodes, each with a started broadcaster; stops them all at the end."""
    hub = MemoryHub()
    transports = {n: (CorruptingTransport if n in corrupt else MemoryTransport)(hub, n) for n in names}
    nodes = {n: PolicyBroadcaster(t, chunk_bytes=chunk_bytes, stall_s=5.0, announce_wait_s=2.0,
                                  shaper=Shaper(shaper_bytes_s, shaper_bytes_s), **kwargs)  # type: ignore[arg-type]
             for n, t in transports.items()}
    for n, t in transports.items():
        await t.start()
        await nodes[n].start()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            await transports[a].connect(memory_addr(b))
    try:
        yield nodes
    finally:
        for node in nodes.values():
            await node.stop()
        for t in transports.values():
            await t.stop()


async def received(node: PolicyBroadcaster, timeout: float = 20.0) -> tuple[PolicyAnnounce, bytes]:
    return await asyncio.wait_for(node.completed.get(), timeout)


async def publish(learner: PolicyBroadcaster, payload: bytes, receivers: list[str], version: int = 1,
                  **kwargs: object) -> PolicyAnnounce:
    return await learner.publish(LEARNER, version, version - 1, "dense-bf16", payload, STATE, receivers,
                                 **kwargs)  # type: ignore[arg-type]


async def test_every_receiver_gets_the_identical_payload_and_the_source_uploads_it_once() -> None:
    payload = payload_of(100_000)
    async with swarm([LEARNER, *WORKERS]) as nodes:
        announce = await publish(nodes[LEARNER], payload, WORKERS)
        assert (announce.chunk_count, announce.schedule, announce.receivers) == (25, "stripe:2", tuple(WORKERS))
        assert announce.sha256 == hashlib.sha256(payload).digest() and announce.state_sha256 == STATE
        for w in WORKERS:
            got_announce, got = await received(nodes[w])
            assert got_announce == announce and got == payload
            assert nodes[w].held(LEARNER) == [announce] and nodes[w].progress(LEARNER, 1, 0) == (25, 25)
        # Striped relaying: the source sends the payload exactly once (one root per stripe), the relays the rest,
        # and nobody receives a chunk twice.
        assert nodes[LEARNER].stats.bytes_sent == len(payload)
        assert sum(nodes[w].stats.bytes_received for w in WORKERS) == 6 * len(payload)
        assert sum(nodes[w].stats.bytes_sent for w in WORKERS) == 5 * len(payload)
        assert all(nodes[w].stats.bad_chunks == nodes[w].stats.peer_failures == 0 for w in WORKERS)


@pytest.mark.parametrize("schedule", ["chain", "tree:3", "star", "stripe:3"])
async def test_every_registered_schedule_delivers(schedule: str) -> None:
    payload = payload_of(30_000, seed=1)
    async with swarm([LEARNER, *WORKERS[:4]]) as nodes:
        await publish(nodes[LEARNER], payload, WORKERS[:4], schedule=schedule)
        for w in WORKERS[:4]:
            assert (await received(nodes[w]))[1] == payload


async def test_corrupted_chunks_are_detected_and_pulled_from_another_holder() -> None:
    payload = payload_of(100_000, seed=2)
    async with swarm([LEARNER, *WORKERS], corrupt=("w0",)) as nodes:
        await publish(nodes[LEARNER], payload, WORKERS)
        for w in WORKERS:
            assert (await received(nodes[w]))[1] == payload
        # w0 relays stripe 0 to w2 and w4 (stripe 0's tree: w0 -> w2, w4; w2 -> w1, w3; w4 -> w5). Each drops
        # w0 at its first bad chunk and pulls the rest of stripe 0 from w0's parent, the learner.
        bad = {w: nodes[w].stats.bad_chunks for w in WORKERS}
        assert bad == {"w0": 0, "w1": 0, "w2": 1, "w3": 0, "w4": 1, "w5": 0}
        assert nodes["w2"].stats.peer_failures == nodes["w4"].stats.peer_failures == 1


async def test_relay_killed_mid_broadcast_the_rest_still_complete() -> None:
    payload = payload_of(1 << 20, seed=3)
    async with swarm([LEARNER, *WORKERS], shaper_bytes_s=4e6, chunk_bytes=16 << 10) as nodes:
        await publish(nodes[LEARNER], payload, WORKERS)

        async def w0_holds_some() -> tuple[int, int]:
            while (p := nodes["w0"].progress(LEARNER, 1, 0)) is None or p[0] < 6:
                await asyncio.sleep(0.002)
            return p

        held, count = await asyncio.wait_for(w0_holds_some(), 20)
        await nodes["w0"].transport.stop()  # the relay's process dies: its streams reset, it serves no more
        assert held < count  # it died mid-broadcast
        for w in WORKERS[1:]:
            assert (await received(nodes[w]))[1] == payload
        assert nodes["w0"].completed.empty()
        # w0's children in stripe 0 (w2, w4) lost their parent and re-attached; their subtrees never noticed.
        assert nodes["w2"].stats.peer_failures >= 1 and nodes["w4"].stats.peer_failures >= 1
        assert nodes["w1"].stats.peer_failures == nodes["w3"].stats.peer_failures == 0


async def test_late_joiner_fetches_a_kept_version_and_only_trusts_the_owner_for_announces() -> None:
    payload = payload_of(50_000, seed=4)
    async with swarm([LEARNER, *WORKERS[:3], "late"]) as nodes:
        announce = await publish(nodes[LEARNER], payload, WORKERS[:3])
        for w in WORKERS[:3]:
            await received(nodes[w])
        late = nodes["late"]
        late._versions.clear()  # as if it had joined after the announce was gossiped
        assert await late.catalog("w1", LEARNER) == [announce]
        with pytest.raises(BroadcastError, match="no trusted announce"):
            await late.fetch(LEARNER, 1, ["w1", "w2"], base_version=0)  # a third party's announce is not trusted
        got_announce, got = await late.fetch(LEARNER, 1, ["w1", "w2", LEARNER], base_version=0)
        assert got_announce == announce and got == payload
        assert late.stats.bytes_received == len(payload) and late.completed.empty()
        assert nodes["w1"].stats.served_chunks > 0 and nodes["w2"].stats.served_chunks > 0
        # Version 5 as a delta (relayed) and as a snapshot published with no receivers (only announced and kept):
        # two payloads. A joiner with no base fetches the snapshot, the default.
        delta, snapshot = payload_of(20_000, seed=5), payload_of(30_000, seed=6)
        await nodes[LEARNER].publish(LEARNER, 5, 4, "topk", delta, STATE, WORKERS[:3])
        await nodes[LEARNER].publish(LEARNER, 5, 5, "snapshot", snapshot, STATE, [])
        assert (await late.fetch(LEARNER, 5, [LEARNER]))[1] == snapshot
        assert (await late.fetch(LEARNER, 5, [LEARNER], base_version=4))[1] == delta
        catalog = await late.catalog(LEARNER, LEARNER)
        assert [(a.version, a.base_version) for a in catalog] == [(1, 0), (5, 4), (5, 5)]
        with pytest.raises(ValueError, match="already published"):
            await nodes[LEARNER].publish(LEARNER, 5, 5, "snapshot", snapshot, STATE, [])


async def test_nodes_keep_the_newest_versions() -> None:
    async with swarm([LEARNER, "w0"], keep=3) as nodes:
        for version in range(1, 6):
            await publish(nodes[LEARNER], payload_of(5000, seed=version), ["w0"], version=version)
            await received(nodes["w0"])
        assert [a.version for a in nodes["w0"].held(LEARNER)] == [3, 4, 5]
        assert [a.version for a in nodes[LEARNER].held(LEARNER)] == [3, 4, 5]
        assert nodes["w0"].payload(LEARNER, 5, 4) == payload_of(5000, seed=5)
        assert nodes["w0"].payload(LEARNER, 2, 1) is None


async def raw_exchange(client: MemoryTransport, server: str, data: bytes) -> bytes:
    stream = await client.open_stream(server, PROTOCOL_ID)
    await stream.write(data)
    await stream.close()
    out = b""
    while part := await stream.read(1 << 16):
        out += part
    return out


async def test_bad_requests_get_an_error_frame_and_the_server_keeps_serving() -> None:
    async with swarm([LEARNER, "w0"]) as nodes:
        await publish(nodes[LEARNER], payload_of(10_000), ["w0"])
        await received(nodes["w0"])
        raw = MemoryTransport(nodes[LEARNER].transport.hub, "raw")  # type: ignore[attr-defined]
        await raw.start()
        await raw.connect(memory_addr(LEARNER))
        oversized = await raw_exchange(raw, LEARNER, b"\xff\xff\xff\xff" + b"x" * 100)
        assert oversized.startswith(b"\x00\x00\x00") and b"frame_too_large" in oversized
        garbage = await raw_exchange(raw, LEARNER, b"\x00\x00\x00\x03\xc1\xc1\xc1")
        assert b"bad_frame" in garbage
        out_of_range = await raw_exchange(raw, LEARNER, encode_frame(ChunkRequest(LEARNER, 1, 0, (0, 99))))
        assert b"bad_index" in out_of_range
        unknown = await raw_exchange(raw, LEARNER, encode_frame(ChunkRequest(LEARNER, 1, 1, (0,))))  # no snapshot
        assert b"unknown_version" in unknown
        assert dict(nodes[LEARNER].stats.protocol_errors) == {"frame_too_large": 1, "bad_frame": 1, "bad_index": 1}
        # Still serving: a joiner fetches the version.
        assert (await nodes["w0"].fetch(LEARNER, 1, [LEARNER], base_version=0))[1] == payload_of(10_000)
        await raw.stop()


async def test_a_parent_sending_an_oversized_frame_is_dropped_and_its_children_complete() -> None:
    payload = payload_of(40_000, seed=6)
    names = [LEARNER, "evil", "w1", "w2", "w3", "w4"]
    async with swarm(names) as nodes:
        evil = nodes["evil"]
        await evil.stop()

        async def oversized(stream: Stream) -> None:
            await stream.write(b"\x7f\xff\xff\xff")
            await asyncio.sleep(0.01)

        await evil.transport.serve_stream(PROTOCOL_ID, oversized)
        # stripe:2 over [evil, w1, w2, w3, w4]: evil roots stripe 0 with children w2 and w4.
        await publish(nodes[LEARNER], payload, names[1:])
        for w in ("w1", "w2", "w3", "w4"):
            assert (await received(nodes[w]))[1] == payload
        assert nodes["w2"].stats.protocol_errors["frame_too_large"] == 1
        assert nodes["w4"].stats.protocol_errors["frame_too_large"] == 1


async def test_publish_checks_its_inputs() -> None:
    async with swarm([LEARNER, "w0"], limits=Limits(max_message_bytes=2048)) as nodes:
        with pytest.raises(ValueError, match="not owned"):
            await nodes[LEARNER].publish("w0/main", 1, 0, "dense", b"x", STATE, ["w0"])
        with pytest.raises(ValueError):
            await nodes[LEARNER].publish(LEARNER, 1, 0, "dense", b"x", STATE, ["w0"], schedule="ring")
        with pytest.raises(BroadcastError, match="message_too_large"):  # 100 chunk digests do not fit 2 KiB
            await nodes[LEARNER].publish(LEARNER, 1, 0, "dense", payload_of(400_000), STATE, ["w0"])
    with pytest.raises(ValueError):
        PolicyBroadcaster(MemoryTransport(MemoryHub(), "x"), schedule="stripe:0")


async def test_a_failed_fetch_can_be_retried_with_other_holders() -> None:
    payload = payload_of(20_000, seed=7)
    async with swarm([LEARNER, "w0", "bystander", "late"]) as nodes:
        await publish(nodes[LEARNER], payload, ["w0"])
        await received(nodes["w0"])
        # The bystander saw the announce but holds nothing: it refuses, and no other holder was named.
        with pytest.raises(BroadcastError, match="no live holder"):
            await nodes["late"].fetch(LEARNER, 1, ["bystander"], base_version=0)
        assert (await nodes["late"].fetch(LEARNER, 1, ["bystander", "w0"], base_version=0))[1] == payload
        assert nodes["w0"].stats.served_chunks == 5 and nodes[LEARNER].stats.served_chunks == 5
