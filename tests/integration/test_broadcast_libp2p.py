"""swarm_node.policy_sync.broadcast over real libp2p hosts (child processes) on 127.0.0.1: a relayed delta arrives
intact."""

from __future__ import annotations

import asyncio
import random

import pytest

from protocol.messages import TOPIC_POLICY
from swarm_node.identity import generate
from swarm_node.policy_sync.broadcast import PolicyBroadcaster
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport

pytestmark = [pytest.mark.libp2p, pytest.mark.timeout(120)]


async def test_stripe_broadcast_over_libp2p_streams() -> None:
    config = LibP2PConfig(host=HostSettings(listen=("/ip4/127.0.0.1/tcp/0",)))
    transports = [LibP2PTransport(generate(), config) for _ in range(4)]
    nodes = [PolicyBroadcaster(t, chunk_bytes=32 << 10) for t in transports]
    try:
        for node in nodes:
            await node.start()
        await asyncio.gather(*(t.start() for t in transports))
        for i, t in enumerate(transports[1:], start=1):
            for other in transports[:i]:
                await t.connect(other.listen_addrs()[0])

        async def meshed() -> None:
            for t in transports:
                while sum(TOPIC_POLICY in p.topics for p in await t.peers()) < len(transports) - 1:
                    await asyncio.sleep(0.1)

        await asyncio.wait_for(meshed(), 30)
        await asyncio.sleep(1.5)  # a heartbeat: the gossip mesh grafts
        learner, workers = transports[0], transports[1:]
        payload = random.Random(0).randbytes(300_000)
        announce = await nodes[0].publish(learner.peer_id, 1, 0, "dense-bf16", payload, "sha256:x",
                                          [w.peer_id for w in workers])
        for node in nodes[1:]:
            assert await asyncio.wait_for(node.completed.get(), 60) == (announce, payload)
        # stripe:2 over 3 receivers: the learner sends each chunk once, the relays the other 2 copies.
        assert nodes[0].stats.bytes_sent == len(payload)
        assert sum(n.stats.bytes_sent for n in nodes[1:]) == 2 * len(payload)
    finally:
        for node in nodes:
            await node.stop()
        await asyncio.gather(*(t.stop() for t in transports), return_exceptions=True)
