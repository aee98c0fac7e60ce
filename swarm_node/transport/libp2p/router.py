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
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub


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
    """GossipSub with flood publishing and gossip to backed-off peers; see the module contract. `counters` (the
    host's) counts "published_outside_mesh" (peers our own message went to beyond the mesh's choice) and
    "gossip_to_backed_off" (IHAVEs the library would have left out)."""

    def __init__(self, *args: Any, counters: Counter[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counters: Counter[str] = counters if counters is not None else Counter()

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
        return peers_to_gossip
