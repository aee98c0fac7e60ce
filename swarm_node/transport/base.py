"""The transport interface: gossip publish/subscribe with validators, direct byte streams, peers.

Contract (every implementation: `memory.MemoryTransport`, `libp2p.transport.LibP2PTransport`):
- asyncio-facing; all methods are called from one event loop. `start()` before anything else, `stop()` at the end.
- `publish(topic, data)` sends one small message (gossip; large payloads go over streams). It applies
  back-pressure: it returns once the message is handed to the network layer, waiting while outbound queues are
  full; it never drops silently (a message it cannot send raises `TransportError`).
- Our own publishes are not delivered to our own handlers.
- `subscribe(topic, handler)`: `handler(Delivery)` is called on the event loop for every message from another peer
  that passed the topic's validator. `Delivery.from_peer` is the signer (StrictSign), not the forwarder.
- `unsubscribe(topic)`: we leave the topic (our peers are told): its handlers and validator are dropped, and
  its messages are neither delivered to us nor forwarded by us any more. Unknown topics are a no-op.
- `set_validator(topic, fn)`: `fn(signer_peer_id, data) -> ValidationResult` runs before a message is delivered
  or forwarded to other peers. ACCEPT: deliver and forward. REJECT: drop and penalise the peer that forwarded it
  (malformed, forged). IGNORE: drop without penalty (stale, unknown version, duplicate). A validator that raises
  counts as REJECT. Without a validator every correctly signed message is accepted.
- `serve_stream(protocol_id, handler)`: `await handler(stream)` runs for each incoming stream of that protocol;
  `open_stream(peer_id, protocol_id)` dials one. Streams carry bytes in order, with half-close: after `close()`
  we can still read; `read()` returns b"" once the remote has closed its side.
- `peers()`: currently connected peers. `connect(multiaddr)` dials one and returns its peer id.
- A daemon-backed implementation (go-libp2p p2pd, for NAT traversal) could implement the same interface.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol.errors import Verdict

log = logging.getLogger(__name__)


class TransportError(Exception):
    """A transport operation failed (peer unreachable, stream reset, network layer down)."""


class TransportUnavailable(TransportError):
    """The network layer is down (being restarted by its supervisor); retry later or go on without it."""


class StreamReset(TransportError):
    """The remote side (or the network layer) aborted the stream."""


class ValidationResult(enum.IntEnum):
    """Gossipsub validation verdicts (same meaning as go-libp2p-pubsub's ValidationAccept/Reject/Ignore)."""

    ACCEPT = 0
    REJECT = 1
    IGNORE = 2

    @classmethod
    def of(cls, verdict: Verdict) -> ValidationResult:
        """The gossipsub verdict for a `protocol.validation` verdict (the same three names)."""
        return cls[verdict.name]


Validator = Callable[[str, bytes], ValidationResult]
"""fn(signer_peer_id, data) -> verdict. Runs before forwarding; keep it fast and free of I/O."""


@dataclass(frozen=True)
class Delivery:
    """One accepted gossip message. `from_peer` is the verified signer; `received_at` is time.time()."""

    topic: str
    data: bytes
    from_peer: str
    received_at: float


DeliveryHandler = Callable[[Delivery], None]


@dataclass(frozen=True)
class PeerInfo:
    """A connected peer: its id, the multiaddrs we know for it, the round-trip latency if measured, and the
    topics it told us it subscribes to (gossip published before a peer's subscription arrives misses it)."""

    peer_id: str
    addrs: tuple[str, ...] = ()
    latency_ms: float | None = None
    topics: tuple[str, ...] = ()


class Stream(ABC):
    """A bidirectional, ordered byte stream to one peer, with half-close."""

    remote_peer: str
    protocol_id: str
    remote_addr: tuple[str, int] | None = None

    @abstractmethod
    async def read(self, max_bytes: int = 1 << 16) -> bytes:
        """Up to `max_bytes` bytes (at least 1), or b"" at end of stream. Raises StreamReset if aborted."""

    async def read_exactly(self, n: int) -> bytes:
        """Exactly `n` bytes; TransportError if the stream ends first."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            chunk = await self.read(n - got)
            if not chunk:
                raise TransportError(f"stream ended after {got} of {n} bytes")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Send all of `data` (waits for flow-control credit). Raises StreamReset if aborted."""

    @abstractmethod
    async def close(self) -> None:
        """Half-close: we send no more; the remote reads b"" after our last byte. Reading stays possible."""

    @abstractmethod
    async def reset(self) -> None:
        """Abort both directions."""


StreamHandler = Callable[[Stream], Awaitable[None]]


@dataclass
class TransportStats:
    """Counters an implementation keeps; the node exports them as metrics."""

    published: int = 0
    delivered: int = 0
    validated: dict[str, int] = field(default_factory=lambda: {v.name: 0 for v in ValidationResult})
    validation_expired: int = 0  # requests past the host's deadline, answered IGNORE without validating
    restarts: int = 0


class Transport(ABC):
    """Gossip + streams between peers. See the module docstring for the contract."""

    stats: TransportStats

    @property
    @abstractmethod
    def peer_id(self) -> str:
        """Our peer id (libp2p base58 string)."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    def listen_addrs(self) -> list[str]:
        """Multiaddrs (with /p2p/<peer id>) others can dial: the announce addresses if set, else the listeners."""

    @abstractmethod
    async def publish(self, topic: str, data: bytes) -> None: ...

    @abstractmethod
    async def subscribe(self, topic: str, handler: DeliveryHandler) -> None: ...

    @abstractmethod
    async def unsubscribe(self, topic: str) -> None: ...

    @abstractmethod
    def set_validator(self, topic: str, validator: Validator) -> None: ...

    @abstractmethod
    async def serve_stream(self, protocol_id: str, handler: StreamHandler) -> None: ...

    @abstractmethod
    async def open_stream(self, peer_id: str, protocol_id: str) -> Stream: ...

    @abstractmethod
    async def peers(self) -> list[PeerInfo]: ...

    @abstractmethod
    async def connect(self, multiaddr: str) -> str:
        """Dial `multiaddr` (which ends in /p2p/<peer id>); returns the peer id. TransportError on failure."""


def run_validator(validator: Validator | None, signer: str, data: bytes) -> ValidationResult:
    """Apply a validator with the contract's rules: none means ACCEPT, an exception means REJECT."""
    if validator is None:
        return ValidationResult.ACCEPT
    try:
        return ValidationResult(validator(signer, data))
    except Exception:  # a validator crash on peer bytes must not propagate into the network layer
        log.warning("validator raised on a message signed by %s; treated as REJECT", signer, exc_info=True)
        return ValidationResult.REJECT
