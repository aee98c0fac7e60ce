"""Stream and task plumbing shared by the broadcaster's parts (store, serve, pull): bounded frame reads, shaped
chunk reads and writes, quiet resets, and the set of background tasks.

Contract: every read is bounded in size before it is made (a frame's length prefix is checked against
protocol.chunks' frame limit, a chunk's length comes from the announce) and in time (each read waits at most
`stall_s`, then asyncio.TimeoutError). A stream that ends early raises TransportError; a bad frame raises
WireError. Chunk bytes move in PIECE_BYTES pieces through the `Shaper` and are counted in `stats`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from protocol.chunks import LENGTH_BYTES, frame_length
from protocol.limits import Limits
from swarm_node.transport.base import Stream, TransportError
from swarm_node.transport.shaping import Shaper

PIECE_BYTES = 64 << 10  # unit of shaped reads and writes: small enough that streams sharing a link interleave


class ByteCounters(Protocol):
    bytes_sent: int
    bytes_received: int


class StreamIO:
    """Reads and writes on chunk-protocol streams under one node's limits, stall timeout and shaper."""

    def __init__(self, limits: Limits, stall_s: float, shaper: Shaper, stats: ByteCounters) -> None:
        self.limits = limits
        self.stall_s = stall_s
        self.shaper = shaper
        self.stats = stats

    async def read_frame(self, stream: Stream, decoder: Callable[[bytes, Limits], Any], eof_ok: bool = False) -> Any:
        """One frame, bounded in size before reading its body and in time by stall_s per read.
        With eof_ok, a clean end of stream before the frame returns None."""
        prefix = await asyncio.wait_for(stream.read(LENGTH_BYTES), self.stall_s)
        if not prefix and eof_ok:
            return None
        if len(prefix) < LENGTH_BYTES:
            prefix += await self.read_exactly(stream, LENGTH_BYTES - len(prefix))
        body = await self.read_exactly(stream, frame_length(prefix, self.limits))
        return decoder(body, self.limits)

    async def read_exactly(self, stream: Stream, n: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < n:
            part = await asyncio.wait_for(stream.read(n - got), self.stall_s)
            if not part:
                raise TransportError(f"stream ended after {got} of {n} bytes")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    async def read_chunk(self, stream: Stream, n: int) -> bytes:
        """A chunk's `n` bytes (n from the announce), shaped and counted as received."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            part = await asyncio.wait_for(stream.read(min(PIECE_BYTES, n - got)), self.stall_s)
            if not part:
                raise TransportError(f"stream ended inside a chunk ({got} of {n} bytes)")
            await self.shaper.down(len(part))
            parts.append(part)
            got += len(part)
        self.stats.bytes_received += n
        return b"".join(parts)

    async def write_chunk(self, stream: Stream, data: bytes) -> None:
        """A chunk's bytes, shaped (the frame announcing it is the caller's); counted as sent."""
        for start in range(0, len(data), PIECE_BYTES):
            piece = data[start:start + PIECE_BYTES]
            await self.shaper.up(len(piece))
            await stream.write(piece)
        self.stats.bytes_sent += len(data)


async def reset_quietly(stream: Stream) -> None:
    try:
        await stream.reset()
    except TransportError:
        pass


class TaskSet:
    """The background tasks of one broadcaster, so that stop() can end them all."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any, group: set[asyncio.Task[Any]] | None = None) -> None:
        """Run `coro` as a task, tracked here and (while it runs) in `group` if given."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if group is not None:
            group.add(task)
            task.add_done_callback(group.discard)

    async def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
