"""Pubsub peer bookkeeping when our outbound gossip stream to a peer dies (issue 27, item 4).

Two py-libp2p 0.8.1 faults made the exchange one-way once DCUtR closed the relayed connection under a direct one:
- the peer's subscriptions arrive once, on the peer's own stream to us, but the library forgets them whenever *our*
  stream to the peer dies, also while the peer's stream to us lives on; we then publish nothing to that peer.
  `GuardedPubsub` keeps them while that inbound stream is open;
- a failed write on our old stream (on the closed relayed connection) removed the new stream the library had just
  opened on the direct connection, for good. `GuardedPubsub` ends a peer only for a failure on its current stream,
  and `reopen_streams` re-opens a stream to a peer that still talks to us when we hold none.
A real GuardedPubsub and GossipSub run here (trio), with no network: the streams are stand-ins with the attributes
the decisions read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from libp2p import new_host
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.network.stream.exceptions import StreamClosed
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from swarm_node.transport.libp2p.guards import GuardedPubsub, inbound_is_live

TOPICS = ("swarm-node/policy/1", "swarm-node/rollouts/1")


def _stream(peer: ID, stream_closed: bool = False, conn_closed: bool = False) -> Any:
    written: list[bytes] = []

    async def reset() -> None:
        return None

    async def write(data: bytes) -> None:
        if stream_closed or conn_closed:
            raise StreamClosed("closed")
        written.append(data)
    return SimpleNamespace(is_closed=stream_closed, reset=reset, write=write, written=written,
                           muxed_conn=SimpleNamespace(is_closed=conn_closed, peer_id=peer))


def _run(body: Callable[[GuardedPubsub, ID], Awaitable[None]]) -> None:
    """Run `body(pubsub, peer)` with a started GuardedPubsub in which `peer` subscribed to TOPICS and has a
    registered outbound stream."""
    async def main() -> None:
        router = GossipSub(protocols=[PROTOCOL_ID_V12], degree=2, degree_low=1, degree_high=3)

        async def accept(*_args: Any) -> None:
            return None
        pubsub = GuardedPubsub(new_host(), router, app_validate=accept)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            peer = ID.from_pubkey(create_new_key_pair().public_key)
            for topic in TOPICS:
                pubsub.handle_subscription(peer, rpc_pb2.RPC.SubOpts(subscribe=True, topicid=topic))
            pubsub.peers[peer] = _stream(peer)
            await body(pubsub, peer)
    trio.run(main)


def _subscriptions(pubsub: GuardedPubsub, peer: ID) -> list[str]:
    return sorted(topic for topic, members in pubsub.peer_topics.items() if peer in members)


def test_subscriptions_announced_on_a_live_inbound_stream_survive_our_outbound_stream_dying() -> None:
    async def body(pubsub: GuardedPubsub, peer: ID) -> None:
        pubsub._inbound[peer] = _stream(peer)  # the peer's stream to us, on the direct connection
        pubsub._handle_dead_peer(peer)  # our stream to it (on the relayed connection) died
        assert peer not in pubsub.peers  # the library re-opens ours on a live connection
        assert _subscriptions(pubsub, peer) == list(TOPICS)
        assert pubsub._peer_subscription_count[peer] == 2
        assert pubsub.counters["subscriptions_kept"] == 1
    _run(body)


def test_subscriptions_are_forgotten_without_a_live_inbound_stream() -> None:
    for inbound in (None, "conn_closed", "stream_closed"):
        async def body(pubsub: GuardedPubsub, peer: ID, inbound: str | None = inbound) -> None:
            if inbound is not None:
                pubsub._inbound[peer] = _stream(peer, stream_closed=inbound == "stream_closed",
                                                conn_closed=inbound == "conn_closed")
            pubsub._handle_dead_peer(peer)
            assert _subscriptions(pubsub, peer) == [], inbound
            assert peer not in pubsub._peer_subscription_count and pubsub.counters["subscriptions_kept"] == 0
        _run(body)


def test_an_inbound_stream_dropped_for_garbage_takes_its_subscriptions_with_it() -> None:
    async def body(pubsub: GuardedPubsub, peer: ID) -> None:
        stream = _stream(peer)
        pubsub._inbound[peer] = stream
        await pubsub._drop_stream(stream, peer)  # what an undecodable frame on it leads to
        assert _subscriptions(pubsub, peer) == [] and peer not in pubsub._inbound
    _run(body)


def test_inbound_is_live() -> None:
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    assert inbound_is_live(_stream(peer)) is True
    assert inbound_is_live(_stream(peer, stream_closed=True)) is False
    assert inbound_is_live(_stream(peer, conn_closed=True)) is False
    assert inbound_is_live(None) is False


def test_a_failed_write_on_a_replaced_stream_leaves_the_new_stream_registered() -> None:
    async def body(pubsub: GuardedPubsub, peer: ID) -> None:
        old, new = _stream(peer, conn_closed=True), pubsub.peers[peer]  # new: on the direct connection
        rpc = rpc_pb2.RPC(subscriptions=[rpc_pb2.RPC.SubOpts(subscribe=True, topicid="t")])
        assert await pubsub.write_msg(old, rpc) is False
        assert pubsub.peers[peer] is new and pubsub.counters["stale_stream_write"] == 1
        assert await pubsub.write_msg(new, rpc) is True
        assert new.written == [bytes([len(rpc.SerializeToString())]) + rpc.SerializeToString()]
        pubsub.peers[peer] = failing = _stream(peer, conn_closed=True)
        assert await pubsub.write_msg(failing, rpc) is False  # its current stream: the peer ends, as before
        assert peer not in pubsub.peers and pubsub.counters["stale_stream_write"] == 1
    _run(body)


def test_a_stream_is_reopened_to_a_peer_that_talks_to_us_when_we_hold_none() -> None:
    async def body(pubsub: GuardedPubsub, peer: ID) -> None:
        pubsub._inbound[peer] = _stream(peer)
        assert pubsub.reopen_streams() == []  # we hold a stream to it
        del pubsub.peers[peer]
        assert pubsub.reopen_streams() == [peer]
        assert peer in pubsub._peer_stream_retries_pending
        assert pubsub.reopen_streams() == []  # one opening at a time
        await trio.testing.wait_all_tasks_blocked()  # no connection here: the library's retry gives up
        assert peer not in pubsub._peer_stream_retries_pending and not pubsub._opening
        release = trio.Event()

        async def opening(_peer: ID) -> None:
            await release.wait()
        pubsub._handle_new_peer = opening  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pubsub._handle_new_peer_with_retry, peer)  # the library's own first opening
            await trio.testing.wait_all_tasks_blocked()
            assert pubsub._opening[peer] == 1 and pubsub.reopen_streams() == []
            release.set()
        assert not pubsub._opening
        assert pubsub.reopen_streams() == [peer]
        pubsub._inbound[peer] = _stream(peer, conn_closed=True)
        await trio.testing.wait_all_tasks_blocked()
        assert pubsub.reopen_streams() == []  # it no longer talks to us: nothing to re-open
        assert pubsub.counters["pubsub_stream_reopened"] == 2
    _run(body)
