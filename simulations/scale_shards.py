"""Digest gossip inside one shard of the bounded design, counted per link rather than message by message.

Contract (issue 32 lets the bounded design aggregate message counts per link at N = 10,000; we do it at every N so
that one method measures every N):
- `Shard(members, gossip, rng)`: one shard topic among `members` (node slots): a mesh (a random regular graph of
  `gossip.degree`), topic peers outside the mesh (`gossip.connect` topic peers in all) and lazy peers (at most
  `gossip.lazy` of those, which get IHAVE). `join(v)` / `leave(v)` change it as
  gossipsub would (a joiner grafts `degree` members; a member left under `degree - 1` mesh peers grafts one more)
  and return the GRAFT/PRUNE messages as (from, to) pairs.
- Propagation follows the flood simulator's rules (simulations/scale_flood.py, checked there against an event
  simulation): the origin sends its message to all its topic peers; a member forwards its first copy to its mesh
  peers but the forwarder and the origin; IDONTWANT goes to every mesh peer on a first copy and arrives too late to
  stop anything. It rides in the RPC that forwards the data to that peer, else it is an RPC of its own (the host
  merges the RPCs queued for one peer); an RPC without data carries py-libp2p's signed sender record. Per origin
  a breadth-first search gives each member's hop level and first forwarder (the lowest slot one level up), hence
  each member's copies in and out exactly; arrival = publish time + level x `hop_s`.
- `deliver(publishers, offsets, msg_bytes, hop_s, setup)` -> `Delivery`: each member's arrival time of each
  publisher's message and the RPCs and bytes in and out per member (data copies, IDONTWANT, IHAVE with the ids
  of the last `window` heartbeats to each lazy peer; every member sees the same heartbeats with ids, those of the
  publish offsets); `in_by_kind` splits the RPCs in: "digest_copy", "idontwant" (RPCs of their own), "ihave".
- `SHARD_GOSSIP`: the host's gossipsub on a digest topic (its small meshes); `HOST_GOSSIP_BEFORE`: py-libp2p's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from simulations.scale_model import (
    CONTROL_BYTES,
    GOSSIP_OVERHEAD,
    MSG_ID_BYTES,
    SENDER_RECORD_BYTES,
    GossipParams,
    ScaleSetup,
    regular_graph,
)
from swarm_node.transport.libp2p.ipc import HostSettings

# The host's gossipsub on a shard topic (transport/libp2p/router.py's small meshes, ipc.HostSettings.small_mesh_*):
# a node grafts `small_mesh_degree` peers and takes GRAFTs up to `small_mesh_degree_high`, so meshes fill to that
# bound (taken as every node's degree: the upper bound); its other topic peers (`GossipParams().connect` in all,
# the connections bench.fanin_real arranges) get its own digests (flood publish), `small_mesh_lazy` of them IHAVE;
# no IDONTWANT for a digest batch (under `idontwant_min_bytes`). Before the small meshes py-libp2p accepted every
# GRAFT and meshes filled to `degree_high` (12): `HOST_GOSSIP_BEFORE`, as measured at N = 16 (no node got an IHAVE).
_HOST = HostSettings()
SHARD_GOSSIP = GossipParams(degree=_HOST.small_mesh_degree_high, connect=GossipParams().connect,
                            lazy=_HOST.small_mesh_lazy, idontwant_min_bytes=_HOST.idontwant_min_bytes)
HOST_GOSSIP_BEFORE = GossipParams(degree=_HOST.degree_high, connect=_HOST.degree_high, lazy=0)


@dataclass
class Delivery:
    arrival: np.ndarray  # (publishers, members): seconds into the round (inf: its own message)
    in_msgs: np.ndarray  # (members,)
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    in_by_kind: dict[str, np.ndarray]  # in_msgs split by kind (they add up to it)


class Shard:
    def __init__(self, members: list[int], gossip: GossipParams, rng: random.Random) -> None:
        self.gossip, self.rng = gossip, rng
        self.members = list(members)
        self.mesh = regular_graph(self.members, gossip.degree, rng)
        extra = (regular_graph(self.members, gossip.connect - gossip.degree, rng, avoid=self.mesh)
                 if gossip.connect > gossip.degree else {v: set() for v in self.members})
        self.outside = {v: extra[v] - self.mesh[v] for v in self.members}  # topic peers outside the mesh
        self.lazy = {v: set(sorted(self.outside[v])[:gossip.lazy]) for v in self.members}
        self._tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def join(self, v: int) -> list[tuple[int, int]]:
        others = [u for u in self.members if u != v]
        self.members.append(v)
        picks = self.rng.sample(others, min(self.gossip.degree, len(others)))
        self.mesh[v] = set(picks)
        for u in picks:
            self.mesh[u].add(v)
        rest = [u for u in others if u not in self.mesh[v]]
        self.lazy[v] = set(self.rng.sample(rest, min(self.gossip.lazy, len(rest))))
        self.outside[v] = set(self.lazy[v])
        self._tables = None
        return [(v, u) for u in picks]

    def leave(self, v: int) -> list[tuple[int, int]]:
        self.members.remove(v)
        grafts: list[tuple[int, int]] = []
        for u in self.mesh.pop(v, set()):
            self.mesh[u].discard(v)
            spare = [w for w in self.members if w != u and w not in self.mesh[u]]
            if len(self.mesh[u]) < self.gossip.degree - 1 and spare:
                w = self.rng.choice(spare)
                self.mesh[u].add(w)
                self.mesh[w].add(u)
                grafts.append((u, w))
        self.lazy.pop(v, None)
        self.outside.pop(v, None)
        for u in self.members:
            self.lazy[u].discard(v)
            self.outside[u].discard(v)
        self._tables = None
        return grafts

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(level, copies in, copies out), each (origin, member) over `self.members`' order."""
        if self._tables is None:
            self._tables = self._compute()
        return self._tables

    def _compute(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        members = self.members
        m = len(members)
        index = {v: i for i, v in enumerate(members)}
        level = np.full((m, m), -1, dtype=np.int64)
        cin = np.zeros((m, m))
        cout = np.zeros((m, m))
        for a, o in enumerate(members):
            topic = self.mesh[o] | self.outside[o]  # our own message goes to every topic peer (flood publish)
            lv = {o: 0, **{v: 1 for v in topic}}
            fwd = {v: o for v in topic}
            frontier = sorted(topic)
            while frontier:
                nxt = []
                for w in frontier:
                    for v in sorted(self.mesh[w]):
                        if v not in lv:
                            lv[v], fwd[v] = lv[w] + 1, w
                            nxt.append(v)
                frontier = nxt
            for v, depth in lv.items():
                level[a, index[v]] = depth
            for v in topic:
                cin[a, index[v]] += 1
            cout[a, a] = len(topic)
            for w in members:
                if w == o or w not in lv:
                    continue
                targets = self.mesh[w] - {fwd[w], o}
                cout[a, index[w]] += len(targets)
                for v in targets:
                    cin[a, index[v]] += 1
        return level, cin, cout

    def deliver(self, publishers: list[int], offsets: np.ndarray, msg_bytes: int, hop_s: float,
                setup: ScaleSetup) -> Delivery:
        level, cin, cout = self.tables()
        index = {v: i for i, v in enumerate(self.members)}
        rows = [index[p] for p in publishers]
        lv = level[rows].astype(float)
        arrival = np.where(lv > 0, offsets[:, None] + lv * hop_s, np.inf)
        degree = np.array([len(self.mesh[v]) for v in self.members], dtype=float)
        lazy = np.array([len(self.lazy[v]) for v in self.members], dtype=float)
        sent = len(publishers)
        beats = _beats_with_ids(offsets, self.gossip, setup)
        ihave_msgs = beats * lazy
        ihave_bytes = lazy * (beats * (CONTROL_BYTES + SENDER_RECORD_BYTES) + self.gossip.window * sent * MSG_ID_BYTES)
        data_in = cin[rows].sum(axis=0)
        data_out = cout[rows].sum(axis=0)
        # IDONTWANT: every mesh peer sends one per message on its first copy, in the RPC that forwards the data to
        # us when it does (the host merges what is queued for one peer), else in an RPC of its own.
        # No IDONTWANT for a message under the host's threshold (a digest batch is smaller than one IDONTWANT RPC).
        idontwant = msg_bytes - GOSSIP_OVERHEAD >= self.gossip.idontwant_min_bytes
        idontwant_only = np.maximum(sent * degree - data_in, 0.0) if idontwant else np.zeros_like(data_in)
        own_rpc = CONTROL_BYTES + SENDER_RECORD_BYTES + MSG_ID_BYTES
        copy_bytes = msg_bytes + (MSG_ID_BYTES if idontwant else 0)
        return Delivery(arrival=arrival,
                        in_msgs=data_in + idontwant_only + ihave_msgs,
                        in_bytes=data_in * copy_bytes + idontwant_only * own_rpc + ihave_bytes,
                        out_bytes=data_out * copy_bytes + idontwant_only * own_rpc + ihave_bytes,
                        in_by_kind={"digest_copy": data_in, "idontwant": idontwant_only, "ihave": ihave_msgs})


def _beats_with_ids(offsets: np.ndarray, gossip: GossipParams, setup: ScaleSetup) -> float:
    beats = 0
    for b in range(round(setup.round_s / gossip.heartbeat_s)):
        hi = b * gossip.heartbeat_s
        lo = hi - gossip.window * gossip.heartbeat_s
        beats += bool(np.any((offsets > lo) & (offsets <= hi)))
    return float(beats)
