"""A virtual-clock event queue with simulations/network.py's link model, for simulations of thousands of nodes.

Contract:
- The link semantics are `NetworkHub`'s (simulations/network.py), without its MemoryHub (a payload object and an
  asyncio hand-off per hop would not fit 10,000 nodes): a message of b bytes from u to v leaves u's uplink when it is
  free (sends serialised in call order), takes b*8/uplink_bps, travels `latency_s`, then queues on v's downlink the
  same way; capacity 0 is unlimited; a message is lost with probability `loss` (seeded).
- `send(src, dst, nbytes, now, handler, *args, kind=)` schedules the arrival and counts the bytes out of `src` (at
  `now`); at arrival the bytes and the message count into `dst` (`Record.inbound`, under `kind` in its breakdown),
  then `handler(t, *args)` runs.
  `at(t, handler, *args)` schedules a timer (no traffic). `run_until(t)` runs everything due by t in time order
  (ties in scheduling order); handlers may send and schedule more.
- Nothing reads a clock: a run is a function of its seeds.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from simulations.network import LinkModel, transfer_s
from simulations.scale_model import Record

Handler = Callable[..., None]


class Links:
    def __init__(self, link: LinkModel, record: Record, n: int, seed: int) -> None:
        self.link = link
        self.record = record
        self.rng = random.Random(seed)
        self.up_free = [0.0] * n
        self.down_free = [0.0] * n
        self.queue: list[tuple[float, int, Handler, tuple[Any, ...]]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.lost = 0

    def send(self, src: int, dst: int, nbytes: int, now: float, handler: Handler, *args: Any,
             kind: str = "message") -> None:
        link = self.link
        self.record.outbound(src, now, nbytes)
        if link.loss and self.rng.random() < link.loss:
            self.lost += 1
            return
        depart = max(now, self.up_free[src]) + transfer_s(nbytes, link.uplink_bps)
        self.up_free[src] = depart
        arrive = max(depart + link.latency_s, self.down_free[dst]) + transfer_s(nbytes, link.downlink_bps)
        self.down_free[dst] = arrive
        heapq.heappush(self.queue, (arrive, next(self.order), self._arrive, (dst, nbytes, handler, args, kind)))

    def _arrive(self, t: float, dst: int, nbytes: int, handler: Handler, args: tuple[Any, ...], kind: str) -> None:
        self.record.inbound(dst, t, nbytes, kind=kind)
        handler(t, *args)

    def at(self, t: float, handler: Handler, *args: Any) -> None:
        heapq.heappush(self.queue, (t, next(self.order), handler, args))

    def run_until(self, t: float) -> None:
        queue = self.queue
        while queue and queue[0][0] <= t:
            when, _, handler, args = heapq.heappop(queue)
            self.now = when
            handler(when, *args)
        self.now = max(self.now, t)
