"""The silence after a flood (issue 27 item 3), on loopback with py-libp2p hosts in this process.

A flood of fresh identities that all GRAFT a node over-fills its mesh; the heartbeat prunes it back, often pruning an
honest neighbour, and both sides then back off from each other for 60 s. These tests prune an honest neighbour the
same way (PRUNE with backoff) and check what still reaches it: with the host's router (`SharingGossipSub`) our own
messages (flood publishing) and messages we forward (gossip to backed-off peers); with py-libp2p's own GossipSub,
nothing until the backoff ends (the cause of the silence, bench/flood_recovery.py).
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
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from swarm_node.transport.libp2p.router import SharingGossipSub

pytestmark = pytest.mark.libp2p
LOOPBACK = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
TOPIC = "flood-recovery-test"
ROUTERS = {"ours": (SharingGossipSub, True), "library": (GossipSub, False)}  # router, the pruned peer hears us


class Node:
    def __init__(self, router: type[GossipSub]) -> None:
        key_pair = create_new_key_pair()
        security = {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)}
        self.host = new_host(key_pair=key_pair, sec_opt=security)
        self.router = router(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                             heartbeat_interval=1, spam_protection_enabled=False)
        self.pubsub = Pubsub(self.host, self.router)
        self.received: list[bytes] = []
        self.id = self.host.get_id()

    async def start(self, stack: AsyncExitStack, nursery: trio.Nursery) -> None:
        await stack.enter_async_context(self.host.run([LOOPBACK]))
        await stack.enter_async_context(background_trio_service(self.pubsub))
        await stack.enter_async_context(background_trio_service(self.router))
        await self.pubsub.wait_until_ready()
        subscription = await self.pubsub.subscribe(TOPIC)
        nursery.start_soon(self._collect, subscription)

    async def _collect(self, subscription: Any) -> None:
        while True:
            self.received.append((await subscription.get()).data)

    async def connect(self, other: Node) -> None:
        await self.host.connect(PeerInfo(other.id, other.host.get_addrs()))

    def meshed_with(self, other: Node) -> bool:
        return other.id in self.router.mesh.get(TOPIC, set())


async def until(check: Any) -> None:
    with trio.fail_after(30):
        while not check():
            await trio.sleep(0.05)


async def prune(node: Node, neighbour: Node) -> None:
    """What the heartbeat does to a neighbour when a flood has over-filled the mesh: out of the mesh, backed off,
    told with a PRUNE (which backs it off from us in turn)."""
    node.router.mesh[TOPIC].discard(neighbour.id)
    node.router._add_back_off(neighbour.id, TOPIC, False)
    await node.router.emit_prune(TOPIC, neighbour.id, False, False)
    await until(lambda: not neighbour.meshed_with(node))


async def arrives(node: Node, data: bytes, within_s: float) -> bool:
    with trio.move_on_after(within_s):
        while data not in node.received:
            await trio.sleep(0.05)
        return True
    return False


async def run_nodes(scenario: Any, *routers: type[GossipSub]) -> Any:
    """Start one node per router (subscribed to TOPIC), run `scenario(*nodes)`, stop them; its result."""
    out: list[Any] = []
    async with trio.open_nursery() as nursery:
        async with AsyncExitStack() as stack:
            nodes = [Node(router) for router in routers]
            for node in nodes:
                await node.start(stack, nursery)
            out.append(await scenario(*nodes))
        nursery.cancel_scope.cancel()
    return out[0]


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_pruned_neighbour_still_gets_what_we_publish(router: str) -> None:
    cls, heard = ROUTERS[router]

    async def scenario(us: Node, neighbour: Node) -> tuple[bool, bool, int]:
        await neighbour.connect(us)
        await until(lambda: us.meshed_with(neighbour) and neighbour.meshed_with(us))
        await prune(us, neighbour)
        await us.pubsub.publish(TOPIC, b"ours, after the prune")
        # backed off for 60 s: no re-graft, so only flood publishing carries it (3 heartbeats are plenty)
        got = await arrives(neighbour, b"ours, after the prune", 20.0 if heard else 3.0)
        outside = getattr(us.router, "counters", {}).get("published_outside_mesh", 0)
        return got, not us.meshed_with(neighbour) and not neighbour.meshed_with(us), outside

    got, still_pruned, outside = trio.run(run_nodes, scenario, cls, SharingGossipSub)
    assert still_pruned
    assert got is heard
    assert outside == (1 if heard else 0)  # ours: the one message, to the one peer outside the mesh


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_pruned_neighbour_still_hears_of_what_we_forward(router: str) -> None:
    cls, heard = ROUTERS[router]

    async def scenario(source: Node, us: Node, neighbour: Node) -> tuple[bool, bool]:
        await us.connect(source)
        await neighbour.connect(us)  # the neighbour knows the source only through us
        await until(lambda: us.meshed_with(source) and us.meshed_with(neighbour))
        await prune(us, neighbour)
        await source.pubsub.publish(TOPIC, b"the source's, forwarded by us")
        await until(lambda: b"the source's, forwarded by us" in us.received)
        # IHAVE at our next heartbeats (1 s), then IWANT: the only way left to the backed-off neighbour
        got = await arrives(neighbour, b"the source's, forwarded by us", 20.0 if heard else 3.0)
        return got, not us.meshed_with(neighbour) and not neighbour.meshed_with(us)

    got, still_pruned = trio.run(run_nodes, scenario, GossipSub, cls, GossipSub)
    assert still_pruned
    assert got is heard
