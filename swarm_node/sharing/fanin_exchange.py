"""Bounded fan-in over any `Transport` (interface only): the `sharing.Exchange` of `share.fanin = "bounded"`.

Contract (the design is `sharing/fanin.py`, the bookkeeping `sharing/fanin_ledger.py`, the wire WIRE.md):
- `await start()` serves the pull and push protocols (`sharing.pull_stream`, each within `serve_streams` streams
  at once, `serve_streams_per_peer` per peer: `sharing.stream_gate`) and joins this epoch's shard topics
  (`epoch_shards` from the node's own secret seed); every digest batch is validated by `validate_gossip`.
- `publish(groups)` (sync) queues our groups (`queued` of them wait); `await flush()` opens a round: up to
  `limits.max_digests_per_message` queued groups become the groups we serve for this round (`ServedRounds`: recent
  rounds stay served, peers step at their own pace), and their digests go out as one DigestBatch on one of our shards.
- Digests heard on our shards are pull candidates of that round (those heard during its pull, after its last
  choice, of the next); `await pull()` picks pulls with `choose_pulls` (signal only, capped per sender, up to
  `pull_target`), dials the chosen senders we are not connected to at the addresses their batches carry
  (`sharing.sender_reach`, capped per round), asks each sender once per round of its digests in requests of at most
  `max_pulls_per_request` ids (`fanin.pull_asks`; one that cannot be reached frees its slots for others at once, and
  ranks as recently heard), checks every served group against its digest's hash before decoding it and against its
  re-scored rewards (`rescore`; `sharing.pulled_admit`), and queues the groups that pass; lies are queued as drops
  with their fan-in reason (`hash_mismatch`, `digest_reward_mismatch`, `unserved_digest`), as are requesters that
  pull unoffered groups or past their share. Pulls to one sender share one stream (`sharing.pull_session`).
- `drain()` (sync) returns and clears what arrived, like `TransportExchange`; `round_stats` counts this round's
  inbound messages, bytes and pulls, handed to `on_round` when `flush` closes the round (the node's /status).
- Push fallback: `push_after_s` after our digests went out (a timer on the transport's loop, while peers still
  hold them; and at the latest when `flush` closes the round), each of the round's groups that nobody pulled
  (`fanin.unpulled`) is pushed once to one shard neighbour (a peer whose digests we heard this epoch), drawn from
  our seed. A pushed group is taken only while we hold its digest from that sender, within `PushBook`'s caps
  (else dropped unread, `unsolicited_push`), and then checked as a pulled one.
- Epochs: when `flush` opens a round of a new epoch (`epoch_rounds`), the node joins its new shards and leaves the
  ones it no longer holds (`Transport.unsubscribe`: their digests stop reaching it and it stops forwarding them).
  The new epoch's shard count M comes from the last one's view of the swarm (`shard_sizer`, a
  `swarm_size.ShardCount` started at `fanin.shard_count(n_peers)`): distinct digest senders heard on our shards
  and connected peers, hysteretic and bounded. A node starts `learning`: its batches announce M = 0, and at the
  first flush after `learn_from_peers` distinct senders announced theirs (a batch's `shards`), it takes their
  median as its M and moves to its shards of that M at once (not waiting for the epoch's end), so that the
  newcomers of an epoch do not all sit on shard 0; our batches announce our M from then on. If the next round
  brings fewer than `learn_from_peers` distinct senders on the new shards, it goes back to learning on shard 0
  (`ShardCount.confirm`: a lying majority cannot park it alone on an empty shard for the epoch).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections.abc import Callable

from protocol.codec import decode, encode, encoded_content_hash
from protocol.errors import Verdict
from protocol.limits import Limits
from protocol.messages import (
    DigestBatch,
    DigestWire,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
    RolloutGroup,
    digest_topic,
)
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node.sharing.accepted import AcceptedMessages
from swarm_node.sharing.exchange import Received, RoundStats, ignore_round
from swarm_node.sharing.fanin import (
    Digest,
    FanInParams,
    choose_pulls,
    claimed_rewards,
    epoch_of,
    epoch_shards,
    pull_asks,
    reward_stats,
    shard_count,
    task_label,
    unpulled,
)
from swarm_node.sharing.fanin_ledger import (
    BUSY,
    NOT_HELD,
    NOT_SERVED,
    SERVE,
    UNOFFERED,
    PushBook,
)
from swarm_node.sharing.pull_session import PullSessions, serve_fanin_streams
from swarm_node.sharing.pull_stream import PullFailed, send_push
from swarm_node.sharing.pulled_admit import admit_pulled
from swarm_node.sharing.sender_reach import SenderReach
from swarm_node.sharing.served_rounds import ServedRounds
from swarm_node.sharing.swarm_size import ShardCount
from swarm_node.transport.base import Delivery, Transport, TransportError, ValidationResult

Rescore = Callable[[RolloutGroup], list[float]]
PULL_PASSES = 3  # choose, pull, and choose again for the slots of senders that could not be reached


class FaninExchange:
    def __init__(self, transport: Transport, limits: Limits, policy: AcceptPolicy, params: FanInParams,
                 seed: bytes, n_peers: int, clock: Callable[[], float] = time.time,
                 rescore: Rescore = claimed_rewards) -> None:
        self.transport, self.limits, self.policy, self.params = transport, limits, policy, params
        self.seed, self.clock, self.rescore = seed, clock, rescore
        self.shard_sizer = ShardCount(params, shard_count(n_peers, params), learning=True)  # M, learnt
        self.replay = ReplayGuard(limits.max_age_s)
        self.reach = SenderReach(transport, params, limits.max_digest_addrs)  # dials senders we are not connected to
        self.accepted = AcceptedMessages()
        self.round = 0
        self.shards: tuple[int, ...] = ()
        self._joined: set[int] = set()
        self._outbox: list[RolloutGroup] = []
        self.served = ServedRounds(params)  # our groups of recent rounds (peers' rounds are not in step with ours)
        self._candidates: dict[str, tuple[int, Digest]] = {}  # group id hex -> (the sender's round, digest)
        self._considered: set[str] = set()  # candidates a pull's choice saw this round (the rest came in after it)
        self._taken: dict[str, Digest] = {}  # pulled or asked this round
        self._recent: list[set[str]] = []  # senders taken from (or unreachable) in each of the last rounds
        self._unreachable: set[str] = set()  # senders whose pull failed this round: not asked again in it
        self._push_timer: asyncio.TimerHandle | None = None
        self._push_tasks: set[asyncio.Task[None]] = set()
        self._published_at: dict[str, float] = {}  # our current round's group ids (hex) -> when their digest went out
        self._pulled: set[str] = set()  # ... and those somebody pulled
        self._shard_peers: set[str] = set()  # peers whose digests we heard this epoch: push fallback targets
        self._announced: dict[str, int] = {}  # ... and the shard count each announced (learning our first M)
        self._epoch = -1
        self.push_book = PushBook(params)
        self._inbox: list[Received] = []
        self._lock = threading.Lock()
        self.round_stats = RoundStats()
        self.on_round: Callable[[RoundStats], None] = ignore_round
        self.ignore_signer: Callable[[str], bool] = lambda _signer: False
        self.sessions = PullSessions(transport, limits, params.pull_timeout_s)  # a stream per sender, kept

    @property
    def peer_id(self) -> str:
        return self.transport.peer_id

    @property
    def shard_neighbours(self) -> list[str]:
        """The peers whose digests we heard this epoch (the push fallback's targets), sorted."""
        return sorted(self._shard_peers - {self.peer_id})

    async def start(self) -> None:
        await serve_fanin_streams(self.transport, self._answer, self._on_push, self.limits, self.params, self._drop)
        await self._join_epoch()

    async def _join_epoch(self) -> None:
        epoch = epoch_of(self.round, self.params)
        heard = len(self._shard_peers - {self.peer_id})
        learnt = self.shard_sizer.confirm(heard) or self.shard_sizer.learn(self._announced.values())
        if learnt:  # what we heard was of the shards we leave now
            self._shard_peers, self._announced = set(), {}
        if epoch != self._epoch:
            if self._epoch >= 0 and not learnt:  # what the last epoch showed of the swarm sets this one's M
                heard = len(self._shard_peers - {self.peer_id})
                self.shard_sizer.next_epoch(heard, await self._connected(), len(self.shards))
            self._epoch, self._shard_peers, self._announced = epoch, set(), {}
        self.shards = epoch_shards(self.seed, epoch, self.shard_sizer.shards, self.params.shards_per_node)
        for shard in sorted(self._joined - set(self.shards)):  # last epoch's: their digests stop reaching us
            self._joined.discard(shard)
            await self.transport.unsubscribe(digest_topic(shard))
        for shard in self.shards:
            if shard not in self._joined:
                self._joined.add(shard)
                self.transport.set_validator(digest_topic(shard), self._validator(shard))
                await self.transport.subscribe(digest_topic(shard), self._on_digests)

    async def _connected(self) -> int:
        try:
            return len(await self.transport.peers())
        except TransportError:  # the network layer is restarting: the digests heard still count
            return 0

    def _validator(self, shard: int) -> Callable[[str, bytes], ValidationResult]:
        topic = digest_topic(shard)

        def validate(signer: str, data: bytes) -> ValidationResult:
            if self.ignore_signer(signer) or shard not in self.shards:  # not ours this epoch: unread
                return ValidationResult.IGNORE
            self._count(len(data))
            result = validate_gossip(topic, data, signer, limits=self.limits, policy=self.policy, now=self.clock(),
                                     replay=self.replay)
            if result.verdict is not Verdict.ACCEPT:
                self._drop(signer, result.reason)
            else:
                assert result.message is not None  # ACCEPT carries it
                self.accepted.remember(data, result.message)
            return ValidationResult.of(result.verdict)
        return validate

    def _on_digests(self, delivery: Delivery) -> None:
        # The validator's decoding when we have it; else decoded again (bounded by the limits).
        msg = self.accepted.take(delivery.data) or decode(delivery.data, self.limits)
        if not isinstance(msg, DigestBatch) or msg.shard not in self.shards:
            return
        self._shard_peers.add(delivery.from_peer)
        self._announced[delivery.from_peer] = msg.shards
        self.reach.heard(delivery.from_peer, msg.addrs)
        for d in msg.digests:
            key = d.group_id.hex()
            self._candidates[key] = (msg.round, Digest(key, delivery.from_peer, d.task, d.reward_variance,
                                                       d.signal, d.content_hash))

    def _count(self, n_bytes: int) -> None:
        self.round_stats.inbound_messages += 1
        self.round_stats.inbound_bytes += n_bytes

    def _drop(self, sender: str, reason: str) -> None:
        self.round_stats.by_reason[reason] = self.round_stats.by_reason.get(reason, 0) + 1
        with self._lock:
            self._inbox.append(Received(sender, self.clock(), None, reason))

    # -- our groups -----------------------------------------------------------------------------------------
    def publish(self, groups: list[RolloutGroup]) -> None:
        self._outbox.extend(groups)

    @property
    def queued(self) -> int:
        """Our groups published and not yet announced (a flush announces `limits.max_digests_per_message`)."""
        return len(self._outbox)

    def serving(self, round_index: int) -> dict[bytes, RolloutGroup]:
        """The groups we serve for `round_index` (none once it is no longer held: `served_rounds`)."""
        return self.served.groups(round_index)

    @property
    def announced_at(self) -> dict[str, float]:
        """This round's groups (id hex) whose digests went out and not yet pushed, with when (bench.gossip's stages)."""
        return dict(self._published_at)

    async def flush(self) -> int:
        """Open the next round: serve up to `max_digests_per_message` queued groups and publish their digests; then
        pull what the digests heard since the last flush offer (`pull`: ours are out meanwhile, so peers need not
        wait for our pulls to fetch them) and close the last round; returns the digest messages published (0 or 1)."""
        if self._push_timer is not None:
            self._push_timer.cancel()
        await self._push_unpulled()
        self.round += 1
        await self._join_epoch()
        out, self._outbox = self._outbox[:self.limits.max_digests_per_message], self._outbox[
            self.limits.max_digests_per_message:]
        now = self.clock()
        wire = self.served.open_round(self.round, out, now)
        self._published_at, self._pulled = {g.group_id.hex(): now for g in out}, set()
        if out:
            digests = []
            for g in out:
                signal, variance = reward_stats(claimed_rewards(g))
                digests.append(DigestWire(g.group_id, task_label(g), variance, signal,
                                          encoded_content_hash(wire[g.group_id])))
            shard = self.shards[self.round % len(self.shards)]
            batch = DigestBatch(shard, self.round, digests, now, self.shard_sizer.announced, self.reach.own_addrs())
            await self.transport.publish(digest_topic(shard), encode(batch))
            self._push_timer = asyncio.get_running_loop().call_later(self.params.push_after_s, self._push_when_due)
        if self._candidates:
            await self.pull()
        self.on_round(self.round_stats)
        self.round_stats = RoundStats(self.round)
        heard = set(d.sender for d in self._taken.values()) | self._unreachable
        self._recent = [heard, *self._recent][:self.params.recent_rounds]
        # Digests that arrived while we pulled were never chosen from: they are candidates of the next round.
        self._candidates = {k: v for k, v in self._candidates.items() if k not in self._considered}
        self._taken, self._considered, self._unreachable = {}, set(), set()
        self.push_book.new_round()
        self.reach.new_round(keep={d.sender for _, d in self._candidates.values()})
        return 1 if out else 0

    def _push_when_due(self) -> None:
        """`push_after_s` after our digests went out (while peers still hold them), push what nobody pulled; a flush
        first pushes whatever is due by then too (a virtual clock in tests: the timer then finds nothing due)."""
        task = asyncio.ensure_future(self._push_unpulled())
        self._push_tasks.add(task)
        task.add_done_callback(self._push_done)

    def _push_done(self, task: asyncio.Task[None]) -> None:
        self._push_tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), TransportError):
            return  # the transport closed under it: nothing left to push to
        task.result()

    async def _push_unpulled(self) -> None:
        due = unpulled(self._published_at, self._pulled, self.clock(), self.params)
        neighbours = self.shard_neighbours
        if not due or not neighbours:
            return
        for key in due:  # taken before the first await: the timer's push and a flush's never send one twice
            del self._published_at[key]
        draw = random.Random(hashlib.sha256(self.seed + b"push" + self.round.to_bytes(8, "big")).digest())
        for key in due:
            group_id = bytes.fromhex(key)
            if (wire := self.served.wire(self.round, group_id)) is None:
                continue  # the round is no longer held
            push = PullResponse((PulledGroup(group_id, wire),), (), self.clock())
            try:
                await send_push(self.transport, draw.choice(neighbours), push, self.limits, self.params.pull_timeout_s)
            except PullFailed:
                continue  # the neighbour left: the group stays with us (pushed once at most)
            self.round_stats.pushes_sent += 1

    def _on_push(self, sender: str, push: PullResponse) -> None:
        self._count(sum(len(g.data) for g in push.groups))
        for pulled in push.groups:
            entry = self._candidates.get(pulled.group_id.hex())
            digest = entry[1] if entry is not None and entry[1].sender == sender else None
            reason = self.push_book.accept(sender, digest is not None)
            if reason or digest is None:
                self._drop(sender, reason)
                continue
            self._accept(sender, pulled, digest)

    def _answer(self, requester: str, request: PullRequest) -> PullResponse:
        groups, refused = [], []
        for group_id in request.group_ids:
            outcome = self.served.request(requester, request.round, group_id)
            if outcome == SERVE and (wire := self.served.wire(request.round, group_id)) is not None:  # held
                groups.append(PulledGroup(group_id, wire))
                self.round_stats.pulls_served += 1
                self._pulled.add(group_id.hex())
                continue
            refused.append(PullRefusal(group_id, outcome))
            if outcome not in (BUSY, NOT_HELD):  # our own cap, or a requester too late: nothing wrong
                self._drop(requester, outcome)
        return PullResponse(tuple(groups), tuple(refused), self.clock())

    # -- pulling --------------------------------------------------------------------------------------------
    async def pull(self) -> int:
        """Pull what `choose_pulls` picks among this round's digests; returns the groups accepted. A sender that
        cannot be reached (no address, gone) frees its slots for the others at once, in up to `PULL_PASSES`
        passes, and ranks as recently heard for the next rounds (else it would be tried first every round)."""
        accepted = 0
        for _ in range(PULL_PASSES):
            per_sender: dict[str, int] = {}
            for d in self._taken.values():
                per_sender[d.sender] = per_sender.get(d.sender, 0) + 1
            recent = set().union(self._unreachable, *self._recent)
            self._considered.update(self._candidates)
            candidates = [d for _, d in self._candidates.values() if d.sender not in self._unreachable]
            chosen = choose_pulls(candidates, self._taken, per_sender, {d.task for d in self._taken.values()},
                                  recent, self.params, self.seed)
            if not chosen:
                break
            self._taken.update((d.group_id, d) for d in chosen)
            asks = pull_asks(chosen, {d.group_id: self._candidates[d.group_id][0] for d in chosen},
                             self.limits.max_pulls_per_request)
            unreached = await self.reach.reach(list(dict.fromkeys(sender for sender, _, _ in asks)))
            results = await asyncio.gather(*(self._pull_from(sender, r, ds, sender in unreached)
                                             for sender, r, ds in asks))
            accepted += sum(n for n in results if n is not None)
            failed = {sender for (sender, _, _), n in zip(asks, results, strict=True) if n is None}
            if not failed:
                break
            self._unreachable |= failed
        return accepted

    async def _pull_from(self, sender: str, sender_round: int, digests: tuple[Digest, ...],
                         unreached: bool) -> int | None:
        """The groups accepted from one pull request, or None when the sender could not be reached."""
        request = PullRequest(sender_round, tuple(bytes.fromhex(d.group_id) for d in digests), self.clock())
        try:
            if unreached:  # our dial to it failed
                raise PullFailed("transport", f"could not dial {sender}")
            self.round_stats.pulls_sent += len(digests)
            response = await self.sessions.request(sender, request)
        except PullFailed:
            for d in digests:  # lost: the slots are free again
                self._taken.pop(d.group_id, None)
            return None
        self._count(sum(len(g.data) for g in response.groups))
        by_id = {d.group_id: d for d in digests}
        for refusal in response.refused:
            self._taken.pop(refusal.group_id.hex(), None)
            if refusal.reason == UNOFFERED:  # its own digest announced it in that round
                self._drop(sender, NOT_SERVED)
        return sum(self._accept(sender, pulled, by_id[pulled.group_id.hex()]) for pulled in response.groups)

    def _accept(self, sender: str, pulled: PulledGroup, digest: Digest) -> bool:
        """Queue a pulled or pushed group that passes every check against its digest (`admit_pulled`), else drop
        it scored."""
        group, reason = admit_pulled(sender, pulled, digest, self.limits, self.policy, self.replay, self.rescore,
                                     self.clock())
        if group is None:
            self._drop(sender, reason)
            return False
        with self._lock:
            self._inbox.append(Received(sender, self.clock(), group))
        return True

    def drain(self) -> list[Received]:
        with self._lock:
            got, self._inbox = self._inbox, []
        return got
