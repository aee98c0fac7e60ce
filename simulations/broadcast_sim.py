"""Discrete-event simulation of pipelined policy broadcast on a virtual clock, driving protocol.relay's machines.

Contract:
- `simulate(schedule, n, size, bandwidth, ...)` broadcasts `size` bytes from source "s" to receivers "r0".."r{n-1}"
  with the relay plan of `schedule` (a protocol.relay spec such as "stripe:2", "chain" or "star") and returns a
  `SimResult`. Nothing reads a clock; results are exact functions of the inputs.
- Links: every node has an uplink and a downlink of `bandwidth` bytes/s, shared by all of its transfers at that
  moment with max-min fairness (progressive filling), recomputed whenever a transfer starts or ends. Each message
  (a request, a chunk's last byte) also takes `latency_s` to arrive.
- Streams behave as in swarm_node.policy_sync.broadcast: a `Request` action opens a stream that reaches the server after
  latency_s; the server sends the requested chunks in order, one at a time per stream, each as soon as it holds
  it (verified). Receivers are the real `protocol.relay.Receiver`s; chunk bytes are short stand-ins whose digests
  the machines check, so only the sizes are virtual (a 64 MiB payload costs no memory).
- Faults: `kill` maps a node to the virtual time it dies (its transfers stop; peers pulling from it learn of it
  latency_s later, like a connection reset); nodes in `corrupt` serve wrong bytes.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from protocol.relay import (
    Action,
    Cancel,
    Complete,
    Failed,
    Receiver,
    Request,
    Stored,
    chunk_count_for,
    chunk_span,
    make_plan,
)

SOURCE = "s"
_EPS = 1e-9


def receiver_names(n: int) -> list[str]:
    return [f"r{i}" for i in range(n)]


@dataclass
class SimResult:
    """done_at: receiver -> virtual seconds when it held the verified payload; failed: receiver -> reason;
    finish_s: when the last receiver finished (inf if one never did); sent: bytes each node uploaded."""

    done_at: dict[str, float]
    failed: dict[str, str]
    finish_s: float
    sent: dict[str, int] = field(default_factory=dict)


@dataclass
class _Stream:
    server: str
    client: str
    queue: deque[int]
    open: bool = True
    flow: _Flow | None = None


@dataclass
class _Flow:
    stream: _Stream
    chunk: int
    remaining: float
    rate: float = 0.0


class _Sim:
    def __init__(self, schedule: str, n: int, size: int, bandwidth: float, chunk_bytes: int, latency_s: float,
                 kill: Mapping[str, float], corrupt: Collection[str]) -> None:
        self.size, self.bandwidth, self.latency = size, float(bandwidth), latency_s
        self.count = chunk_count_for(size, chunk_bytes)
        self.data = [b"chunk-%d" % k for k in range(self.count)]  # stand-ins for the chunk bytes
        hashes = [hashlib.sha256(d).digest() for d in self.data]
        digest = hashlib.sha256(b"".join(self.data)).digest()
        names = receiver_names(n)
        plan = make_plan(schedule, SOURCE, names)
        self.receivers = {r: Receiver.in_plan(plan, r, hashes, digest) for r in names}
        self.corrupt = frozenset(corrupt)
        self.alive = {SOURCE, *names}
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.streams: list[_Stream] = []
        self.flows: list[_Flow] = []
        self.dirty = False
        self.result = SimResult({}, {}, float("inf"), dict.fromkeys([SOURCE, *names], 0))
        for node, t in kill.items():
            self.at(t, lambda node=node: self.kill(node))  # type: ignore[misc]
        for r in names:
            self.apply(r, self.receivers[r].start())

    # -- scheduling ---------------------------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.seq), fn))

    def run(self) -> SimResult:
        while True:
            if self.dirty:
                self.allocate()
            active = [f for f in self.flows if f.rate > 0]
            t_flow = min((self.now + f.remaining / f.rate for f in active), default=float("inf"))
            t_event = self.events[0][0] if self.events else float("inf")
            t = min(t_flow, t_event)
            if t == float("inf"):
                break
            for f in active:
                f.remaining -= f.rate * (t - self.now)
            self.now = t
            if t_flow <= t_event:
                for f in [f for f in active if f.remaining <= _EPS * self.size]:
                    self.finish(f)
            else:
                while self.events and self.events[0][0] <= t:
                    heapq.heappop(self.events)[2]()
        res = self.result
        res.finish_s = max(res.done_at.values()) if len(res.done_at) == len(self.receivers) else float("inf")
        return res

    # -- protocol -----------------------------------------------------------------------------------------------
    def has(self, node: str, k: int) -> bool:
        return node == SOURCE or self.receivers[node].has(k)

    def apply(self, node: str, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Request):
                stream = _Stream(action.peer, node, deque(action.chunks))
                self.at(self.now + self.latency, lambda s=stream: self.open(s))  # type: ignore[misc]
            elif isinstance(action, Cancel):
                for stream in self.streams:
                    if stream.client == node and stream.server == action.peer:
                        self.close(stream)
            elif isinstance(action, Stored):
                for stream in self.streams:
                    if stream.server == node:
                        self.pump(stream)
            elif isinstance(action, Complete):
                self.result.done_at[node] = self.now
            elif isinstance(action, Failed):
                self.result.failed[node] = action.reason

    def open(self, stream: _Stream) -> None:
        if stream.client not in self.alive:
            return
        if stream.server not in self.alive:  # refused: the client learns it one latency later
            self.at(self.now + self.latency, lambda: self.peer_failed(stream.client, stream.server))
            return
        self.streams.append(stream)
        self.pump(stream)

    def pump(self, stream: _Stream) -> None:
        """Start sending the stream's next chunk if the server holds it and nothing is in flight."""
        if stream.open and stream.flow is None and stream.queue and self.has(stream.server, stream.queue[0]):
            k = stream.queue[0]
            start, stop = chunk_span(self.size, self.count, k)
            stream.flow = _Flow(stream, k, float(stop - start))
            self.flows.append(stream.flow)
            self.dirty = True

    def finish(self, flow: _Flow) -> None:
        stream = flow.stream
        self.flows.remove(flow)
        self.dirty = True
        stream.flow = None
        stream.queue.popleft()
        start, stop = chunk_span(self.size, self.count, flow.chunk)
        self.result.sent[stream.server] += stop - start
        data = self.data[flow.chunk] if stream.server not in self.corrupt else b"corrupt" + self.data[flow.chunk]
        self.at(self.now + self.latency, lambda: self.deliver(stream, flow.chunk, data))
        if stream.queue:
            self.pump(stream)
        else:
            self.streams.remove(stream)

    def deliver(self, stream: _Stream, k: int, data: bytes) -> None:
        if stream.client in self.alive and stream.open:
            self.apply(stream.client, self.receivers[stream.client].on_chunk(stream.server, k, data))

    def close(self, stream: _Stream) -> None:
        stream.open = False
        if stream.flow is not None:
            self.flows.remove(stream.flow)
            stream.flow = None
            self.dirty = True
        if stream in self.streams:
            self.streams.remove(stream)

    def peer_failed(self, node: str, peer: str) -> None:
        if node in self.alive:
            self.apply(node, self.receivers[node].on_peer_failed(peer))

    def kill(self, node: str) -> None:
        self.alive.discard(node)
        for stream in list(self.streams):
            if node in (stream.server, stream.client):
                self.close(stream)
                if stream.server == node:
                    self.at(self.now + self.latency, lambda c=stream.client: self.peer_failed(c, node))  # type: ignore[misc]

    # -- bandwidth ----------------------------------------------------------------------------------------------
    def allocate(self) -> None:
        """Max-min fair rates: repeatedly saturate the link with the smallest fair share among its flows."""
        self.dirty = False
        users: dict[tuple[str, str], list[_Flow]] = {}
        for f in self.flows:
            users.setdefault(("up", f.stream.server), []).append(f)
            users.setdefault(("down", f.stream.client), []).append(f)
        capacity = dict.fromkeys(users, self.bandwidth)
        unfrozen = set(map(id, self.flows))
        while unfrozen:
            share, link = min((capacity[link] / n, link) for link, fs in users.items()
                              if (n := sum(id(f) in unfrozen for f in fs)))
            for f in users[link]:
                if id(f) in unfrozen:
                    f.rate = share
                    unfrozen.discard(id(f))
                    capacity[("up", f.stream.server)] -= share
                    capacity[("down", f.stream.client)] -= share


def simulate(schedule: str, n: int, size: int, bandwidth: float, *, chunk_bytes: int = 1 << 20,
             latency_s: float = 0.0, kill: Mapping[str, float] | None = None,
             corrupt: Collection[str] = ()) -> SimResult:
    """Broadcast `size` bytes from "s" to n receivers; see the module docstring."""
    return _Sim(schedule, n, size, bandwidth, chunk_bytes, latency_s, kill or {}, corrupt).run()
