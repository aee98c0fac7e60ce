"""The network host's gossipsub router: py-libp2p's GossipSub with two delivery rules the library leaves out.

Runs inside the network host (trio). Contract: `SharingGossipSub` is py-libp2p's `GossipSub` with
- Flood publishing (gossipsub v1.1 `floodPublish`, on by default in go-libp2p): a message this host publishes itself
  goes to every gossipsub peer on its topic, not only to the topic's mesh; `GossipSub.publish` still drops the peers
  whose score is under publish_threshold. Messages we forward still go to the mesh only.
- Gossip to backed-off peers: each heartbeat's IHAVE also goes to the topic's peers outside the mesh that are in
  prune backoff and whose score allows gossip (`backed_off_gossip`); py-libp2p 0.8.1 leaves them out, the spec and
  go-libp2p do not.
Why: a flood of fresh identities that all GRAFT us over-fills the mesh; the heartbeat prunes it back to `degree`,
often pruning the honest peers, and a pruned peer is backed off for 60 s on both sides. Without these rules it then
received nothing from us, neither our messages nor gossip about them, until the backoff ended (measured:
bench/flood_recovery.py, docs/MEASUREMENTS.md).

Two more rules keep small, frequent messages cheap (bounded fan-in's digest batches, docs/SWARM_SCALE.md):
- Small meshes on the topics named by `small_prefix` (`MeshBounds`): the mesh is kept within `low`..`high`
  (`degree` grafted on joining and when under `low`), a GRAFT that would take it past `high` is answered with a PRUNE
  (go-libp2p's rule; py-libp2p accepts every GRAFT, so meshes filled to the router's `degree_high`), and each
  heartbeat's IHAVE goes to at most `lazy` of its peers outside the mesh (py-libp2p: at least 6); no opportunistic
  grafting there (py-libp2p's, every heartbeat, can take the mesh past `high` just after pruning). A node receives
  about one copy of a message per mesh peer, so the mesh bound is what bounds its inbound copies.
- No IDONTWANT for a message whose data is under `idontwant_min_bytes` (gossipsub v1.2's threshold, 1 KiB in
  go-libp2p): py-libp2p sends one to every mesh peer for every message, which for a message smaller than an RPC
  costs more than the copy it might save.
- No "adaptive gossip" (py-libp2p's own extension, on by default): it rates the network's health by comparing each
  mesh with the router's degree, so the small meshes read as unhealthy, and it then stretched the heartbeat from
  our 1 s to 30-60 s on every topic, stalling mesh top-ups, gossip, the message cache's shift, score decay
  (scoring.py assumes 1 s heartbeats) and backoff expiry (measured: bench.fanin_real, docs/SWARM_SCALE.md).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2


@dataclass(frozen=True)
class MeshBounds:
    """One topic family's mesh: `degree` peers grafted, kept within `low`..`high`; IHAVE to `lazy` others."""

    degree: int
    low: int
    high: int
    lazy: int


def accepts_graft(mesh_size: int, already_meshed: bool, bounds: MeshBounds | None) -> bool:
    """Whether a GRAFT is taken by our rules (the library's own checks, backoff and score, come after)."""
    return bounds is None or already_meshed or mesh_size < bounds.high


def trim_gossip(peers_to_gossip: dict[Any, dict[str, list[bytes]]], topics: Set[str], lazy: int,
                rng: random.Random) -> int:
    """Keep each of `topics`' IHAVE for at most `lazy` of the peers chosen for it (a random draw); peers left with
    nothing are removed. Returns the IHAVEs left out."""
    dropped = 0
    for topic in sorted(topics):
        chosen = sorted((peer for peer, by_topic in peers_to_gossip.items() if topic in by_topic), key=str)
        for peer in (set(chosen) - set(rng.sample(chosen, min(lazy, len(chosen))))):
            del peers_to_gossip[peer][topic]
            dropped += 1
    for peer in [p for p, by_topic in peers_to_gossip.items() if not by_topic]:
        del peers_to_gossip[peer]
    return dropped


def backed_off_gossip(mesh: Mapping[str, Set[ID]], topic_peers: Mapping[str, Set[ID]],
                      back_off: Mapping[str, Mapping[ID, float]], now: float,
                      allow_gossip: Any) -> dict[ID, list[str]]:
    """Peer -> topics whose IHAVE the library's heartbeat leaves out: peers on a topic we are meshed in, outside its
    mesh, in backoff until after `now`, and allowed gossip (`allow_gossip(peer, [topic])`)."""
    out: dict[ID, list[str]] = {}
    for topic, members in mesh.items():
        until = back_off.get(topic, {})
        for peer in topic_peers.get(topic, ()):
            if peer not in members and until.get(peer, 0) > now and allow_gossip(peer, [topic]):
                out.setdefault(peer, []).append(topic)
    return out


class SharingGossipSub(GossipSub):
    """GossipSub with flood publishing, gossip to backed-off peers, small meshes on the `small_prefix` topics and an
    IDONTWANT threshold; see the module contract. `counters` (the host's) counts "published_outside_mesh" (peers our
    own message went to beyond the mesh's choice), "gossip_to_backed_off" (IHAVEs the library would have left out),
    "graft_refused_full" (GRAFTs refused at `small_bounds.high`), "gossip_trimmed" (IHAVEs past `small_bounds.lazy`)
    and "idontwant_skipped" (messages under `idontwant_min_bytes`)."""

    def __init__(self, *args: Any, counters: Counter[str] | None = None, small_prefix: str = "",
                 small_bounds: MeshBounds | None = None, idontwant_min_bytes: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **{"adaptive_gossip_enabled": False, **kwargs})
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.small_prefix, self.small_bounds = small_prefix, small_bounds
        self.idontwant_min_bytes = idontwant_min_bytes
        self._rng = random.Random()

    def bounds_of(self, topic: str) -> MeshBounds | None:
        """The small-mesh bounds of `topic`, or None when the router's own degrees apply."""
        if self.small_bounds is not None and self.small_prefix and topic.startswith(self.small_prefix):
            return self.small_bounds
        return None

    async def join(self, topic: str) -> None:
        bounds = self.bounds_of(topic)
        if bounds is None or self.pubsub is None or topic in self.mesh:
            await super().join(topic)
            return
        self.mesh[topic] = set()
        chosen = (self._get_in_topic_gossipsub_peers_from_minus(topic, bounds.degree, set(), True)
                  if topic in self.pubsub.peer_topics else [])
        for peer in chosen:
            self.mesh[topic].add(peer)
            self._notify_mesh_peer_added(peer, topic)
            await self.emit_graft(topic, peer)
        self.fanout.pop(topic, None)
        self.time_since_last_publish.pop(topic, None)

    async def on_peer_subscribed(self, peer_id: Any, topic: str) -> None:
        bounds = self.bounds_of(topic)
        if bounds is not None and len(self.mesh.get(topic, ())) >= bounds.low:
            return  # the library's first-fill goes to its own degree_low
        await super().on_peer_subscribed(peer_id, topic)

    def mesh_heartbeat(self) -> Any:
        """The library's mesh maintenance, run once with the router's degrees on the other topics and once with
        `small_bounds` on the small-mesh topics (the library reads its degrees from attributes, not per topic)."""
        whole = self.mesh
        small = {topic: peers for topic, peers in whole.items() if self.bounds_of(topic) is not None}
        if not small or self.small_bounds is None:
            return super().mesh_heartbeat()
        b = self.small_bounds
        saved = (self.degree, self.degree_low, self.degree_high, self.adaptive_degree_low, self.adaptive_degree_high)
        try:
            self.mesh = {topic: peers for topic, peers in whole.items() if topic not in small}
            to_graft, to_prune = super().mesh_heartbeat()
            # Fixed bounds: the library's health adaptation widens them up to degree_high + 4, which is what a
            # small mesh exists to prevent.
            self.degree, self.degree_low, self.degree_high = b.degree, b.low, b.high
            self.adaptive_degree_low, self.adaptive_degree_high = b.low, b.high
            self.mesh = small
            more_graft, more_prune = super().mesh_heartbeat()
        finally:
            self.mesh = whole
            (self.degree, self.degree_low, self.degree_high, self.adaptive_degree_low,
             self.adaptive_degree_high) = saved
        for out, more in ((to_graft, more_graft), (to_prune, more_prune)):
            for peer, topics in more.items():
                out[peer].extend(topics)
        return to_graft, to_prune

    def _perform_opportunistic_grafting(self, topic: str, peers_to_graft: Any) -> int:
        if self.bounds_of(topic) is not None:
            return 0  # py-libp2p's runs every heartbeat, and grafts past `high` after the prune has counted the mesh
        return int(super()._perform_opportunistic_grafting(topic, peers_to_graft))

    async def handle_graft(self, graft_msg: rpc_pb2.ControlGraft, sender_peer_id: Any) -> None:
        topic = graft_msg.topicID
        mesh = self.mesh.get(topic)
        if mesh is not None and not accepts_graft(len(mesh), sender_peer_id in mesh, self.bounds_of(topic)):
            self.counters["graft_refused_full"] += 1
            await self.emit_prune(topic, sender_peer_id, False, False)
            return
        await super().handle_graft(graft_msg, sender_peer_id)

    async def _emit_idontwant_for_message(self, msg_id: bytes, topic_ids: Iterable[str]) -> None:
        msg = self.mcache.get(msg_id)  # put there just before (default message ids: the cache's own)
        if msg is not None and len(msg.data) < self.idontwant_min_bytes:
            self.counters["idontwant_skipped"] += 1
            return
        await super()._emit_idontwant_for_message(msg_id, topic_ids)

    def _get_peers_to_send(self, topic_ids: Iterable[str], msg_forwarder: ID, origin: ID,
                           msg_id: bytes | None = None) -> Iterator[ID]:
        topic_ids = list(topic_ids)
        chosen = set(super()._get_peers_to_send(topic_ids, msg_forwarder, origin, msg_id))
        if self.pubsub is not None and origin == self.pubsub.my_id:  # our own message: every topic peer
            everyone = {p for topic in topic_ids for p in self.pubsub.peer_topics.get(topic, ())
                        if p in self.peer_protocol and p != origin}
            self.counters["published_outside_mesh"] += len(everyone - chosen)
            chosen |= everyone
        yield from chosen

    def gossip_heartbeat(self) -> Any:
        peers_to_gossip = super().gossip_heartbeat()
        if self.pubsub is None:
            return peers_to_gossip
        scorer = self.scorer
        allow = scorer.allow_gossip if scorer is not None else (lambda _peer, _topics: True)
        extra = backed_off_gossip(self.mesh, self.pubsub.peer_topics, self.back_off, time.time(), allow)
        for peer, topics in extra.items():
            for topic in topics:
                msg_ids = self.mcache.window(topic)
                if msg_ids:
                    peers_to_gossip[peer].setdefault(topic, list(msg_ids))
                    self.counters["gossip_to_backed_off"] += 1
        if self.small_bounds is not None:
            small = {topic for topic in self.mesh if self.bounds_of(topic) is not None}
            self.counters["gossip_trimmed"] += trim_gossip(peers_to_gossip, small, self.small_bounds.lazy, self._rng)
        return peers_to_gossip
