"""Today's design at swarm scale: every group flooded to every node over one gossipsub topic (issue 32 item 3).

Contract:
- Topology (`flood_topology`): each node has min(N-1, `connect`) topic peers, `degree` of them its mesh (a random
  regular graph), the others its lazy peers (at most `lazy`); the same graphs for a seed in both functions below.
- `simulate_flood(setup)`: message by message on `scale_links.Links`, as py-libp2p's gossipsub does it: a node
  publishes its own group to all its topic peers (our router's flood publish); on a message's first receipt a node
  sends IDONTWANT to every mesh peer (before forwarding, as py-libp2p does), then forwards it to its mesh peers but
  the forwarder, the origin and those whose IDONTWANT for it has arrived; later copies are duplicates. Every
  heartbeat a node sends IHAVE with the ids of its last `window` heartbeats to its lazy peers; a peer missing one
  answers IWANT and gets the message. Every message and byte counts, control and duplicates included.
- `flood_counts(setup)`: the same figures in closed form (the analytical model, for N >= 1,000). Data copies per
  message: `data_copies` (IDONTWANT is sent but counted as never in time: a node forwards on its first copy, before
  the other upstream peers' IDONTWANT can arrive; the simulator agrees, see test_scale_sim.py); IDONTWANT: D per
  node and message; IHAVE: the expected heartbeats with ids in their window times the lazy peers. Times: a fluid
  queue per link (each round's bytes arrive over the publish spread; a backlog carries into the next round); a
  node's I groups leave its uplink one after another. Checked against `simulate_flood` at N = 10 and 100.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np

from simulations.network import transfer_s
from simulations.scale_links import Links
from simulations.scale_model import (
    CONTROL_BYTES,
    GOSSIP_OVERHEAD,
    KB,
    MSG_ID_BYTES,
    GossipParams,
    Record,
    ScaleSetup,
    regular_graph,
)

Graph = dict[int, set[int]]


def flood_topology(setup: ScaleSetup, gossip: GossipParams) -> tuple[Graph, Graph]:
    rng = random.Random(setup.seed * 7919 + 1)
    n = setup.n
    connect = min(n - 1, gossip.connect)
    mesh = regular_graph(range(n), min(gossip.degree, connect), rng)
    if n - 1 <= gossip.connect:
        lazy = {v: set(range(n)) - mesh[v] - {v} for v in range(n)}
    else:
        lazy = regular_graph(range(n), connect - gossip.degree, rng, avoid=mesh)
    return mesh, {v: set(sorted(peers)[:gossip.lazy]) for v, peers in lazy.items()}


class _Flood:
    def __init__(self, setup: ScaleSetup, gossip: GossipParams) -> None:
        self.s, self.g = setup, gossip
        self.record = Record(setup)
        self.links = Links(setup.link, self.record, setup.n, setup.seed)
        self.mesh, self.lazy = flood_topology(setup, gossip)
        self.topic = {v: self.mesh[v] | self.lazy[v] for v in range(setup.n)}
        self.rng = random.Random(setup.seed)
        self.seen: list[set[int]] = [set() for _ in range(setup.n)]
        self.dontwant: list[dict[int, set[int]]] = [{} for _ in range(setup.n)]
        self.cache: list[deque[list[int]]] = [deque([[] for _ in range(gossip.window)]) for _ in range(setup.n)]
        self.data_bytes = setup.group_bytes + GOSSIP_OVERHEAD

    def origin(self, msg: int) -> int:
        return (msg // self.s.groups_per_node) % self.s.n

    def publish(self, t: float, v: int, round_index: int) -> None:
        for i in range(self.s.groups_per_node):
            msg = self.record.group_id(round_index, v, i)
            self.record.new_group(msg, v, t, self.rng.random() < self.s.signal_p)
            self.first_copy(t, v, msg, v)

    def first_copy(self, t: float, v: int, msg: int, forwarder: int) -> None:
        """v holds msg for the first time (its own, or received from `forwarder`)."""
        self.seen[v].add(msg)
        self.cache[v][-1].append(msg)
        origin = self.origin(msg)
        if v != origin:
            self.record.got_group(v, msg, t)
        for peer in self.mesh[v]:
            self.links.send(v, peer, CONTROL_BYTES + MSG_ID_BYTES, t, self.on_dontwant, peer, v, msg)
        skip = self.dontwant[v].get(msg, set())
        targets = self.topic[v] if v == origin else self.mesh[v] - {forwarder, origin}
        for peer in targets:
            if peer not in skip:
                self.links.send(v, peer, self.data_bytes, t, self.on_data, peer, v, msg)

    def on_data(self, t: float, v: int, forwarder: int, msg: int) -> None:
        if msg not in self.seen[v]:
            self.first_copy(t, v, msg, forwarder)

    def on_dontwant(self, t: float, v: int, peer: int, msg: int) -> None:
        self.dontwant[v].setdefault(msg, set()).add(peer)

    def heartbeat(self, t: float) -> None:
        for v in range(self.s.n):
            ids = [m for bucket in self.cache[v] for m in bucket]
            if ids:
                for peer in self.lazy[v]:
                    self.links.send(v, peer, CONTROL_BYTES + MSG_ID_BYTES * len(ids), t, self.on_ihave, peer, v, ids)
            self.cache[v].popleft()
            self.cache[v].append([])

    def on_ihave(self, t: float, v: int, peer: int, ids: list[int]) -> None:
        missing = [m for m in ids if m not in self.seen[v]]
        if missing:
            self.links.send(v, peer, CONTROL_BYTES + MSG_ID_BYTES * len(missing), t, self.on_iwant, peer, v, missing)

    def on_iwant(self, t: float, v: int, peer: int, ids: list[int]) -> None:
        for msg in ids:
            self.links.send(v, peer, self.data_bytes, t, self.on_data, peer, v, msg)

    def forget(self, round_index: int) -> None:
        """Ids older than the previous round can no longer arrive (nothing is in flight that long): dropped."""
        oldest = self.record.group_id(max(0, round_index - 1), 0, 0)
        for v in range(self.s.n):
            self.seen[v] = {m for m in self.seen[v] if m >= oldest}
            self.dontwant[v] = {m: p for m, p in self.dontwant[v].items() if m >= oldest}

    def run(self) -> Record:
        s = self.s
        beats_per_round = round(s.round_s / self.g.heartbeat_s)
        for r in range(s.rounds):
            start = r * s.round_s
            for v in range(s.n):
                self.links.at(start + self.rng.uniform(0, s.publish_spread_s), self.publish, v, r)
            for b in range(beats_per_round):
                self.links.at(start + b * self.g.heartbeat_s, self.heartbeat)
            self.links.run_until(start + s.round_s - 1e-9)
            self.forget(r)
        self.links.run_until(s.rounds * s.round_s + s.round_s)
        return self.record


def simulate_flood(setup: ScaleSetup, gossip: GossipParams = GossipParams()) -> dict[str, float]:
    return _Flood(setup, gossip).run().metrics()


def _nonempty_beats(setup: ScaleSetup, gossip: GossipParams) -> float:
    """Expected heartbeats per round whose window holds an id (first copies arrive `latency_s` after publishing)."""
    s, lat = setup, setup.link.latency_s
    total = 0.0
    for b in range(round(s.round_s / gossip.heartbeat_s)):
        hi = b * gossip.heartbeat_s
        lo = hi - gossip.window * gossip.heartbeat_s
        overlap = max(0.0, min(hi, s.publish_spread_s + lat) - max(lo, lat))
        total += 1 - (1 - overlap / s.publish_spread_s) ** s.n
    return total


def _fluid_waits(load: float, bps: float, setup: ScaleSetup, taus: np.ndarray) -> list[np.ndarray]:
    """Per round, the queueing delay at publish offsets `taus` on a link that takes `load` bytes per round over
    the publish spread (a backlog carries over)."""
    if bps <= 0:
        return [np.zeros_like(taus) for _ in range(setup.rounds)]
    rate, cap, spread = load / setup.publish_spread_s, bps / 8, setup.publish_spread_s
    carry, out = 0.0, []
    for _ in range(setup.rounds):
        out.append(np.maximum(0.0, carry + (rate - cap) * taus) / cap)
        backlog = max(0.0, carry + load - cap * spread)
        carry = max(0.0, backlog - cap * (setup.round_s - spread))
    return out


def data_copies(setup: ScaleSetup, gossip: GossipParams) -> int:
    """Transmissions of one published message: the origin's C topic peers, then each node's mesh but the
    forwarder and the origin (the origin's D mesh peers got it from the origin: D - 1 each; its C - D lazy peers
    did too, and it is not in their mesh: D each; everyone else: D - 1)."""
    c = min(setup.n - 1, gossip.connect)
    d = min(gossip.degree, c)
    return c + d * (d - 1) + (c - d) * d + (setup.n - 1 - c) * (d - 1)


def _enough_signal(setup: ScaleSetup) -> float:
    """P(at least J of the (N-1) I groups a node gets carry signal)."""
    total, p = (setup.n - 1) * setup.groups_per_node, setup.signal_p
    return 1.0 - sum(math.comb(total, k) * p**k * (1 - p) ** (total - k) for k in range(min(setup.needed, total + 1)))


def flood_counts(setup: ScaleSetup, gossip: GossipParams = GossipParams()) -> dict[str, float]:
    """See the module contract: every node's expected load (the graphs are regular: the median is the mean)."""
    s, n, per = setup, setup.n, setup.groups_per_node
    c = min(n - 1, gossip.connect)
    d, lazy = min(gossip.degree, c), min(gossip.lazy, c - min(gossip.degree, c))
    messages = n * per  # published per round; every node sends IDONTWANT to each mesh peer on each one
    data, control = s.group_bytes + GOSSIP_OVERHEAD, CONTROL_BYTES + MSG_ID_BYTES
    beats = _nonempty_beats(setup, gossip)
    ihave_bytes = lazy * (beats * CONTROL_BYTES + gossip.window * messages * MSG_ID_BYTES)
    copies = per * data_copies(setup, gossip)  # data messages in (and out) per node and round
    in_msgs = copies + messages * d + beats * lazy
    in_bytes = out_bytes = copies * data + messages * d * control + ihave_bytes
    taus = (np.arange(400) + 0.5) / 400 * s.publish_spread_s
    down = _fluid_waits(in_bytes, s.link.downlink_bps, setup, taus)
    up = _fluid_waits(out_bytes, s.link.uplink_bps, setup, taus)
    first_hop = s.link.latency_s + transfer_s(data, s.link.downlink_bps)
    # A node publishes its I groups at once: group i's K-th copy leaves after i C + K copies (and D IDONTWANTs
    # per group); the median over i.
    sends = float(np.median([i * (c + d * control / data) + s.k_receivers for i in range(per)]))
    kth_extra = sends * transfer_s(data, s.link.uplink_bps)
    in_time, kth, j_ok = [], [], []
    for r in s.measured:
        arrive = taus + up[r] + down[r] + first_hop
        in_time.append(arrive < s.round_s)
        j_ok.append(float(arrive[0] < s.round_s))
        if n - 1 >= s.k_receivers:
            kth.extend((arrive + kth_extra - taus)[arrive + kth_extra < s.round_s] * 1000)
    kb_in, kb_out = in_bytes / KB, out_bytes / KB
    return {
        "inbound_msgs_per_round": float(in_msgs),
        "inbound_kb_per_round": kb_in,
        "inbound_kb_per_round_p99": kb_in,
        "outbound_kb_per_round_p99": kb_out,
        "rounds_with_J_frac": float(np.mean(j_ok)) * _enough_signal(setup),
        "distinct_peers_10_rounds": float(n - 1),
        "distinct_peers_100_rounds": float(n - 1),
        "pulled_by_ge1_frac": float(np.mean(in_time)),
        "latency_to_k_ms_p50": float(np.median(kth)) if kth else float("inf"),
    }
