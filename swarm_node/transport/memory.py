"""In-memory transport: many nodes in one asyncio loop, same semantics as the libp2p transport, no sockets.

Contract:
- A `MemoryHub` is the shared "network"; each `MemoryTransport(hub, peer_id)` is one node on it. Addresses are
  `/memory/<peer id>/p2p/<peer id>`; `connect()` makes a symmetric connection.
- Gossip floods along connections like a gossipsub mesh without degree limits: a subscribed node validates each
  message once (message id = signer + sequence number), delivers and forwards it on ACCEPT, drops it on IGNORE,
  and on REJECT drops it and counts a penalty against the forwarder (`hub.penalties[(receiver, forwarder)]`).
- Every hop goes through `MemoryHub.deliver(...)`, scheduled with `loop.call_soon`, never inline: a network model
  (latency, bandwidth, loss; the simulation issue) subclasses the hub and overrides `deliver` and `open_pipe`.
- `hub.inject(...)` hands a receiver a message with any claimed signer, to test validators against forgeries.
- Streams are in-memory pipes with the base contract (half-close, reset, bounded buffer for back-pressure).
- `await hub.settle()` waits until no delivery is in flight (tests use it instead of sleeping).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from swarm_node.transport.base import (
    Delivery,
    DeliveryHandler,
    PeerInfo,
    Stream,
    StreamHandler,
    StreamReset,
    Transport,
    TransportError,
    TransportStats,
    ValidationResult,
    Validator,
    run_validator,
)

log = logging.getLogger(__name__)

PIPE_BUFFER_BYTES = 4 << 20  # a writer waits once this much is unread, like a flow-control window


def memory_addr(peer_id: str) -> str:
    return f"/memory/{peer_id}/p2p/{peer_id}"


def peer_id_of_addr(multiaddr: str) -> str:
    """The peer id at the end of a multiaddr `.../p2p/<id>`; TransportError when there is none."""
    parts = multiaddr.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != "p2p" or not parts[-1]:
        raise TransportError(f"multiaddr {multiaddr!r} does not end in /p2p/<peer id>")
    return parts[-1]


class _Pipe:
    """One direction of a stream: bytes buffer, EOF flag, reset flag."""

    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.eof = False
        self.reset = False
        self.limit = limit
        self.changed = asyncio.Condition()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            async with self.changed:
                await self.changed.wait_for(lambda: self.reset or self.eof or len(self.buf) < self.limit)
                if self.reset:
                    raise StreamReset("stream was reset")
                if self.eof:
                    raise TransportError("write after close")
                room = self.limit - len(self.buf)
                self.buf += view[:room]
                view = view[room:]
                self.changed.notify_all()

    async def read(self, max_bytes: int) -> bytes:
        async with self.changed:
            await self.changed.wait_for(lambda: self.reset or self.buf or self.eof)
            if self.reset:
                raise StreamReset("stream was reset")
            out = bytes(self.buf[:max_bytes])
            del self.buf[:max_bytes]
            self.changed.notify_all()
            return out

    async def close(self) -> None:
        async with self.changed:
            self.eof = True
            self.changed.notify_all()

    async def abort(self) -> None:
        async with self.changed:
            self.reset = True
            self.changed.notify_all()


class MemoryStream(Stream):
    def __init__(self, inbound: _Pipe, outbound: _Pipe, remote_peer: str, protocol_id: str) -> None:
        self._in, self._out = inbound, outbound
        self.remote_peer = remote_peer
        self.protocol_id = protocol_id

    async def read(self, max_bytes: int = 1 << 16) -> bytes:
        return await self._in.read(max_bytes)

    async def write(self, data: bytes) -> None:
        await self._out.write(data)

    async def close(self) -> None:
        await self._out.close()

    async def reset(self) -> None:
        await self._in.abort()
        await self._out.abort()


class MemoryHub:
    """The shared in-process network. Override `deliver`/`open_pipe` to model links."""

    def __init__(self) -> None:
        self.nodes: dict[str, MemoryTransport] = {}
        self.links: set[frozenset[str]] = set()
        self.penalties: Counter[tuple[str, str]] = Counter()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- membership -----------------------------------------------------------------------------------------
    def register(self, node: MemoryTransport) -> None:
        if node.peer_id in self.nodes:
            raise TransportError(f"peer id {node.peer_id} already on this hub")
        self.nodes[node.peer_id] = node

    def unregister(self, node: MemoryTransport) -> None:
        self.nodes.pop(node.peer_id, None)
        self.links = {link for link in self.links if node.peer_id not in link}

    def link(self, a: str, b: str) -> None:
        if b not in self.nodes:
            raise TransportError(f"no peer {b} on this network")
        if a != b:
            self.links.add(frozenset((a, b)))

    def neighbours(self, peer_id: str) -> list[str]:
        return sorted(next(iter(link - {peer_id})) for link in self.links if peer_id in link)

    # -- gossip ---------------------------------------------------------------------------------------------
    def send(self, forwarder: str, receiver: str, topic: str, data: bytes, signer: str,
             msg_id: tuple[str, int]) -> None:
        """Schedule one hop; the loop runs `deliver` later, never inside the caller."""
        self._in_flight += 1
        self._idle.clear()
        asyncio.get_running_loop().call_soon(self._run_hop, forwarder, receiver, topic, data, signer, msg_id)

    def _run_hop(self, forwarder: str, receiver: str, topic: str, data: bytes, signer: str,
                 msg_id: tuple[str, int]) -> None:
        try:
            self.deliver(forwarder, receiver, topic, data, signer, msg_id)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    def deliver(self, forwarder: str, receiver: str, topic: str, data: bytes, signer: str,
                msg_id: tuple[str, int]) -> None:
        """Hand one message to one node now. The network-model hook: delay it, drop it, or call super()."""
        node = self.nodes.get(receiver)
        if node is not None:
            node._receive(forwarder, topic, data, signer, msg_id)

    def inject(self, forwarder: str, receiver: str, topic: str, data: bytes, signer: str) -> None:
        """Send a message whose signer is whatever the caller claims (adversarial tests)."""
        self.send(forwarder, receiver, topic, data, signer, (signer, next(_inject_seq)))

    async def settle(self) -> None:
        """Wait until every scheduled hop has run (hops may schedule more hops)."""
        while self._in_flight:
            await self._idle.wait()
            await asyncio.sleep(0)

    # -- streams --------------------------------------------------------------------------------------------
    def open_pipe(self, src: str, dst: str) -> _Pipe:
        """One direction of a new stream; a bandwidth model returns a throttled pipe."""
        return _Pipe(PIPE_BUFFER_BYTES)


_inject_seq = itertools.count(1 << 62)


class MemoryTransport(Transport):
    """One node on a `MemoryHub`."""

    def __init__(self, hub: MemoryHub, peer_id: str) -> None:
        self.hub = hub
        self._peer_id = peer_id
        self.stats = TransportStats()
        self._handlers: dict[str, list[DeliveryHandler]] = {}
        self._validators: dict[str, Validator] = {}
        self._stream_handlers: dict[str, StreamHandler] = {}
        self._seen: set[tuple[str, int]] = set()
        self._seq = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._streams: list[MemoryStream] = []
        self._running = False

    @property
    def peer_id(self) -> str:
        return self._peer_id

    async def start(self) -> None:
        self.hub.register(self)
        self._running = True

    async def stop(self) -> None:
        self._running = False
        self.hub.unregister(self)
        for stream in self._streams:
            await stream.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def listen_addrs(self) -> list[str]:
        return [memory_addr(self._peer_id)]

    async def connect(self, multiaddr: str) -> str:
        peer = peer_id_of_addr(multiaddr)
        self._check_running()
        self.hub.link(self._peer_id, peer)
        return peer

    async def peers(self) -> list[PeerInfo]:
        return [PeerInfo(p, (memory_addr(p),), None, tuple(sorted(self.hub.nodes[p]._handlers)))
                for p in self.hub.neighbours(self._peer_id)]

    # -- gossip ---------------------------------------------------------------------------------------------
    async def publish(self, topic: str, data: bytes) -> None:
        self._check_running()
        msg_id = (self._peer_id, next(self._seq))
        self._seen.add(msg_id)
        self.stats.published += 1
        self._forward(self._peer_id, topic, data, self._peer_id, msg_id)

    async def subscribe(self, topic: str, handler: DeliveryHandler) -> None:
        self._handlers.setdefault(topic, []).append(handler)

    async def unsubscribe(self, topic: str) -> None:
        self._handlers.pop(topic, None)
        self._validators.pop(topic, None)

    def set_validator(self, topic: str, validator: Validator) -> None:
        self._validators[topic] = validator

    def _forward(self, forwarder: str, topic: str, data: bytes, signer: str, msg_id: tuple[str, int]) -> None:
        for peer in self.hub.neighbours(self._peer_id):
            if peer not in (forwarder, signer):
                self.hub.send(self._peer_id, peer, topic, data, signer, msg_id)

    def _receive(self, forwarder: str, topic: str, data: bytes, signer: str, msg_id: tuple[str, int]) -> None:
        if not self._running or topic not in self._handlers or msg_id in self._seen:
            return
        self._seen.add(msg_id)
        verdict = run_validator(self._validators.get(topic), signer, data)
        self.stats.validated[verdict.name] += 1
        if verdict is ValidationResult.REJECT:
            self.hub.penalties[(self._peer_id, forwarder)] += 1
            return
        if verdict is ValidationResult.IGNORE:
            return
        delivery = Delivery(topic, data, signer, time.time())
        self.stats.delivered += 1
        for handler in self._handlers[topic]:
            handler(delivery)
        self._forward(forwarder, topic, data, signer, msg_id)

    # -- streams --------------------------------------------------------------------------------------------
    async def serve_stream(self, protocol_id: str, handler: StreamHandler) -> None:
        self._stream_handlers[protocol_id] = handler

    async def open_stream(self, peer_id: str, protocol_id: str) -> Stream:
        self._check_running()
        if frozenset((self._peer_id, peer_id)) not in self.hub.links:
            raise TransportError(f"not connected to {peer_id}")
        remote = self.hub.nodes.get(peer_id)
        handler = remote._stream_handlers.get(protocol_id) if remote is not None else None
        if remote is None or handler is None:
            raise TransportError(f"peer {peer_id} does not serve {protocol_id}")
        up, down = self.hub.open_pipe(self._peer_id, peer_id), self.hub.open_pipe(peer_id, self._peer_id)
        ours = MemoryStream(down, up, peer_id, protocol_id)
        theirs = MemoryStream(up, down, self._peer_id, protocol_id)
        self._streams.append(ours)
        remote._streams.append(theirs)
        remote._spawn(remote._run_stream_handler(handler, theirs))
        return ours

    async def _run_stream_handler(self, handler: StreamHandler, stream: MemoryStream) -> None:
        try:
            await handler(stream)
        except asyncio.CancelledError:
            await stream.reset()
            raise
        except TransportError:
            await stream.reset()
        except Exception:  # a handler failing on one peer's stream must not take the node down
            log.warning("stream handler for %s failed", stream.protocol_id, exc_info=True)
            await stream.reset()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_running(self) -> None:
        if not self._running:
            raise TransportError("transport is not started")
