"""One libp2p stream bridged to the node as S_* frames, with credit-based flow control (runs in the network host).

Contract: `StreamBridge(owner, sid, stream)` then `await run()` in the host's nursery. Bytes from the peer go to the
node as S_DATA, at most STREAM_WINDOW unacknowledged (the node's S_CREDIT frames, fed to `add_credit`, reopen the
window); what the node sends (`to_peer_send`: bytes, or None for its end of the stream) is written to the peer and
acknowledged with S_CREDIT. The peer's end of the stream is S_CLOSE; any error on either side resets the stream and
is sent as S_RESET; `abort()` (the node's S_RESET) resets it without a frame. When it ends the bridge removes
itself from `owner.streams`.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import trio
from libp2p.network.stream.exceptions import StreamEOF

from swarm_node.transport.libp2p.ipc import STREAM_CHUNK, STREAM_WINDOW, Op


class BridgeOwner(Protocol):
    """What a bridge needs of its host: the frame sender and the table of open bridges."""

    streams: dict[int, StreamBridge]

    def send(self, op: Op, *fields: Any) -> None: ...


class StreamBridge:
    """One libp2p stream <-> S_* frames. Either side's error resets the stream and tells the other side."""

    def __init__(self, owner: BridgeOwner, sid: int, stream: Any) -> None:
        self.owner, self.sid, self.stream = owner, sid, stream
        self.to_peer_send, self.to_peer_recv = trio.open_memory_channel[bytes | None](math.inf)
        self.credit = STREAM_WINDOW  # bytes we may still push to the node before it reports consuming them
        self.credit_event = trio.Event()
        self.scope = trio.CancelScope()

    def add_credit(self, n: int) -> None:
        self.credit += n
        self.credit_event.set()
        self.credit_event = trio.Event()

    async def run(self) -> None:
        reason = ""
        with self.scope:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._to_node)
                    nursery.start_soon(self._to_peer)
                await self.stream.close()
            except Exception as exc:  # any failure of a peer's stream (reset, EOF mid-write, muxer error)
                reason = f"{type(exc).__name__}: {exc}"
        if self.scope.cancelled_caught or reason:
            await self.stream.reset()
            if reason:
                self.owner.send(Op.S_RESET, self.sid, reason)
        self.owner.streams.pop(self.sid, None)

    def abort(self) -> None:
        self.scope.cancel()

    async def _to_node(self) -> None:
        while True:
            while self.credit <= 0:
                await self.credit_event.wait()
            try:
                data = await self.stream.read(min(self.credit, STREAM_CHUNK))
            except StreamEOF:
                data = b""
            if not data:
                self.owner.send(Op.S_CLOSE, self.sid)
                return
            self.credit -= len(data)
            self.owner.send(Op.S_DATA, self.sid, data)

    async def _to_peer(self) -> None:
        async for item in self.to_peer_recv:
            if item is None:
                await self.stream.close_write()
                return
            await self.stream.write(item)
            self.owner.send(Op.S_CREDIT, self.sid, len(item))
