"""The bounded fan-in design at swarm scale (issue 32 items 2 and 3), with swarm_node/sharing/fanin.py's logic.

Contract:
- Every node draws its own secret seed at start; per epoch it joins `epoch_shards(seed, epoch, M, k)`, M its own
  shard count, which follows the node's rule (`sharing/swarm_size.ShardCount`, hysteretic, a bounded step per
  epoch) from what it saw in the last epoch: the distinct digest senders of its shards and its connections. The
  nodes present at the start have run long enough to hold `shard_count(N)`; a node that joins later starts as
  `join` does (one shard, `learning`: announcing M = 0) and, at the start of the round after the batches of
  `learn_from_peers` distinct senders announcing an M reached it, takes their median and moves to its shard of it
  (`ShardCount.learn`; the node moves at its flush, 0-5 s later), and back if fewer senders than that reach it there
  the next round (`ShardCount.confirm`); its own estimate rules from the next epoch on.
  Shard topics are gossipsub topics as the host runs them (`SHARD_GOSSIP`: the host's small meshes on digest
  topics). A new epoch that changes a node's shards costs PRUNE/UNSUBSCRIBE to the old topic peers, GRAFT/SUBSCRIBE
  to the new ones, and a dial to every new peer; one that changes nobody's costs nothing.
- Wire sizes are the node's, encoded by its codec (simulations/scale_wire.py): a digest batch, a pull request, a
  served or refused pull, a push.
- Each round a node publishes its I groups' digests (one DigestBatch) in one of its shards at an offset uniform
  in the publish spread; the digests' gossip is counted per link (scale_shards.py).
- Every `tick_s` a node that has fewer than `pull_target` pulls in flight or done takes `choose_pulls` over the
  digests it holds from this round and asks each chosen sender on a direct stream (one request per sender and
  round: `max_pulls_per_sender` is 1; a dial first if not connected); the sender answers with the group
  (`ServeBook`: SERVE) or a refusal; no answer within `pull_timeout_s` (a departed sender) frees the slot. A slot
  freed by a refusal or a timeout is used again at the next tick.
- Push fallback as the node does it (`FaninExchange`, design "bounded"): `push_after_s` after the digest, within
  the round, taken by a receiver that holds the round's digests (all round long). With `push_at_flush=True`
  (design "bounded-flush-push", the node until 2026-11-27): at its next flush (its next round's digest time, if
  `push_after_s` or more after the last), a node pushes each of its last round's groups that nobody pulled to one
  random mesh peer of its shard; that peer takes it, within `PushBook`'s caps, only while it still holds the
  sender's digest (heard after its own last flush, and it has not flushed since), else drops it unread.
- Churn (`setup.churn_per_min`): each round a node leaves with probability `setup.leave_p()` at a uniform time in
  the round (it stops answering and forwarding); a fresh node (new identity and seed) takes its slot at the next
  round's start and joins its shard (GRAFTs). Only nodes present for a whole round count in `rounds_with_J_frac`.
- Everything goes through `scale_links.Links` (network.py's link model) except the shard gossip, counted per link.
- `run_bounded(...)` -> the run's `Record`, whose `inbound_breakdown()` kinds are digest_copy, idontwant, ihave (shard
  gossip), control (GRAFT/PRUNE/(UN)SUBSCRIBE), dial (new connections), pull_request, group (served), refusal, push.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from simulations.scale_links import Links
from simulations.scale_model import CONTROL_BYTES, GossipParams, Record, ScaleSetup
from simulations.scale_shards import SHARD_GOSSIP, Shard
from simulations.scale_wire import WireSizes
from swarm_node.sharing.fanin import Digest, FanInParams, choose_pulls, epoch_shards, shard_count
from swarm_node.sharing.fanin_ledger import SERVE, PushBook, ServeBook
from swarm_node.sharing.swarm_size import ShardCount

DIAL_MSGS, DIAL_BYTES = 4, 2048  # a new connection, each side: multistream-select, Noise XX, identify
TICK_S = 1.0


class _Bounded:
    def __init__(self, setup: ScaleSetup, params: FanInParams, gossip: GossipParams,
                 push_at_flush: bool = True) -> None:
        n = setup.n
        self.s, self.p, self.g, self.push_at_flush = setup, params, gossip, push_at_flush
        self.record = Record(setup)
        self.links = Links(setup.link, self.record, n, setup.seed)
        self.rng = random.Random(setup.seed)
        self.identity, self.next_identity = list(range(n)), n
        self.seed, self.alive = [self.rng.randbytes(16) for _ in range(n)], [True] * n
        self.connected: list[set[int]] = [set() for _ in range(n)]
        self.node_shards: list[tuple[int, ...]] = [() for _ in range(n)]
        self.shards: dict[int, Shard] = {}
        self.serve, self.pushes = [ServeBook(params) for _ in range(n)], [PushBook(params) for _ in range(n)]
        self.heard: list[deque[set[str]]] = [deque(maxlen=params.recent_rounds) for _ in range(n)]
        self.wire = WireSizes.of(setup)
        self.digest_msg = self.wire.digest_msg
        self.sizers = [ShardCount(params, shard_count(n, params)) for _ in range(n)]  # each node's own M
        self.announced = [0] * n  # the M each node's batches announce this round (0 while learning)
        self.learnt_now: set[int] = set()  # nodes that took their peers' M at this round's start
        self.hop_s = setup.link.latency_s + 2 * self.digest_msg * 8 / max(setup.link.uplink_bps, 1.0)
        self.leaving: set[int] = set()  # slots whose node leaves during this round
        self.flushed_at: list[float] = [-np.inf] * n  # each node's flush (digest) time in this round ...
        self.flushed_before: list[float] = [-np.inf] * n  # ... and in the last one
        self.last_round: tuple[dict[int, list[Digest]], set[int], dict[int, int], list[list[tuple[float, int]]]] = (
            {}, set(), {}, [[] for _ in range(n)])
        self._reset_round_state()

    # -- round state ----------------------------------------------------------------------------------------
    def _reset_round_state(self) -> None:
        n = self.s.n
        if hasattr(self, "digests"):  # the ending round's, for the push fallback at each sender's next flush
            self.last_round = (self.digests, self.served, self.published_shard, self.arrivals)
        self.arrivals: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        self.cursor = [0] * n
        self.cands: list[list[Digest]] = [[] for _ in range(n)]
        self.taken: list[set[str]] = [set() for _ in range(n)]
        self.per_sender: list[dict[str, int]] = [{} for _ in range(n)]
        self.tasks: list[set[str]] = [set() for _ in range(n)]
        self.pending: list[set[int]] = [set() for _ in range(n)]
        self.recent: list[set[str]] = [set().union(*h) if h else set() for h in self.heard]
        for h in self.heard:
            h.append(set())
        self.digests: dict[int, list[Digest]] = {}
        self.published_shard: dict[int, int] = {}
        self.served: set[int] = set()

    # -- membership -----------------------------------------------------------------------------------------
    def new_epoch(self, epoch: int, t: float) -> None:
        old_topic = {v: self._topic_peers(v) for v in range(self.s.n) if self.alive[v]}
        old_mesh = {v: self._mesh_peers(v) for v in old_topic}
        members: dict[int, list[int]] = {}
        drawn = {v: epoch_shards(self.seed[v], epoch, self._shard_count(v, epoch), self.p.shards_per_node)
                 for v in old_topic}
        if epoch and all(drawn[v] == self.node_shards[v] for v in drawn):
            return  # nobody's shards changed: the topics, their meshes and connections stay as they are
        for v, chosen in drawn.items():
            self.node_shards[v] = chosen
            for shard in chosen:
                members.setdefault(shard, []).append(v)
        self.shards = {k: Shard(vs, self.g, random.Random(self.rng.random())) for k, vs in members.items()}
        if epoch == 0:
            for v in old_topic:
                self.connected[v] |= self._topic_peers(v)
            return
        for v in old_topic:
            # PRUNE to the old mesh, UNSUBSCRIBE to the old topic peers; GRAFT and SUBSCRIBE to the new ones.
            for u in old_mesh[v] | old_topic[v] | self._mesh_peers(v) | self._topic_peers(v):
                self._control(v, u, t)
            for u in self._topic_peers(v):
                self._dial(v, u, t)

    def learn(self, r: int, t: float) -> set[int]:
        """Nodes still learning take their peers' M from the batches that reached them last round (the node's
        `ShardCount.learn`), and move to their shards of it; at an epoch's start `new_epoch` moves them."""
        learnt = set()
        for v in range(self.s.n):
            sizer = self.sizers[v]
            if not self.alive[v] or not (sizer.learning or sizer.probation):
                continue
            senders = {p for _, p in self.arrivals[v]}
            if not (sizer.confirm(len(senders)) or sizer.learn(self.announced[p] for p in senders)):
                continue
            learnt.add(v)
            if r % self.p.epoch_rounds:
                self._leave_shards(v, t)
                self._join_shards(v, r, t)
        return learnt

    def _leave_shards(self, v: int, t: float, goodbye: bool = True) -> None:
        """PRUNE and UNSUBSCRIBE to v's topic peers (unless it is gone); its mesh peers short of peers graft others."""
        for u in self._topic_peers(v) if goodbye else ():
            self._control(v, u, t)
        for k in self.node_shards[v]:
            if k in self.shards:
                for a, b in self.shards[k].leave(v):
                    self._control(a, b, t)
                    self._dial(a, b, t)

    def _join_shards(self, v: int, r: int, t: float) -> None:
        """v joins its shards of `r`'s epoch at its M: a GRAFT (and a dial) to each mesh peer it picks."""
        self.node_shards[v] = epoch_shards(self.seed[v], r // self.p.epoch_rounds, self.sizers[v].shards,
                                           self.p.shards_per_node)
        for k in self.node_shards[v]:
            shard = self.shards.setdefault(k, Shard([], self.g, random.Random(self.rng.random())))
            for a, b in shard.join(v):
                self._control(a, b, t)
                self._dial(a, b, t)

    def _shard_count(self, v: int, epoch: int) -> int:
        """Node v's M for `epoch`: the node's rule on what v saw in the last epoch (the distinct digest senders of its
        shards: their members); one that took its peers' M at this round's start keeps it (it saw another M's)."""
        if epoch == 0 or v in self.learnt_now:
            return self.sizers[v].shards
        heard = len(set().union(*(self.shards[k].members for k in self.node_shards[v] if k in self.shards)) - {v})
        return self.sizers[v].next_epoch(heard, len(self.connected[v]), len(self.node_shards[v]))

    def _topic_peers(self, v: int) -> set[int]:
        return set().union(*(self.shards[k].mesh.get(v, set()) | self.shards[k].outside.get(v, set())
                             for k in self.node_shards[v] if k in self.shards)) if self.node_shards[v] else set()

    def _mesh_peers(self, v: int) -> set[int]:
        return set().union(*(self.shards[k].mesh.get(v, set()) for k in self.node_shards[v]
                             if k in self.shards)) if self.node_shards[v] else set()

    def _control(self, v: int, u: int, t: float) -> None:
        self.record.outbound(v, t, CONTROL_BYTES)
        self.record.inbound(u, t, CONTROL_BYTES, kind="control")

    def _dial(self, v: int, u: int, t: float) -> None:
        if u in self.connected[v]:
            return
        self.connected[v].add(u)
        self.connected[u].add(v)
        for a, b in ((v, u), (u, v)):
            self.record.outbound(a, t, DIAL_BYTES)
            self.record.inbound(b, t, DIAL_BYTES, msgs=DIAL_MSGS, kind="dial")

    def churn(self, r: int, t: float) -> None:
        self.leaving = set()
        for v in range(self.s.n):
            if not self.alive[v]:  # left last round: a fresh node takes the slot
                self.identity[v] = self.next_identity
                self.next_identity += 1
                self.seed[v] = self.rng.randbytes(16)
                self.alive[v] = True
                self.connected[v] = set()
                self.heard[v].clear()
                self.sizers[v] = ShardCount(self.p, shard_count(self.p.shard_size, self.p), learning=True)  # `join`
                self._join_shards(v, r, t)
            elif self.s.churn_per_min and self.rng.random() < self.s.leave_p():
                self.record.alive[r, v] = False
                self.leaving.add(v)
                self.links.at(t + self.rng.uniform(0, self.s.round_s), self.depart, v)

    def depart(self, t: float, v: int) -> None:
        self.alive[v] = False
        self._leave_shards(v, t, goodbye=False)
        for u in self.connected[v]:
            self.connected[u].discard(v)

    # -- a round --------------------------------------------------------------------------------------------
    def start_round(self, r: int) -> None:
        s, start = self.s, r * self.s.round_s
        self._reset_round_state()
        offsets = {}
        self.flushed_before, self.flushed_at = self.flushed_at, [-np.inf] * s.n
        for v in range(s.n):
            if not self.alive[v]:
                continue
            offsets[v] = self.rng.uniform(0, s.publish_spread_s)
            self.announced[v] = self.sizers[v].announced
            self.flushed_at[v] = start + offsets[v]
            if self.push_at_flush and self.flushed_at[v] - self.flushed_before[v] >= self.p.push_after_s:
                self.links.at(self.flushed_at[v], self.push_unpulled, v, self.identity[v])
            shard = self.rng.choice(self.node_shards[v])
            self.published_shard[v] = shard
            own = []
            for i in range(s.groups_per_node):
                gid = self.record.group_id(r, v, i)
                signal = self.rng.random() < s.signal_p
                variance = self.rng.uniform(0.05, 0.25) if signal else 0.0
                task = f"t{self.rng.randrange(s.tasks)}"
                self.record.new_group(gid, self.identity[v], start + offsets[v], signal)
                own.append(Digest(str(gid), str(self.identity[v]), task, variance, signal, b""))
            self.digests[v] = own
            self.serve[v].new_round({d.group_id for d in own})
            self.pushes[v].new_round()
            if not self.push_at_flush:
                self.links.at(start + offsets[v] + self.p.push_after_s, self.push_on_timer, v, r)
        for k, shard in self.shards.items():
            pubs = [v for v in shard.members if self.published_shard.get(v) == k]
            if not pubs:
                continue
            got = shard.deliver(pubs, np.array([offsets[v] for v in pubs]), self.digest_msg, self.hop_s, s)
            rec, base = self.record, r * s.n
            for j, v in enumerate(shard.members):
                rec.in_msgs[base + v] += float(got.in_msgs[j])
                rec.in_bytes[base + v] += float(got.in_bytes[j])
                rec.out_bytes[base + v] += float(got.out_bytes[j])
                for kind, msgs in got.in_by_kind.items():
                    rec.count_kind(base + v, kind, float(msgs[j]))
            for j, v in enumerate(shard.members):
                self.arrivals[v].extend((start + got.arrival[i, j], p) for i, p in enumerate(pubs)
                                        if got.arrival[i, j] < np.inf)
        for v in range(s.n):
            self.arrivals[v].sort()
        for b in range(1, round(s.round_s / TICK_S)):
            self.links.at(start + b * TICK_S, self.tick)

    def tick(self, t: float) -> None:
        for v in range(self.s.n):
            if not self.alive[v] or len(self.taken[v]) >= self.p.pull_target:
                continue
            arrivals, cursor = self.arrivals[v], self.cursor[v]
            while cursor < len(arrivals) and arrivals[cursor][0] <= t:
                self.cands[v].extend(self.digests.get(arrivals[cursor][1], ()))
                cursor += 1
            self.cursor[v] = cursor
            chosen = choose_pulls(self.cands[v], self.taken[v], self.per_sender[v], self.tasks[v],
                                  self.recent[v], self.p, self.seed[v])
            for d in chosen:
                self.taken[v].add(d.group_id)
                self.per_sender[v][d.sender] = self.per_sender[v].get(d.sender, 0) + 1
                self.tasks[v].add(d.task)
                gid = int(d.group_id)
                sender = (gid // self.s.groups_per_node) % self.s.n
                self.pending[v].add(gid)
                self._dial(v, sender, t)
                self.links.send(v, sender, self.wire.pull_request, t, self.on_request, sender, v,
                                self.identity[v], gid, kind="pull_request")
                if self.s.link.loss or sender in self.leaving:  # else an answer always comes: no timer needed
                    self.links.at(t + self.p.pull_timeout_s, self.on_timeout, v, self.identity[v], gid)

    def on_request(self, t: float, sender: int, v: int, requester: int, gid: int) -> None:
        if not self.alive[sender] or self.record.group_sender[gid] != self.identity[sender]:
            return  # gone: the requester times out
        if self.serve[sender].request(str(requester), str(gid)) == SERVE:
            self.served.add(gid)
            self.links.send(sender, v, self.wire.pull_response, t, self.on_group, v, requester, gid, kind="group")
        else:
            self.links.send(sender, v, self.wire.refusal, t, self.on_refused, v, requester, gid, kind="refusal")

    def _current(self, v: int, identity: int) -> bool:
        return self.alive[v] and self.identity[v] == identity

    def on_group(self, t: float, v: int, identity: int, gid: int) -> None:
        if self._current(v, identity) and gid in self.pending[v]:
            self.pending[v].discard(gid)
            self._received(t, v, gid)

    def _received(self, t: float, v: int, gid: int) -> None:
        self.record.got_group(v, gid, t)
        self.heard[v][-1].add(str(self.record.group_sender[gid]))

    def on_refused(self, t: float, v: int, identity: int, gid: int) -> None:
        self._free(v, identity, gid)

    def on_timeout(self, t: float, v: int, identity: int, gid: int) -> None:
        self._free(v, identity, gid)

    def _free(self, v: int, identity: int, gid: int) -> None:
        if self._current(v, identity) and gid in self.pending[v]:
            self.pending[v].discard(gid)
            self.taken[v].discard(str(gid))

    def push_unpulled(self, t: float, v: int, identity: int) -> None:
        """v's flush: its last round's groups that nobody pulled go, one each, to a random mesh peer of its shard."""
        digests, served, published_shard, _ = self.last_round
        if not self._current(v, identity):
            return
        shard = self.shards.get(published_shard.get(v, -1))
        peers = sorted(u for u in (shard.mesh.get(v, set()) if shard else set()) if self.alive[u])
        for d in digests.get(v, ()):
            gid = int(d.group_id)
            if gid in served or not peers or self.record.group_sender[gid] != identity:
                continue
            u = self.rng.choice(peers)
            self._dial(v, u, t)
            self.links.send(v, u, self.wire.push, t, self.on_push, u, self.identity[u], gid, v, kind="push")

    def on_push(self, t: float, u: int, identity: int, gid: int, sender: int) -> None:
        """u takes a pushed group only while it holds the sender's digest: heard since its last flush (a node's
        pull candidates are the digests heard since its last flush; its next flush drops them)."""
        if not self._current(u, identity):
            return
        heard = [at for at, p in self.last_round[3][u] if p == sender]
        holds = bool(heard) and self.flushed_before[u] < heard[0] and t < self.flushed_at[u]
        if self.pushes[u].accept(str(self.record.group_sender[gid]), holds) == "":
            self._received(t, u, gid)  # a round late for the round's figures (the node trains on it all the same)

    def push_on_timer(self, t: float, v: int, r: int) -> None:
        """fanin.py's design ("timer" push): `push_after_s` after its digest, within the round."""
        if not self.alive[v] or r != self.record.round_of(t - self.p.push_after_s):
            return
        shard = self.shards.get(self.published_shard.get(v, -1))
        peers = sorted(u for u in (shard.mesh.get(v, set()) if shard else set()) if self.alive[u])
        for d in self.digests.get(v, ()):
            gid = int(d.group_id)
            if gid in self.served or not peers:
                continue
            u = self.rng.choice(peers)
            self._dial(v, u, t)
            self.links.send(v, u, self.wire.push, t, self.on_timer_push, u, self.identity[u], gid, kind="push")

    def on_timer_push(self, t: float, u: int, identity: int, gid: int) -> None:
        """Taken while the receiver holds this round's digests (all round long, in this variant)."""
        if self._current(u, identity) and self.pushes[u].accept(str(self.record.group_sender[gid]), True) == "":
            if str(gid) not in self.taken[u]:
                if self.record.group_signal[gid]:
                    self.taken[u].add(str(gid))  # a usable group we hold: one pull fewer to make
                self._received(t, u, gid)

    def run(self) -> Record:
        s = self.s
        for r in range(s.rounds):
            start = r * s.round_s
            self.learnt_now = self.learn(r, start)
            if r % self.p.epoch_rounds == 0:
                self.new_epoch(r // self.p.epoch_rounds, start)
            self.churn(r, start)
            self.start_round(r)
            self.links.run_until(start + s.round_s - 1e-9)
        self.links.run_until((s.rounds + 1) * s.round_s)
        return self.record


def run_bounded(setup: ScaleSetup, params: FanInParams = FanInParams(), gossip: GossipParams = SHARD_GOSSIP,
                push_at_flush: bool = False) -> Record:
    """One run of the bounded design (see the contract); `push_at_flush` is design "bounded-flush-push"."""
    return _Bounded(setup, params, gossip, push_at_flush=push_at_flush).run()


def simulate_bounded(setup: ScaleSetup, params: FanInParams = FanInParams(),
                     gossip: GossipParams = SHARD_GOSSIP) -> dict[str, float]:
    """The node as it is (`FaninExchange`): the push `push_after_s` after the digest, within the round."""
    return run_bounded(setup, params, gossip).metrics()


def simulate_bounded_flush_push(setup: ScaleSetup, params: FanInParams = FanInParams(),
                                gossip: GossipParams = SHARD_GOSSIP) -> dict[str, float]:
    """The node until 2026-11-27: the push at the sender's next flush, mostly after receivers dropped the digest."""
    return run_bounded(setup, params, gossip, push_at_flush=True).metrics()
