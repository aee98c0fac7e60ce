"""Rollout exchange over any `Transport` (interface only): the node's `sharing.Exchange`.

Contract:
- `await start()` subscribes to the rollout topic with a validator running `protocol.validation.validate_gossip`
  (limits, schema, attribution, freshness, our task, replay); accepted batches are split into groups and queued;
  rejected or ignored messages are queued as drops with their reason (the node counts them per sender). A delivery
  reuses the message its validation decoded (`sharing.accepted.AcceptedMessages`) instead of decoding it again.
- `publish(groups)` (sync, from the node loop) queues our groups; `await flush()` sends them as RolloutBatch
  messages of at most `max_groups_per_message` groups each. `drain()` (sync) returns and clears what arrived.
- A round runs from one flush to the next: `round_stats` counts its inbound messages and bytes (every message
  validated; pulls stay 0 here), and `flush` hands the finished round's to `on_round` (the node's /status), then
  starts the next. `sharing.fanin_exchange.FaninExchange` keeps the same counters, so the two compare.
- `swarm_node.roles.wiring.BackgroundExchange` adapts it for a node loop running in another thread (`swarm-node join`).
Imports only the transport interface, never an implementation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from protocol.codec import decode, encode
from protocol.errors import Verdict
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, RolloutBatch, RolloutGroup
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip
from swarm_node import tasks
from swarm_node.sharing.accepted import AcceptedMessages
from swarm_node.transport.base import Delivery, Transport, ValidationResult


@dataclass(frozen=True)
class Received:
    """One thing that arrived from `sender`: a wire group, or (group None) a message dropped by wire validation."""

    sender: str
    received_at: float
    group: RolloutGroup | None
    reason: str = ""


@dataclass
class RoundStats:
    """What one exchange round (flush to flush) took in: messages and bytes validated (gossip, pull responses),
    group pulls sent and served, and drops by reason."""

    round: int = 0
    inbound_messages: int = 0
    inbound_bytes: int = 0
    pulls_sent: int = 0
    pulls_served: int = 0
    pushes_sent: int = 0  # bounded fan-in's push fallback: our groups nobody pulled, sent to one neighbour each
    by_reason: dict[str, int] = field(default_factory=dict)

    def as_status(self) -> dict[str, Any]:
        return asdict(self)


def ignore_round(_stats: RoundStats) -> None:
    """The default `on_round`: nobody reads the round's counters."""


class Exchange(Protocol):
    """The node's view of the network (sequential loop: publish after sampling, drain before mixing)."""

    @property
    def peer_id(self) -> str: ...

    def publish(self, groups: list[RolloutGroup]) -> None: ...

    def drain(self) -> list[Received]: ...


def accept_policy_for(source: tasks.TaskSource, tokenizer_hashes: frozenset[str] | None = None) -> AcceptPolicy:
    """A node takes rollouts of the (dataset, options) pairs it accepts (`task.accept`, by default its own mix) on
    its own seed."""
    return AcceptPolicy(tasks=source.accepted, max_index=source.size,
                        seeds=frozenset({source.seed}), tokenizer_hashes=tokenizer_hashes)


class TransportExchange:
    def __init__(self, transport: Transport, limits: Limits, policy: AcceptPolicy,
                 clock: Callable[[], float] = time.time) -> None:
        self.transport = transport
        self.limits = limits
        self.policy = policy
        self.clock = clock
        self.replay = ReplayGuard(limits.max_age_s)
        self.accepted = AcceptedMessages()
        self._outbox: list[RolloutGroup] = []
        self._inbox: list[Received] = []
        self._lock = threading.Lock()  # inbox is filled on the transport's loop, drained by the node thread
        self.round_stats = RoundStats()
        self.on_round: Callable[[RoundStats], None] = ignore_round
        # A graylisted, banned or denied signer (ingest.PeerGuard.blocked): IGNOREd before its message is decoded.
        self.ignore_signer: Callable[[str], bool] = lambda _signer: False

    @property
    def peer_id(self) -> str:
        return self.transport.peer_id

    async def start(self) -> None:
        self.transport.set_validator(TOPIC_ROLLOUTS, self._validate)
        await self.transport.subscribe(TOPIC_ROLLOUTS, self._on_delivery)

    def _validate(self, signer: str, data: bytes) -> ValidationResult:
        if self.ignore_signer(signer):  # not decoded, not queued: it costs one lookup
            return ValidationResult.IGNORE
        now = self.clock()
        self.round_stats.inbound_messages += 1
        self.round_stats.inbound_bytes += len(data)
        result = validate_gossip(TOPIC_ROLLOUTS, data, signer, limits=self.limits, policy=self.policy, now=now,
                                 replay=self.replay)
        if result.verdict is not Verdict.ACCEPT:
            reasons = self.round_stats.by_reason
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
            with self._lock:
                self._inbox.append(Received(signer, now, None, result.reason))
            return ValidationResult.of(result.verdict)
        assert result.message is not None  # ACCEPT carries it
        self.accepted.remember(data, result.message)
        return ValidationResult.ACCEPT

    def _on_delivery(self, delivery: Delivery) -> None:
        # The validator's decoding when we have it; else decoded again (bounded by the limits): a transport
        # without validation, or one evicted before its delivery.
        msg = self.accepted.take(delivery.data) or decode(delivery.data, self.limits)
        if isinstance(msg, RolloutBatch):
            with self._lock:
                self._inbox.extend(Received(delivery.from_peer, self.clock(), g) for g in msg.groups)

    def publish(self, groups: list[RolloutGroup]) -> None:
        self._outbox.extend(groups)

    async def flush(self) -> int:
        """Close the round (`on_round`), then send queued groups; returns the number of messages published."""
        self.on_round(self.round_stats)
        self.round_stats = RoundStats(self.round_stats.round + 1)
        out, self._outbox = self._outbox, []
        per = self.limits.max_groups_per_message
        messages = 0
        for i in range(0, len(out), per):
            await self.transport.publish(TOPIC_ROLLOUTS, encode(RolloutBatch(tuple(out[i:i + per]))))
            messages += 1
        return messages

    def drain(self) -> list[Received]:
        with self._lock:
            got, self._inbox = self._inbox, []
        return got
