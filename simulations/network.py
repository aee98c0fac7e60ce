"""Network model for simulations: a `MemoryHub` whose gossip hops travel through modelled links on a virtual clock.

Contract:
- Time is virtual (seconds, advanced by the runner with `advance_to`); nothing here reads a clock, so a
  simulation is reproducible from its seeds.
- A hop of b bytes from u to v leaves u's uplink when the uplink is free (each node's uplink capacity is shared by
  all of its outgoing hops, serialised in send order), takes b*8/uplink_bps to transmit, travels `latency_s`, then
  queues on v's downlink the same way. Capacity 0 means unlimited. A hop is lost with probability `loss`
  (seeded); a hop to or from a node that is down is lost as well (churn).
- `hub.deliver` (the MemoryHub hook) only schedules; `advance_to(t)` hands every hop due by t to the receiving
  node in arrival order (ties in send order), which may forward and schedule more hops.
- `state()` / `restore(state)`: the model's clock, loss RNG, link occupancy and counters as JSON, for a cell's
  mid-run snapshot (simulations/snapshots.py); hops in flight are not part of it.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from swarm_node.transport.memory import MemoryHub


@dataclass(frozen=True)
class LinkModel:
    latency_s: float = 0.02
    uplink_bps: float = 0.0  # 0: unlimited
    downlink_bps: float = 0.0
    loss: float = 0.0


def transfer_s(nbytes: int, bps: float) -> float:
    return nbytes * 8 / bps if bps > 0 else 0.0


class NetworkHub(MemoryHub):
    def __init__(self, default: LinkModel, seed: int = 0) -> None:
        super().__init__()
        self.default = default
        self.models: dict[str, LinkModel] = {}  # per-node overrides (capacity, extra latency)
        self.now = 0.0
        self.rng = random.Random(seed)
        self._uplink_free: dict[str, float] = {}
        self._downlink_free: dict[str, float] = {}
        self._queue: list[tuple[float, int, tuple[str, str, str, bytes, str, tuple[str, int]]]] = []
        self._order = itertools.count()
        self.sent_bytes: Counter[str] = Counter()
        self.lost = 0

    def model(self, peer: str) -> LinkModel:
        return self.models.get(peer, self.default)

    def deliver(self, forwarder: str, receiver: str, topic: str, data: bytes, signer: str,
                msg_id: tuple[str, int]) -> None:
        up, down = self.model(forwarder), self.model(receiver)
        if self.rng.random() < max(up.loss, down.loss):
            self.lost += 1
            return
        depart = max(self.now, self._uplink_free.get(forwarder, 0.0)) + transfer_s(len(data), up.uplink_bps)
        self._uplink_free[forwarder] = depart
        arrive = max(depart + max(up.latency_s, down.latency_s), self._downlink_free.get(receiver, 0.0))
        arrive += transfer_s(len(data), down.downlink_bps)
        self._downlink_free[receiver] = arrive
        self.sent_bytes[forwarder] += len(data)
        heapq.heappush(self._queue, (arrive, next(self._order), (forwarder, receiver, topic, data, signer, msg_id)))

    def state(self) -> dict[str, Any]:
        """What a resumed cell needs to continue the same random stream and link timing (JSON values)."""
        return {"now": self.now, "rng": _to_json(self.rng.getstate()), "uplink_free": dict(self._uplink_free),
                "downlink_free": dict(self._downlink_free), "sent_bytes": dict(self.sent_bytes), "lost": self.lost}

    def restore(self, state: dict[str, Any]) -> None:
        self.now = float(state["now"])
        self.rng.setstate(_from_json(state["rng"]))
        self._uplink_free = {k: float(v) for k, v in state["uplink_free"].items()}
        self._downlink_free = {k: float(v) for k, v in state["downlink_free"].items()}
        self.sent_bytes = Counter({k: int(v) for k, v in state["sent_bytes"].items()})
        self.lost = int(state["lost"])

    def pending(self) -> int:
        return len(self._queue)

    async def advance_to(self, t: float) -> int:
        """Deliver every hop due by virtual time t (and the hops those deliveries cause); returns how many."""
        delivered = 0
        await self.settle()
        while self._queue and self._queue[0][0] <= t:
            arrive, _, hop = heapq.heappop(self._queue)
            self.now = max(self.now, arrive)
            forwarder, receiver, topic, data, signer, msg_id = hop
            if forwarder in self.nodes and receiver in self.nodes:
                super().deliver(*hop)
                delivered += 1
            else:
                self.lost += 1
            await self.settle()  # forwards scheduled by this delivery enter the queue before the next pop
        self.now = max(self.now, t)
        return delivered


def _to_json(value: Any) -> Any:
    return [_to_json(v) for v in value] if isinstance(value, tuple | list) else value


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value
