"""Small meshes on the digest topics and the IDONTWANT threshold (issue 32: a node's inbound digest copies are
bounded by its mesh on those topics; transport/libp2p/router.py), against the router's own state, no network."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.pubsub.pb import rpc_pb2

from protocol.messages import digest_topic
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.router import MeshBounds, SharingGossipSub, accepts_graft, trim_gossip

SMALL = MeshBounds(degree=3, low=2, high=4, lazy=2)
DIGESTS, ROLLOUTS = digest_topic(0), "swarm-node/rollouts"


def peers(n: int) -> list[ID]:
    return [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(n)]


def router(topic_peers: dict[str, list[ID]], mesh: dict[str, list[ID]]) -> SharingGossipSub:
    r = SharingGossipSub(protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11], degree=6, degree_low=4, degree_high=12,
                         spam_protection_enabled=False, small_prefix=digest_topic(0)[:-1], small_bounds=SMALL,
                         idontwant_min_bytes=1024)
    r.pubsub = SimpleNamespace(peer_topics={t: set(ps) for t, ps in topic_peers.items()})  # type: ignore[assignment]
    for ps in topic_peers.values():
        for p in ps:
            r.peer_protocol[p] = PROTOCOL_ID_V12
    r.mesh = {t: set(ps) for t, ps in mesh.items()}
    return r


def test_the_host_bounds_the_digest_topics_and_only_them() -> None:
    settings = HostSettings()
    assert (settings.small_mesh_degree, settings.small_mesh_degree_low, settings.small_mesh_degree_high,
            settings.small_mesh_lazy, settings.idontwant_min_bytes) == (3, 2, 4, 2, 1024)
    assert (settings.degree, settings.degree_low, settings.degree_high) == (6, 4, 12)  # every other topic's
    r = router({}, {})
    assert r.bounds_of(digest_topic(7)) == SMALL
    assert r.bounds_of(ROLLOUTS) is None


def test_a_graft_past_the_high_bound_is_refused_on_a_small_mesh_only() -> None:
    assert accepts_graft(3, already_meshed=False, bounds=SMALL)
    assert not accepts_graft(4, already_meshed=False, bounds=SMALL)
    assert accepts_graft(4, already_meshed=True, bounds=SMALL)  # a peer already in it: nothing changes
    assert accepts_graft(40, already_meshed=False, bounds=None)  # the library's own rule: it takes them all


def test_a_graft_to_a_full_small_mesh_is_answered_with_a_prune() -> None:
    ps = peers(6)
    r = router({DIGESTS: ps, ROLLOUTS: ps}, {DIGESTS: ps[:4], ROLLOUTS: ps[:4]})
    pruned: list[tuple[str, ID]] = []

    async def emit_prune(topic: str, to_peer: ID, do_px: bool, is_unsubscribe: bool) -> None:
        pruned.append((topic, to_peer))

    r.emit_prune = emit_prune  # type: ignore[method-assign]

    async def graft(topic: str, peer: ID) -> None:
        msg = rpc_pb2.ControlGraft()
        msg.topicID = topic
        await r.handle_graft(msg, peer)

    trio.run(graft, DIGESTS, ps[4])
    trio.run(graft, ROLLOUTS, ps[4])
    assert pruned == [(DIGESTS, ps[4])]
    assert r.mesh[DIGESTS] == set(ps[:4]) and r.mesh[ROLLOUTS] == set(ps[:5])
    assert r.counters["graft_refused_full"] == 1


def test_the_heartbeat_keeps_each_mesh_within_its_own_bounds() -> None:
    ps = peers(8)
    over, under = digest_topic(0), digest_topic(1)
    r = router({over: ps, under: ps, ROLLOUTS: ps}, {over: ps[:7], under: ps[:1], ROLLOUTS: ps})
    to_graft, to_prune = r.mesh_heartbeat()
    assert len(r.mesh[over]) == SMALL.degree  # 7 > high: pruned back to degree
    assert len(r.mesh[under]) == SMALL.degree  # 1 < low: grafted up to degree
    assert r.mesh[ROLLOUTS] == set(ps)  # 8, within the router's 4..12: untouched
    assert sum(topics.count(over) for topics in to_prune.values()) == 4
    assert sum(topics.count(under) for topics in to_graft.values()) == 2
    assert (r.degree, r.degree_low, r.degree_high) == (6, 4, 12)  # the router's own degrees are restored


def test_ihave_on_a_small_mesh_goes_to_at_most_its_lazy_peers() -> None:
    ps = peers(8)
    gossip: dict[Any, dict[str, list[bytes]]] = {p: {DIGESTS: [b"m"], ROLLOUTS: [b"r"]} for p in ps[:6]}
    gossip[ps[6]] = {DIGESTS: [b"m"]}
    assert trim_gossip(gossip, {DIGESTS}, 2, random.Random(0)) == 5
    assert sum(DIGESTS in by_topic for by_topic in gossip.values()) == 2
    assert sum(ROLLOUTS in by_topic for by_topic in gossip.values()) == 6  # other topics keep theirs
    assert all(gossip.values())  # a peer left with nothing to hear is dropped


def test_no_idontwant_for_a_message_under_the_threshold() -> None:
    ps = peers(3)
    r = router({DIGESTS: ps, ROLLOUTS: ps}, {DIGESTS: ps, ROLLOUTS: ps})
    sent: list[bytes] = []

    async def emit_idontwant(msg_ids: list[bytes], to_peer: ID) -> None:
        sent.extend(msg_ids)

    r.emit_idontwant = emit_idontwant  # type: ignore[method-assign]
    for seqno, (topic, size) in enumerate(((DIGESTS, 1023), (ROLLOUTS, 1024))):
        msg = rpc_pb2.Message(from_id=ps[0].to_bytes(), seqno=seqno.to_bytes(8, "big"), data=bytes(size),
                              topicIDs=[topic])
        r.mcache.put(msg)
        trio.run(r._emit_idontwant_for_message, msg.from_id + msg.seqno, [topic])
    assert sent == [ps[0].to_bytes() + (1).to_bytes(8, "big")] * 3  # the 1,024-byte one, to each mesh peer
    assert r.counters["idontwant_skipped"] == 1


def test_the_router_keeps_its_heartbeat_without_adaptive_gossip() -> None:
    # py-libp2p's adaptive gossip (on by default) rates small meshes as poor health and then stretches the
    # heartbeat to 30-60 s on every topic (measured in bench.fanin_real); ours is off unless asked for.
    r = SharingGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12, heartbeat_interval=1)
    assert r.adaptive_gossip_enabled is False and r.heartbeat_interval == 1
    enabled = SharingGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12,
                               heartbeat_interval=1, adaptive_gossip_enabled=True)
    enabled._adapt_heartbeat_parameters(0.3)  # what the library does each heartbeat when health reads critical
    assert enabled.heartbeat_interval == 30
