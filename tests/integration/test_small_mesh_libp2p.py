"""Small meshes on the digest topics over real py-libp2p hosts in this process (issue 32: the router of
transport/libp2p/router.py as the host runs it; tests/unit/test_small_mesh.py checks its rules one by one).

Seven spokes that each know only the hub all GRAFT it on a digest topic and on an ordinary one: the hub keeps the
digest topic's mesh within HostSettings' small_mesh bounds (refusing the GRAFTs past the high bound) while the
ordinary topic takes all seven, and a small digest batch costs no IDONTWANT.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import multiaddr
import pytest
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from protocol.messages import digest_topic
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.router import MeshBounds, SharingGossipSub

pytestmark = pytest.mark.libp2p
LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
DIGESTS, ROLLOUTS = digest_topic(0), "small-mesh-test/rollouts"
SETTINGS = HostSettings()
BOUNDS = MeshBounds(SETTINGS.small_mesh_degree, SETTINGS.small_mesh_degree_low, SETTINGS.small_mesh_degree_high,
                    SETTINGS.small_mesh_lazy)


class Node:
    def __init__(self) -> None:
        key_pair = create_new_key_pair()
        security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
        self.host = new_host(key_pair=key_pair, sec_opt=security)
        self.router = SharingGossipSub(
            protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=SETTINGS.degree, degree_low=SETTINGS.degree_low,
            degree_high=SETTINGS.degree_high, heartbeat_interval=1, spam_protection_enabled=False,
            small_prefix=SETTINGS.small_mesh_prefix, small_bounds=BOUNDS,
            idontwant_min_bytes=SETTINGS.idontwant_min_bytes)
        self.pubsub = Pubsub(self.host, self.router)
        self.id = self.host.get_id()

    async def start(self, stack: AsyncExitStack) -> None:
        await stack.enter_async_context(self.host.run([LOOPBACK]))
        await stack.enter_async_context(background_trio_service(self.pubsub))
        await stack.enter_async_context(background_trio_service(self.router))
        await self.pubsub.wait_until_ready()
        for topic in (DIGESTS, ROLLOUTS):
            await self.pubsub.subscribe(topic)

    def mesh(self, topic: str) -> set[Any]:
        return set(self.router.mesh.get(topic, set()))


async def until(check: Any, within_s: float = 30.0) -> None:
    with trio.fail_after(within_s):
        while not check():
            await trio.sleep(0.05)


def test_the_hub_keeps_its_digest_mesh_small_and_takes_every_graft_elsewhere() -> None:
    async def scenario() -> tuple[int, int, int, int, int]:
        async with AsyncExitStack() as stack:
            hub, spokes = Node(), [Node() for _ in range(7)]
            for node in (hub, *spokes):
                await node.start(stack)
            for spoke in spokes:
                await spoke.host.connect(PeerInfo(hub.id, hub.host.get_addrs()))
            await until(lambda: len(hub.mesh(ROLLOUTS)) == 7)  # every spoke grafted the hub on both topics
            await until(lambda: sum(hub.id in s.mesh(DIGESTS) for s in spokes) <= BOUNDS.high)
            await trio.sleep(3 * SETTINGS.heartbeat_s)  # heartbeats: nothing grows past the bound again
            await spokes[0].pubsub.publish(DIGESTS, b"a digest batch under the IDONTWANT threshold")
            await trio.sleep(1.0)
            meshed = sum(hub.id in s.mesh(DIGESTS) for s in spokes)
            return (len(hub.mesh(DIGESTS)), meshed, len(hub.mesh(ROLLOUTS)),
                    hub.router.counters["graft_refused_full"], hub.router.counters["idontwant_skipped"])

    digest_mesh, spokes_meshed, rollout_mesh, refused, skipped = trio.run(scenario)
    assert BOUNDS.low <= digest_mesh <= BOUNDS.high
    assert spokes_meshed == digest_mesh  # a refused spoke took the PRUNE: both sides agree on the mesh
    assert rollout_mesh == 7
    assert refused >= 7 - BOUNDS.high
    assert skipped >= 1  # the hub forwarded the small batch without IDONTWANT
