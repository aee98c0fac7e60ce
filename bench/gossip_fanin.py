"""bench.gossip's node on the bounded fan-in path (`share.fanin = "bounded"`, join's default): a real FaninExchange.

Contract:
- `bench_params(round_s)`: the FanInParams of the bench. It measures the path's capacity, not a node's J: every
  receiver fetches every group it is offered, so the per-round caps that bound a node's intake in `join` are raised
  past anything the workload reaches (`UNCAPPED`): `pull_target` and `max_pulls_per_sender` (a receiver pulls every
  digest it hears, not J of them), `serve_per_round` and `serve_per_requester` (a sender serves every group to each
  of its 3 peers), `serve_streams` and `serve_streams_per_peer` (a receiver asks each sender round in requests of
  `limits.max_pulls_per_request` ids, all at once, for every sender round it heard since its last round: a gate
  would reset the surplus and mark the sender unreachable for the round, so the figure would be the gate's).
  `serve_rounds` holds `serve_for_s` of the bench's rounds (30 s of 50 ms rounds): join's rounds are training
  steps of seconds, where `serve_for_s` is the bound that rules; with 16 rounds of 50 ms a receiver whose round ran
  late would find the rounds it pulls from gone. Everything else is join's default (`pull_timeout_s`, the digest
  batch of at most `limits.max_digests_per_message`, the push fallback, which 50 ms rounds never reach).
- `FaninNode(transport, make_group, round_s)`: the node's exchange over `transport` (validated with the bench's
  `limits` and `policy`); `await attach()` serves its protocols and joins its shard before the transport starts.
  Its rounds (`flush`, which announces our next digests, then pulls what the digests heard since the last one
  offer; then `drain`) start at the first `offer` and run every `round_s` (50 ms by default, back to back when a
  round takes longer) until `close()`: a round every 50 ms bounds what waiting for a round adds to a group's
  latency at each end (announce, pull) as the flood path's 50 ms batch delay does, and at 64 digests a round a
  node can announce 1,280 groups/s, far above its share of the target; rounds back to back would spin on empty
  rounds and take the CPU the 4 nodes share. `deliveries` counts the groups as they come out of `drain()` (what a
  node trains on), each with its publish-to-drain latency, and drops by reason; `stats()` also gives `announced`
  (our group ids -> when their digests went out, from the exchange) and `marks` (each delivery: id, created,
  start of the round that drained it, drained).
- `latency_stages(stats)` (pure): every delivery's latency split in three, in ms, p50 and p99 of each: `announce`
  (publish -> its sender's digest out: waiting for the sender's round), `to_round` (digest out -> start of the
  receiver's round that pulled it: gossip and waiting for that round; negative when the digest came in while that
  round was under way) and `round` (that round's start -> drained: the round's announce, pulls and checks).
- `await offer(count, t0, rate)` publishes `count` groups made by `make_group(i)`: the i-th at `t0 + i / rate`, or
  with `rate` None as fast as the path takes them (the next while at most one round's digests wait: a flush
  announces `max_digests_per_message`, the rest wait for the next round, so the round is the path's back-pressure);
  it returns once every group offered has been announced.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Any

from bench.gossip_groups import Deliveries
from protocol.limits import Limits
from protocol.messages import RolloutGroup, digest_topic
from protocol.validation import AcceptPolicy
from swarm_node.sharing.exchange import Received
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_exchange import FaninExchange
from swarm_node.transport.base import Transport

ROUND_S = 0.05
UNCAPPED = 1 << 20  # more than any round of the bench reaches
SHARD_SEED_BYTES = 32


def bench_params(round_s: float = ROUND_S) -> FanInParams:
    """See the module contract: join's FanInParams with the per-round caps raised past the workload."""
    defaults = FanInParams()
    return FanInParams(pull_target=UNCAPPED, max_pulls_per_sender=UNCAPPED, serve_per_round=UNCAPPED,
                       serve_per_requester=UNCAPPED, serve_streams=UNCAPPED, serve_streams_per_peer=UNCAPPED,
                       serve_rounds=max(defaults.serve_rounds, math.ceil(defaults.serve_for_s / round_s)))


STAGES = ("announce", "to_round", "round")


def percentile(values: list[float], q: float) -> float:
    """The value at rank int(q * n) of the sorted values (the last for q near 1); NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _percentile_ms(values: list[float], q: float) -> float:
    return round(1000 * percentile(values, q), 1)


def latency_stages(stats: list[dict[str, Any]]) -> dict[str, float]:
    """See the module contract; deliveries whose announce no sender reported (pushed ones) are left out."""
    announced = {gid: t for s in stats for gid, t in s.get("announced", {}).items()}
    parts: dict[str, list[float]] = {name: [] for name in STAGES}
    for s in stats:
        for gid, created, round_start, drained in s.get("marks", []):
            if gid in announced:
                out = announced[gid]
                for name, value in zip(STAGES, (out - created, round_start - out, drained - round_start),
                                       strict=True):
                    parts[name].append(value)
    if not parts["round"]:
        return {}
    return {f"{name}_{label}_ms": _percentile_ms(values, q) for name, values in parts.items()
            for label, q in (("p50", 0.5), ("p99", 0.99))}


class FaninNode:
    def __init__(self, transport: Transport, limits: Limits, policy: AcceptPolicy,
                 make_group: Callable[[int], RolloutGroup], round_s: float = ROUND_S) -> None:
        self.limits, self.make_group, self.round_s = limits, make_group, round_s
        params = bench_params(round_s)
        # As join's "bounded" starts (sharing/exchanges.py): one shard, learning the swarm's shard count.
        self.exchange = FaninExchange(transport, limits, policy, params, os.urandom(SHARD_SEED_BYTES),
                                      n_peers=params.shard_size)
        self.topic = digest_topic(0)
        self.deliveries = Deliveries()
        self.announced: dict[str, float] = {}  # our groups (id hex) -> when their digests went out
        self.marks: list[tuple[str, float, float, float]] = []  # delivered: (id hex, created, round start, drained)
        self._rounds: asyncio.Task[None] | None = None
        self._round_done = asyncio.Event()

    async def attach(self) -> None:
        await self.exchange.start()

    async def offer(self, count: int, t0: float, rate: float | None) -> int:
        """Publish errors (none: publishing only queues); see the module contract."""
        self.announced.clear()  # each offer is measured on its own (as `Deliveries.clear` does)
        self.marks.clear()
        if self._rounds is None:
            self._rounds = asyncio.ensure_future(self._run_rounds())
        cap = self.limits.max_digests_per_message
        for i in range(count):
            if rate:
                await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
            else:
                while self.exchange.queued >= cap:
                    await self._next_round()
            self.exchange.publish([self.make_group(i)])
        while self.exchange.queued:
            await self._next_round()
        return 0

    async def _next_round(self) -> None:
        assert self._rounds is not None  # started by `offer`
        waiter = asyncio.ensure_future(self._round_done.wait())
        await asyncio.wait({waiter, self._rounds}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._rounds.done():
            self._rounds.result()  # the rounds failed: say why

    async def _run_rounds(self) -> None:
        while True:
            started = time.time()
            await self.exchange.flush()
            self.announced.update(self.exchange.announced_at)
            self.deliver(self.exchange.drain(), time.time(), started)
            self._round_done.set()
            self._round_done = asyncio.Event()
            await asyncio.sleep(max(0.0, started + self.round_s - time.time()))

    def deliver(self, drained: list[Received], now: float, round_start: float) -> None:
        """Count what `drain()` returned at `now` after the round begun at `round_start`: groups by sender with their
        latency, drops by reason."""
        for r in drained:
            if r.group is None:
                self.deliveries.drop(r.reason)
            else:
                self.deliveries.add(r.sender, [now - r.group.created_at], now)
                self.marks.append((r.group.group_id.hex(), r.group.created_at, round_start, now))

    def stats(self) -> dict[str, Any]:
        if self._rounds is not None and self._rounds.done():
            self._rounds.result()
        return {"drops": self.deliveries.drops, "round": self.exchange.round, "announced": self.announced,
                "marks": self.marks}

    async def close(self) -> None:
        if self._rounds is not None:
            self._rounds.cancel()
            await asyncio.gather(self._rounds, return_exceptions=True)
        await self.exchange.sessions.close()
