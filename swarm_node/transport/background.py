"""Synchronous facade for the node: a Transport on its own asyncio loop in a background thread.

The node's training loop is plain synchronous Python (torch); the transports are asyncio. `BackgroundTransport`
owns a daemon thread running an event loop with the transport on it, and exposes blocking calls plus
thread-safe inboxes. Typical wiring (what `swarm-node join` does):

    net = BackgroundTransport(lambda: LibP2PTransport(identity, config))  # host.rendezvous=TOPIC: DHT discovery
    net.start()                                        # blocks until the network layer is up
    print("join with: --bootstrap", net.listen_addrs()[0])
    net.set_validator(TOPIC, validator)                # runs on the network thread: keep it fast, self-contained
    net.subscribe_queue(TOPIC)                         # deliveries pile up in a thread-safe inbox
    net.start_network(bootstrap_addrs)                 # our address, reachability, bootstrap keeper
    for step in ...:                                   # the training loop
        try:
            net.publish(TOPIC, encoded_group)          # back-pressure: may block briefly
        except TransportError as exc:                  # TransportUnavailable while the host restarts
            log.warning("group not shared: %s", exc)   # training goes on
        for delivery in net.drain(TOPIC): ...          # non-blocking
    net.stop()

Contract: every method may be called from any thread except the network thread itself. An inbox holds at most
`inbox_limit` deliveries; past that new ones are counted in `inbox_dropped` and logged (never silently lost).
`call(fn)` runs `await fn(transport)` on the network loop, for anything else (streams, NAT status).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from swarm_node.transport.base import Delivery, PeerInfo, Transport, TransportError, Validator
from swarm_node.transport.connectivity import BootstrapKeeper, start_network

log = logging.getLogger(__name__)

T = TypeVar("T")


class BackgroundTransport:
    def __init__(self, factory: Callable[[], Transport], inbox_limit: int = 100_000) -> None:
        self._factory = factory
        self.inbox_limit = inbox_limit
        self.inbox_dropped = 0
        self._inboxes: dict[str, queue.Queue[Delivery]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._transport: Transport | None = None
        self.keeper: BootstrapKeeper | None = None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise TransportError("not started")
        return self._transport

    @property
    def peer_id(self) -> str:
        return self.transport.peer_id

    def start(self, timeout: float = 120.0) -> None:
        if self._thread is not None:
            raise TransportError("already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="network-loop", daemon=True)
        self._thread.start()

        async def start() -> Transport:
            transport = self._factory()
            await transport.start()
            return transport

        try:
            self._transport = self._submit(start(), timeout)
        except BaseException:
            self._shutdown_loop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is None:
            return

        async def stop() -> None:
            if self.keeper is not None:
                self.keeper.stop()
            if self._transport is not None:
                await self._transport.stop()

        try:
            self._submit(stop(), timeout)
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
        self._loop = self._thread = None

    def _submit(self, coro: Awaitable[T], timeout: float | None) -> T:
        if self._loop is None:
            raise TransportError("not started")
        if threading.current_thread() is self._thread:
            raise RuntimeError("BackgroundTransport methods block; do not call them from the network thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TransportError(f"network call timed out after {timeout} s") from None

    def call(self, fn: Callable[[Transport], Awaitable[T]], timeout: float | None = 60.0) -> T:
        """Run `await fn(transport)` on the network loop and return its result."""
        return self._submit(fn(self.transport), timeout)

    def listen_addrs(self) -> list[str]:
        return self.transport.listen_addrs()

    def publish(self, topic: str, data: bytes, timeout: float = 30.0) -> None:
        self._submit(self.transport.publish(topic, data), timeout)

    def set_validator(self, topic: str, validator: Validator) -> None:
        """Set before subscribing; the validator is called on the network thread."""
        self.transport.set_validator(topic, validator)

    def subscribe_queue(self, topic: str, timeout: float = 30.0) -> queue.Queue[Delivery]:
        inbox: queue.Queue[Delivery] = self._inboxes.setdefault(topic, queue.Queue(self.inbox_limit))

        def handler(delivery: Delivery) -> None:
            try:
                inbox.put_nowait(delivery)
            except queue.Full:
                self.inbox_dropped += 1
                if self.inbox_dropped in (1, 10, 100) or self.inbox_dropped % 1000 == 0:
                    log.warning("inbox for %s is full (%d); %d deliveries dropped so far: drain() more often",
                                topic, self.inbox_limit, self.inbox_dropped)

        self._submit(self.transport.subscribe(topic, handler), timeout)
        return inbox

    def drain(self, topic: str, max_items: int | None = None) -> list[Delivery]:
        """Deliveries received so far on `topic` (non-blocking)."""
        inbox = self._inboxes.get(topic)
        out: list[Delivery] = []
        while inbox is not None and (max_items is None or len(out) < max_items):
            try:
                out.append(inbox.get_nowait())
            except queue.Empty:
                break
        return out

    def peers(self, timeout: float = 30.0) -> list[PeerInfo]:
        return self._submit(self.transport.peers(), timeout)

    def connect(self, multiaddr: str, timeout: float = 30.0) -> str:
        return self._submit(self.transport.connect(multiaddr), timeout)

    def start_network(self, bootstrap: list[str], **keeper_args: Any) -> BootstrapKeeper:
        """connectivity.start_network on the network loop: logs our address and reachability, keeps peers."""
        self.keeper = self._submit(start_network(self.transport, bootstrap, **keeper_args), 30)
        return self.keeper
