"""One running network host as seen from the node: its socket (`Session`) and the streams it bridges (`IpcStream`).

Contract: a `Session` owns the node's end of the socketpair with one host: `send` writes an `ipc.py` frame (or
raises TransportUnavailable once the host is gone), `request` sends a CALL and waits for its RESULT (TransportError
on an error result or after `timeout_s`), `read_frames` returns the next batch of frames ([] once the socket
closed), `on_stream_frame` routes S_DATA / S_CLOSE / S_RESET / S_CREDIT to the stream they name, and `end(why)`
fails every pending request and open stream with TransportUnavailable (idempotent). An `IpcStream` implements
`base.Stream` over S_* frames with credit-based flow control: at most STREAM_WINDOW unconsumed bytes per
direction, credit returned once a quarter of the window is read (or at end of stream).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from swarm_node.transport.base import Stream, StreamReset, TransportError, TransportUnavailable
from swarm_node.transport.libp2p.ipc import STREAM_CHUNK, STREAM_WINDOW, FrameDecoder, Op, encode
from swarm_node.transport.libp2p.launch import HostHandle


class IpcStream(Stream):
    """A stream bridged by the host: reads come as S_DATA frames, writes go out as S_DATA under credit."""

    def __init__(self, session: Session, sid: int, peer: str, protocol_id: str,
                 remote_addr: tuple[str, int] | None = None) -> None:
        self.session, self.sid = session, sid
        self.remote_peer, self.protocol_id, self.remote_addr = peer, protocol_id, remote_addr
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._reset: str | None = None
        self._unreported = 0
        self._send_credit = STREAM_WINDOW
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()

    # frames from the host
    def _feed(self, data: bytes) -> None:
        self._buf += data
        self._readable.set()

    def _feed_eof(self) -> None:
        self._eof = True
        self._readable.set()
        self._forget_if_done()

    def _forget_if_done(self) -> None:
        if self._eof and self._closed:
            self.session.streams.pop(self.sid, None)

    def _abort(self, reason: str) -> None:
        if self._reset is None:
            self._reset = reason
        self._readable.set()
        self._writable.set()

    def _credit(self, n: int) -> None:
        self._send_credit += n
        self._writable.set()

    # Stream API
    async def read(self, max_bytes: int = 1 << 16) -> bytes:
        while not self._buf and not self._eof and self._reset is None:
            self._readable.clear()
            await self._readable.wait()
        if self._reset is not None:
            raise StreamReset(self._reset)
        out = bytes(self._buf[:max_bytes])
        del self._buf[:max_bytes]
        self._unreported += len(out)
        if self._unreported >= STREAM_WINDOW // 4 or (self._eof and self._unreported):
            self.session.send(Op.S_CREDIT, self.sid, self._unreported)
            self._unreported = 0
        return out

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise TransportError("write after close")
        view = memoryview(data)
        for start in range(0, len(view), STREAM_CHUNK):
            chunk = bytes(view[start:start + STREAM_CHUNK])
            while self._send_credit < len(chunk) and self._reset is None:
                self._writable.clear()
                await self._writable.wait()
            if self._reset is not None:
                raise StreamReset(self._reset)
            self._send_credit -= len(chunk)
            self.session.send(Op.S_DATA, self.sid, chunk)
            await self.session.drain()

    async def close(self) -> None:
        if not self._closed and self._reset is None:
            self._closed = True
            self.session.send(Op.S_CLOSE, self.sid)
            self._forget_if_done()

    async def reset(self) -> None:
        if self._reset is None:
            self.session.send(Op.S_RESET, self.sid, "reset by this node")
            self._abort("reset by this node")
        self.session.streams.pop(self.sid, None)

    async def finish(self) -> None:
        """A handler is done with this stream: close it cleanly if the peer's half ended, else abort it."""
        if self._eof and self._reset is None:
            await self.close()
        else:
            await self.reset()


class Session:
    """One running host: its socket, pending requests and open streams. Ends when the socket closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handle: HostHandle) -> None:
        self.reader, self.writer, self.handle = reader, writer, handle
        self.decoder = FrameDecoder()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.streams: dict[int, IpcStream] = {}
        self.req_ids = itertools.count(1)
        self.alive = True

    def send(self, op: Op, *fields: Any) -> None:
        if not self.alive:
            raise TransportUnavailable("network layer is restarting")
        self.writer.write(encode(op, *fields))

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise TransportUnavailable("network layer went away") from exc

    def open(self, sid: int, peer: str, protocol_id: str, remote_addr: tuple[str, int] | None = None) -> IpcStream:
        """Register stream `sid` (opened by us, or announced by S_OPEN)."""
        stream = IpcStream(self, sid, peer, protocol_id, remote_addr)
        self.streams[sid] = stream
        return stream

    async def request(self, method: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """One CALL to the host and its RESULT's value."""
        if not self.alive:
            raise TransportUnavailable("network layer is down (restarting)")
        req_id = next(self.req_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[req_id] = fut
        self.send(Op.CALL, req_id, method, list(args))
        await self.drain()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            self.pending.pop(req_id, None)
            raise TransportError(f"network host did not answer {method} within {timeout_s} s") from None

    def on_result(self, req_id: int, ok: bool, value: Any) -> None:
        fut = self.pending.pop(req_id, None)
        if fut is not None and not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(TransportError(value))

    def on_stream_frame(self, op: Op, fields: list[Any]) -> None:
        """S_DATA / S_CLOSE / S_RESET / S_CREDIT for the stream `fields[0]` (ignored if it is gone)."""
        stream = self.streams.get(fields[0])
        if stream is None:
            return
        if op is Op.S_DATA:
            stream._feed(fields[1])
        elif op is Op.S_CLOSE:
            stream._feed_eof()
        elif op is Op.S_RESET:
            stream._abort(f"reset by peer or host: {fields[1]}")
            self.streams.pop(fields[0], None)
        else:
            stream._credit(fields[1])

    async def read_frames(self) -> list[tuple[Op, list[Any]]]:
        """Next batch of frames; [] when the host has gone."""
        while True:
            try:
                data = await self.reader.read(1 << 20)
            except ConnectionError:
                data = b""
            if not data:
                return []
            frames = self.decoder.feed(data)
            if frames:
                return frames

    def end(self, why: str) -> None:
        """Fail what waits on this host; idempotent."""
        self.alive = False
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(TransportUnavailable(f"network layer ended ({why})"))
        self.pending.clear()
        for stream in self.streams.values():
            stream._abort(f"network layer ended ({why})")
        self.streams.clear()
        self.writer.close()

