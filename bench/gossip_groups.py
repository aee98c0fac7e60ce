"""bench.gossip's node side in groups, not messages: what one delivery carries, and a publisher that batches.

Contract:
- `delivered_groups(data, limits, now, accepted=None)`: (groups in the message, each group's publish-to-`now` latency
  in seconds), so that a bench counts groups whether a message carries one or sixteen; the message its validator
  decoded when `accepted` has it (as the node's exchange does), else decoded here.
- `publish_groups(publish, make_group, count, t0, rate, policy)`: offers `count` groups made by `make_group(i)`,
  the i-th at `t0 + i / rate` (as fast as `publish` returns when `rate` is None), through a
  `swarm_node.sharing.batching.GroupBatcher`: every batch goes out as one RolloutBatch no later than
  `policy.max_delay_s` after its first group was made (a full batch at once). `policy.max_groups == 1` is today's
  path: one message per group. Returns the number of publish errors (a bench counts failures instead of stopping).
- `Deliveries`: what a bench node counts of one round, in groups: per sender, each group's latency, the time of
  the last delivery, and drops by reason; `clear()` starts the next round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol.codec import decode, encode
from protocol.limits import Limits
from protocol.messages import RolloutBatch, RolloutGroup
from swarm_node.sharing.accepted import AcceptedMessages
from swarm_node.sharing.batching import BatchPolicy, GroupBatcher


def delivered_groups(data: bytes, limits: Limits, now: float,
                     accepted: AcceptedMessages | None = None) -> tuple[int, list[float]]:
    msg = (accepted.take(data) if accepted is not None else None) or decode(data, limits)
    if not isinstance(msg, RolloutBatch):
        return 0, []
    return len(msg.groups), [now - g.created_at for g in msg.groups]


async def publish_groups(publish: Callable[[bytes], Awaitable[None]], make_group: Callable[[int], RolloutGroup],
                         count: int, t0: float, rate: float | None, policy: BatchPolicy) -> int:
    batcher: GroupBatcher[RolloutGroup] = GroupBatcher(policy)
    errors = 0

    async def send(batches: list[tuple[RolloutGroup, ...]]) -> None:
        nonlocal errors
        for groups in batches:
            try:
                await publish(encode(RolloutBatch(groups)))
            except Exception:  # noqa: BLE001 - a bench counts failures instead of stopping
                errors += 1

    interval = 1.0 / rate if rate else 0.0
    for i in range(count):
        if interval:
            offered_at = t0 + i * interval
            # A partial batch falls due before the next group is made: send it at its deadline, not later.
            while (deadline := batcher.deadline()) is not None and deadline < offered_at:
                await asyncio.sleep(max(0.0, deadline - time.time()))
                await send(batcher.take_due(time.time()))
            await asyncio.sleep(max(0.0, offered_at - time.time()))
        await send(batcher.add(make_group(i), time.time()))
    await send(batcher.take_all())
    return errors


@dataclass
class Deliveries:
    received: dict[str, int] = field(default_factory=dict)  # sender -> groups delivered
    latencies: list[float] = field(default_factory=list)  # seconds, one per group
    last_rx: float = 0.0
    drops: dict[str, int] = field(default_factory=dict)  # reason -> messages or groups dropped

    def add(self, sender: str, latencies: list[float], now: float) -> None:
        """`len(latencies)` groups from `sender` delivered at `now`."""
        self.received[sender] = self.received.get(sender, 0) + len(latencies)
        self.latencies.extend(latencies)
        self.last_rx = now

    def drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1

    def clear(self) -> None:
        self.received.clear()
        self.latencies.clear()
        self.drops.clear()
        self.last_rx = 0.0
