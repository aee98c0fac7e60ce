"""What a broadcaster holds: one `HeldVersion` per payload key (owner, version, base_version), complete, being
received, or only announced; the newest `keep` per owner; and the signals that wake waiters on them.

Contract: a held version's announce always comes from its owner (its gossip signature, its own stream, or this
node publishing it). `VersionStore.remember(announce)` holds a version; past `keep` versions of one owner the
oldest are forgotten: their `done` fails with BroadcastError, `error` becomes "evicted", their waiters wake and
their pulls and streams are closed in the background. `held(owner)` lists complete versions, oldest first. A
version serves chunk k from its whole payload once complete, else from its receiver (protocol.relay.Receiver).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from protocol.messages import PolicyAnnounce
from protocol.relay import Receiver, chunk_span
from swarm_node.policy_sync.streams import reset_quietly
from swarm_node.transport.base import Stream

# (owner policy id, version, base_version): a delta to v and the snapshot of v are different payloads.
Key = tuple[str, int, int]


def key_of(announce: PolicyAnnounce) -> Key:
    return announce.owner, announce.version, announce.base_version


class BroadcastError(Exception):
    """A broadcast operation cannot be done (nothing trusted to fetch, a payload that failed verification)."""


@dataclass
class BroadcastStats:
    published: int = 0
    completed: int = 0
    failed: int = 0
    bad_chunks: int = 0  # chunks that failed their SHA-256 (then pulled from another holder)
    peer_failures: int = 0  # peers dropped mid-pull (broken stream, stall, error frame, bad chunk)
    # (bad_chunks, peer_failures and reassigned are added when a version completes or fails)
    reassigned: int = 0  # chunks moved to another holder
    served_chunks: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    protocol_errors: Counter[str] = field(default_factory=Counter)  # bad frames from peers, by reason


class Signal:
    """Wake every waiter when something changed (a chunk stored, a version announced)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True


class HeldVersion:
    """One payload version this node holds, is receiving, or only knows the announce of."""

    def __init__(self, announce: PolicyAnnounce) -> None:
        self.announce = announce  # always from the owner: its gossip signature, its own stream, or ourselves
        self.payload: bytes | None = None
        self.receiver: Receiver | None = None
        self.queue_when_done = False  # received through a relay plan (fetch returns its result instead)
        self.error: str = ""
        self.changed = Signal()
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pulls: dict[str, set[asyncio.Task[None]]] = {}
        self.streams: dict[str, set[Stream]] = {}

    def chunk(self, k: int) -> bytes | None:
        if self.payload is not None:
            return self.payload[slice(*chunk_span(self.announce.size, self.announce.chunk_count, k))]
        return self.receiver.chunk(k) if self.receiver is not None else None

    def length(self, k: int) -> int:
        start, stop = chunk_span(self.announce.size, self.announce.chunk_count, k)
        return stop - start

    def fail_done(self, error: BroadcastError) -> None:
        """Fail `done` unless it is settled (and mark the exception retrieved: nobody may be waiting on it)."""
        if not self.done.done():
            self.done.set_exception(error)
            self.done.exception()

    async def close_streams(self) -> None:
        """Cancel the pulls of this version (except the calling task) and reset its streams."""
        for tasks in self.pulls.values():
            for task in tasks:
                if task is not asyncio.current_task():
                    task.cancel()
        for streams in self.streams.values():
            for stream in list(streams):
                await reset_quietly(stream)


class VersionStore:
    """The versions a broadcaster holds, keyed by `Key`; `spawn` runs background work (closing evicted streams)."""

    def __init__(self, keep: int, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.keep = keep
        self.versions: dict[Key, HeldVersion] = {}
        self.announced = Signal()  # notified when a version is remembered
        self._spawn = spawn

    def get(self, key: Key) -> HeldVersion | None:
        return self.versions.get(key)

    def remember(self, announce: PolicyAnnounce) -> HeldVersion:
        """Hold a version; past `keep` versions of one owner the oldest is forgotten (its pulls cancelled)."""
        held = HeldVersion(announce)
        self.versions[key_of(announce)] = held
        mine = sorted(k for k in self.versions if k[0] == announce.owner)
        for key in mine[:-self.keep]:
            old = self.versions.pop(key)
            self._spawn(old.close_streams())
            old.fail_done(BroadcastError(f"{key[0]} v{key[1]} (base {key[2]}) evicted by newer versions"))
            old.error = old.error or "evicted"
            old.changed.notify()
        return held

    def held(self, owner: str) -> list[PolicyAnnounce]:
        """Announces of `owner`'s versions this node holds complete, oldest first."""
        return [v.announce for (o, _, _), v in sorted(self.versions.items(), key=lambda kv: kv[0])
                if o == owner and v.payload is not None]

    def payload(self, key: Key) -> bytes | None:
        held = self.versions.get(key)
        return held.payload if held is not None else None

    def progress(self, key: Key) -> tuple[int, int] | None:
        """(chunks held, chunk count) of a payload this node knows, else None."""
        held = self.versions.get(key)
        if held is None:
            return None
        count = held.announce.chunk_count
        if held.payload is not None:
            return count, count
        return (count - held.receiver.missing if held.receiver is not None else 0), count
