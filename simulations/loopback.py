"""Real libp2p hosts on 127.0.0.1 for simulated nodes (`[simulation] transport = "libp2p"`).

Contract:
- `loopback_transport(identity_path)`: a `LibP2PTransport` that will listen on 127.0.0.1 at an ephemeral port,
  with the identity at `identity_path` (created on first use). Its host runs in a child process from `start()`.
- `TrackingExchange`: the node's `TransportExchange`, which also remembers the group ids it published since
  `begin_round()` and the group ids that reached it since then (delivered, or refused by its validator: a node
  that does not take another's task stream must not wait for it), so the runner can tell when a round's gossip
  has arrived. It changes nothing in what the node receives.
- `await connect_mesh(joining, up, ...)`: dial every joining transport to every other (already up, or joining
  before it), then wait until each pair sees the other subscribed to the rollout topic and one gossipsub heartbeat
  has grafted the mesh. Returns the pairs that never saw each other (the caller warns; their gossip may be lost).
- `await wait_round(exchanges, timeout_s)`: until every exchange has seen every other one's groups of this round,
  or `timeout_s` real seconds have passed. Returns, per exchange index, how many groups it is still missing.
There is no network model here: latency, bandwidth and loss are those of the real loopback interface.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from protocol.codec import decode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import TOPIC_ROLLOUTS, RolloutBatch, RolloutGroup
from protocol.validation import AcceptPolicy
from swarm_node.identity import load_or_create
from swarm_node.sharing.exchange import TransportExchange
from swarm_node.transport.base import Delivery, Transport, ValidationResult
from swarm_node.transport.libp2p.ipc import HostSettings
from swarm_node.transport.libp2p.launch import LibP2PConfig
from swarm_node.transport.libp2p.transport import LibP2PTransport

LISTEN = "/ip4/127.0.0.1/tcp/0"
POLL_S = 0.05
MESH_TIMEOUT_S = 30.0


def loopback_transport(identity_path: Path) -> LibP2PTransport:
    identity_path.parent.mkdir(parents=True, exist_ok=True)
    return LibP2PTransport(load_or_create(identity_path), LibP2PConfig(host=HostSettings(listen=(LISTEN,))))


class TrackingExchange(TransportExchange):
    """See the module docstring. `sent` and `arrived` are touched only on the event loop's thread, except
    `publish`, which the node calls from the runner's worker thread while the loop awaits it."""

    def __init__(self, transport: Transport, limits: Limits, policy: AcceptPolicy) -> None:
        super().__init__(transport, limits, policy)
        self.sent: frozenset[bytes] = frozenset()
        self.arrived: set[bytes] = set()

    def begin_round(self) -> None:
        self.sent = frozenset()
        self.arrived = set()

    def publish(self, groups: list[RolloutGroup]) -> None:
        self.sent = self.sent | {g.group_id for g in groups}
        super().publish(groups)

    def _validate(self, signer: str, data: bytes) -> ValidationResult:
        verdict = super()._validate(signer, data)
        if verdict is not ValidationResult.ACCEPT:
            self._note(data)
        return verdict

    def _on_delivery(self, delivery: Delivery) -> None:
        super()._on_delivery(delivery)
        self._note(delivery.data)

    def _note(self, data: bytes) -> None:
        # Decoded a second time (bounded by the limits): the base class keeps group ids to itself.
        try:
            msg = decode(data, self.limits)
        except WireError:  # malformed: no group ids to note (the simulated nodes never send such messages)
            return
        if isinstance(msg, RolloutBatch):
            self.arrived.update(g.group_id for g in msg.groups)


def missing_groups(exchanges: list[TrackingExchange]) -> list[int]:
    """Per exchange: groups published this round by the others that it has not received."""
    return [sum(len(other.sent - ex.arrived) for other in exchanges if other is not ex) for ex in exchanges]


async def wait_round(exchanges: list[TrackingExchange], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    missing = missing_groups(exchanges)
    while any(missing) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        missing = missing_groups(exchanges)
    return missing


async def _sees_subscribed(transport: LibP2PTransport, peer_ids: set[str]) -> set[str]:
    """Which of `peer_ids` this transport does not (yet) see subscribed to the rollout topic."""
    seen = {p.peer_id for p in await transport.peers() if TOPIC_ROLLOUTS in p.topics}
    return peer_ids - seen


async def connect_mesh(joining: list[LibP2PTransport], up: list[LibP2PTransport],
                       timeout_s: float = MESH_TIMEOUT_S) -> list[tuple[str, str]]:
    """See the module docstring. All transports are started and subscribed; `up` excludes `joining`."""
    for i, new in enumerate(joining):
        for other in [*up, *joining[:i]]:
            await new.connect(other.listen_addrs()[0])
    everyone = [*up, *joining]
    ids = {t.peer_id for t in everyone}
    deadline = time.monotonic() + timeout_s
    while True:
        lacking = [(t.peer_id, other) for t in everyone for other in await _sees_subscribed(t, ids - {t.peer_id})]
        if not lacking or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    # We subscribed before the peers were known, so the mesh is grafted at the next gossipsub heartbeat; gossip
    # published before that reaches no one.
    await asyncio.sleep(max(t.config.host.heartbeat_s for t in everyone) + 0.3)
    return lacking
