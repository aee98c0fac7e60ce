"""The swarm-scale simulation's setting, wire sizes, random graphs and what a run records (issue 32 item 3).

Contract:
- `ScaleSetup`: one run's inputs (N, rounds, I, J, group bytes, round length, signal probability, K, churn, the
  link of simulations/network.py's `LinkModel`, seed). Publish times: each node publishes its round's groups at one
  offset drawn uniformly in [0, `publish_spread_s`) of the round (nodes finish generating at different times).
- Wire sizes (bytes) are constants here, the same for every design: a gossip message carries `GOSSIP_OVERHEAD`
  (from, seqno, signature, topic, the RPC's sender record) around its payload; control entries name a message by
  `MSG_ID_BYTES`.
- `GossipParams`: one gossipsub topic's mesh degree, topic peers, IHAVE fan-out, heartbeat and window.
- `regular_graph(nodes, degree, rng, avoid)`: a random graph as the union of degree/2 random Hamiltonian cycles that
  avoid the edges in `avoid` (the complete graph when degree >= n-1): an expander of the given even degree, the
  shape of a gossipsub mesh.
- `Record`: what a run saw, per (round, node) and per group: inbound messages and bytes, outbound bytes (by the
  round in which they arrive or leave), usable groups (in their round, valid, with signal), distinct receivers of
  each group in its round and when the K-th got it, distinct senders heard per node. `Record.metrics()` gives the
  issue's per-design figures (per-node figures: each node's mean per measured round, then the median or the 99th
  percentile over nodes; the first `warmup` rounds are not measured). `Record.inbound_breakdown()`: the inbound
  messages of the measured rounds by kind (each `inbound(..., kind=)` call's), per node and round (the mean over
  the (node, round) pairs present for the whole round, not a median: the kinds add up to the mean, not the median).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulations.network import LinkModel

KB = 1024
SENDER_RECORD_BYTES = 200  # py-libp2p puts its signed peer record in every RPC it sends, control ones too
GOSSIP_OVERHEAD = 150 + SENDER_RECORD_BYTES  # a gossipsub message's fields and the RPC's signed sender record
STREAM_OVERHEAD = 160  # a direct stream's framing plus the group's signature and signer (pulled or pushed)
CONTROL_BYTES = 24  # an RPC with one control message: framing, topic
MSG_ID_BYTES = 46  # gossipsub's default message id: signer peer id (38) + seqno (8)
WAN = LinkModel(latency_s=0.02, uplink_bps=100e6, downlink_bps=100e6, loss=0.0)  # the scenarios' network


@dataclass(frozen=True)
class GossipParams:
    """A gossipsub topic as our hosts run it (libp2p/ipc.HostSettings, py-libp2p's defaults): `degree` mesh
    peers, `connect` topic peers in all (the rest get IHAVE, at most `lazy` of them), a heartbeat every
    `heartbeat_s` with the ids seen in the last `window` heartbeats; IDONTWANT only for messages whose data is
    `idontwant_min_bytes` or more (0: every message, as py-libp2p sends it)."""

    degree: int = 6
    connect: int = 12
    lazy: int = 6
    heartbeat_s: float = 1.0
    window: int = 3
    idontwant_min_bytes: int = 0


@dataclass(frozen=True)
class ScaleSetup:
    n: int
    rounds: int = 102
    warmup: int = 2
    groups_per_node: int = 4  # I
    needed: int = 4  # J
    group_bytes: int = 5 * KB
    round_s: float = 10.0
    publish_spread_s: float = 5.0
    signal_p: float = 0.6
    k_receivers: int = 3  # K: the latency of a group to its K-th receiver
    tasks: int = 5
    churn_per_min: float = 0.0  # fraction of the nodes replaced per minute
    link: LinkModel = WAN
    seed: int = 0

    @property
    def measured(self) -> range:
        return range(self.warmup, self.rounds)

    def leave_p(self) -> float:
        """The probability that a node leaves in a given round, so that `churn_per_min` of them go per minute."""
        per_round = self.round_s / 60.0
        return 1.0 - (1.0 - self.churn_per_min) ** per_round


def regular_graph(nodes: Sequence[int], degree: int, rng: random.Random,
                  avoid: dict[int, set[int]] | None = None, tries: int = 50) -> dict[int, set[int]]:
    """See the module contract; a cycle that keeps colliding with earlier edges is added without its colliding
    edges (a degree short by a few on tiny graphs)."""
    adj: dict[int, set[int]] = {v: set() for v in nodes}
    n = len(nodes)
    if n < 2:
        return adj
    if degree >= n - 1 and not avoid:
        return {v: set(nodes) - {v} for v in nodes}
    taken = {v: set(avoid.get(v, ())) if avoid else set() for v in nodes}
    for _ in range(max(1, degree // 2)):
        best: list[int] = []
        best_clash = n + 1
        for _ in range(tries):
            order = list(nodes)
            rng.shuffle(order)
            clash = sum(order[(i + 1) % n] in taken[order[i]] or order[(i + 1) % n] in adj[order[i]]
                        for i in range(n))
            if clash < best_clash:
                best, best_clash = order, clash
            if clash == 0:
                break
        for i in range(n):
            a, b = best[i], best[(i + 1) % n]
            if a != b and b not in taken[a] and b not in adj[a]:
                adj[a].add(b)
                adj[b].add(a)
    return adj


@dataclass
class Record:
    setup: ScaleSetup
    in_msgs: list[float] = field(init=False)  # flat (round, node): index round * n + node (lists: fast per event)
    in_bytes: list[float] = field(init=False)
    out_bytes: list[float] = field(init=False)
    usable: np.ndarray = field(init=False)  # (round, node): usable groups received
    received: np.ndarray = field(init=False)  # (round, node): distinct groups received (any round's)
    alive: np.ndarray = field(init=False)  # (round, node): present for the whole round
    group_sender: np.ndarray = field(init=False)  # per group: its sender's identity (a churned slot: a new one)
    group_time: np.ndarray = field(init=False)  # when it was published (inf: never)
    group_signal: np.ndarray = field(init=False)
    receivers: np.ndarray = field(init=False)  # distinct receivers within the group's round
    kth_at: np.ndarray = field(init=False)  # when the K-th of them got it
    heard_10: list[set[int]] = field(init=False)
    heard_100: list[set[int]] = field(init=False)
    in_kinds: Counter[str] = field(init=False)  # inbound messages of the measured rounds, by kind

    def __post_init__(self) -> None:
        shape = (self.setup.rounds + 1, self.setup.n)  # +1: traffic that lands after the last round
        cells = shape[0] * shape[1]
        self.in_msgs, self.in_bytes, self.out_bytes = [0.0] * cells, [0.0] * cells, [0.0] * cells
        self.usable = np.zeros(shape, dtype=np.int32)
        self.received = np.zeros(shape, dtype=np.int32)
        self.alive = np.ones(shape, dtype=bool)
        groups = (self.setup.rounds + 1) * self.setup.n * self.setup.groups_per_node
        self.group_sender = np.zeros(groups, dtype=np.int64)
        self.group_time = np.full(groups, np.inf)
        self.group_signal = np.zeros(groups, dtype=bool)
        self.receivers = np.zeros(groups, dtype=np.int32)
        self.kth_at = np.full(groups, np.inf)
        self.heard_10 = [set() for _ in range(self.setup.n)]
        self.heard_100 = [set() for _ in range(self.setup.n)]
        self.in_kinds = Counter()

    def round_of(self, t: float) -> int:
        return min(int(t // self.setup.round_s), self.setup.rounds)

    def cell(self, t: float, node: int) -> int:
        """The flat index of (the round of t, node) in the traffic lists."""
        return min(int(t // self.setup.round_s), self.setup.rounds) * self.setup.n + node

    def group_id(self, round_index: int, node: int, i: int) -> int:
        return (round_index * self.setup.n + node) * self.setup.groups_per_node + i

    def group_round(self, group: int) -> int:
        return group // (self.setup.n * self.setup.groups_per_node)

    def new_group(self, group: int, sender: int, t: float, signal: bool) -> None:
        self.group_sender[group] = sender
        self.group_time[group] = t
        self.group_signal[group] = signal

    def inbound(self, node: int, t: float, nbytes: float, msgs: float = 1.0, kind: str = "message") -> None:
        cell = self.cell(t, node)
        self.in_msgs[cell] += msgs
        self.in_bytes[cell] += nbytes
        self.count_kind(cell, kind, msgs)

    def count_kind(self, cell: int, kind: str, msgs: float) -> None:
        """Adds `msgs` inbound messages of `kind` at flat `cell` to the breakdown if its round is measured (the
        caller counts them into `in_msgs` itself)."""
        if self.setup.warmup * self.setup.n <= cell < self.setup.rounds * self.setup.n:
            self.in_kinds[kind] += msgs

    def inbound_breakdown(self) -> dict[str, float]:
        """See the module contract: kind -> inbound messages per node and round (mean), kinds sorted."""
        pairs = float(self.alive[list(self.setup.measured)].sum())
        return {kind: self.in_kinds[kind] / pairs for kind in sorted(self.in_kinds)} if pairs else {}

    def outbound(self, node: int, t: float, nbytes: float) -> None:
        self.out_bytes[self.cell(t, node)] += nbytes

    def got_group(self, node: int, group: int, t: float) -> None:
        """`node` received `group` (first copy only) at `t`."""
        r = self.round_of(t)
        self.received[r, node] += 1
        if r == self.group_round(group):
            self.receivers[group] += 1
            if self.receivers[group] == self.setup.k_receivers:
                self.kth_at[group] = t
            if self.group_signal[group]:
                self.usable[r, node] += 1
        first = self.setup.warmup
        if first <= r < first + 100:
            self.heard_100[node].add(self.group_sender[group])
            if r < first + 10:
                self.heard_10[node].add(self.group_sender[group])

    def metrics(self) -> dict[str, float]:
        s = self.setup
        rounds = list(s.measured)
        alive = self.alive[rounds]
        counted = alive.sum(axis=0)
        whole = counted > 0

        def per_node(flat: list[float]) -> np.ndarray:
            a = np.array(flat).reshape(-1, s.n)
            return (a[rounds] * alive).sum(axis=0)[whole] / counted[whole]

        msgs, kb_in, kb_out = per_node(self.in_msgs), per_node(self.in_bytes) / KB, per_node(self.out_bytes) / KB
        ok = (self.usable[rounds] >= s.needed)[alive]
        per_round = s.n * s.groups_per_node
        span = slice(s.warmup * per_round, s.rounds * per_round)
        published = np.isfinite(self.group_time[span])
        reached = self.receivers[span][published]
        kth = ((self.kth_at[span] - self.group_time[span])[published & np.isfinite(self.kth_at[span])]) * 1000
        return {
            "inbound_msgs_per_round": float(np.median(msgs)),
            "inbound_kb_per_round": float(np.median(kb_in)),
            "inbound_kb_per_round_p99": float(np.percentile(kb_in, 99)),
            "outbound_kb_per_round_p99": float(np.percentile(kb_out, 99)),
            "rounds_with_J_frac": float(ok.mean()),
            "distinct_peers_10_rounds": float(np.median([len(h) for h in self.heard_10])),
            "distinct_peers_100_rounds": float(np.median([len(h) for h in self.heard_100])),
            "pulled_by_ge1_frac": float((reached >= 1).mean()),
            "latency_to_k_ms_p50": float(np.median(kth)) if kth.size else float("inf"),
        }
