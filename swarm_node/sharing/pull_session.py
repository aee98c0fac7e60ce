"""Bounded fan-in's pulls over one long-lived stream per peer (protocol id `protocol.messages.PULL_STREAM_PROTOCOL`).

Contract (WIRE.md "Pulls"; frames as `sharing.pull_stream`'s: a 4-byte big-endian length, then one envelope):
- The client writes `pull` frames, one per request, without waiting for answers; the server answers each with
  one `pulled` frame, in the order asked. The client half-closes when it is done; the server then closes.
- `PullSessions(transport, limits, timeout_s)`: the client side. `await request(peer, request)` returns the
  server's PullResponse to that request or raises `PullFailed` like `pull_stream.request_pull` (no answer within
  `timeout_s`, a frame out of bounds, not a PullResponse, not answering exactly the ids asked, a transport error).
  One stream per peer, opened at its first request; requests to one peer are written in order on it and their
  answers matched in order. Any failure resets that stream and fails every request waiting on it (its order is
  lost); the next request opens a fresh one. A stream with nothing asked for `timeout_s * IDLE_FRACTION` is
  half-closed (it holds a slot of the server's gate; the server drops idle ones after `timeout_s`). A peer that does
  not serve the protocol (the stream cannot be opened) is asked over the one-shot protocol instead (`request_pull`),
  and for `ONE_SHOT_RETRY_S` after that without trying a stream again (each try costs a failed negotiation).
  `await close()` closes every stream.
- `serve_pull_sessions(transport, answer, limits, timeout_s, on_error, gate)`: the server side. A stream takes one
  of `gate`'s slots for its life (the same `StreamGate` as the one-shot pulls: the same caps over both); the server
  reads a frame, answers it with `answer(requester, request)`, and reads the next; it closes the stream when the
  client half-closes or when no complete request comes within `timeout_s` (idle or stalled), and resets it (and
  reports `on_error(requester, reason)` for a malformed one) as the one-shot server does. Only one request is read
  at a time, so what a stream holds is one frame (`limits.max_message_bytes`); the per-round serving caps are the
  `answer`'s, per request, as for one-shot pulls.
- `serve_fanin_streams(transport, answer, on_push, limits, params, on_error)`: what a fan-in node serves: pulls
  over both protocols within one gate (`params.serve_streams`, `serve_streams_per_peer`; OVER_PULL past the per-peer
  cap), and pushes (`pull_stream.serve_pushes`) within another of the same caps (UNSOLICITED), all with the
  deadline `params.pull_timeout_s`.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable

from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import PULL_STREAM_PROTOCOL, PullRequest, PullResponse
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_ledger import OVER_PULL, UNSOLICITED
from swarm_node.sharing.pull_stream import (
    LENGTH_BYTES,
    VANISHED,
    PullFailed,
    checked_answer,
    frame,
    gated,
    read_frame,
    request_pull,
    serve_pulls,
    serve_pushes,
)
from swarm_node.sharing.stream_gate import StreamGate
from swarm_node.transport.base import Stream, Transport, TransportError

# A stream nothing was asked on for this fraction of the deadline is half-closed, so that it holds a slot of the
# server's gate only while pulls come (join's rounds are seconds apart; bench.gossip's 50 ms rounds keep it open).
IDLE_FRACTION = 0.25
# A peer whose stream could not be opened (an older peer, or one that was unreachable) is pulled one stream per
# request for this long before a stream is tried again.
ONE_SHOT_RETRY_S = 60.0


class _Session:
    """One open stream to one peer and the requests waiting for its answers, oldest first."""

    def __init__(self, stream: Stream, limits: Limits, idle_s: float) -> None:
        self.stream, self.limits, self.idle_s = stream, limits, idle_s
        self.waiting: deque[asyncio.Future[bytes]] = deque()
        self.failed = False  # or closed: not to be used again
        self._idle: asyncio.TimerHandle | None = None
        self.closing: asyncio.Future[None] | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                data = await read_frame(self.stream, self.limits)
                if not self.waiting:
                    raise PullFailed("bad_schema", "an answer to no request")
                waiter = self.waiting.popleft()
                if not waiter.done():
                    waiter.set_result(data)
                if not self.waiting:
                    self._idle = asyncio.get_running_loop().call_later(self.idle_s, self._end_idle)
        except PullFailed as exc:
            await self.fail(exc)

    def _end_idle(self) -> None:
        """Nothing asked for `idle_s`: half-close, so that the server frees the stream's slot (it then closes)."""
        if not self.waiting and not self.failed:
            self.failed = True
            self.closing = asyncio.ensure_future(self._half_close())  # kept: the loop holds tasks weakly

    async def _half_close(self) -> None:
        try:
            await self.stream.close()
        except TransportError:
            pass  # already gone

    async def fail(self, exc: PullFailed) -> None:
        self.failed = True
        if self._idle is not None:
            self._idle.cancel()
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
        try:
            await self.stream.reset()
        except TransportError:
            pass  # already gone

    async def ask(self, request: PullRequest) -> bytes:
        if self.failed:
            raise PullFailed(VANISHED, "the stream ended")
        if self._idle is not None:
            self._idle.cancel()
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.append(waiter)  # before the write: answers come in the order written
        try:
            await self.stream.write(frame(encode(request)))
        except TransportError as exc:
            await self.fail(PullFailed(VANISHED, str(exc)))
        return await waiter

    async def close(self) -> None:
        """Drop the stream (the exchange is done with it)."""
        self.failed = True
        if self._idle is not None:
            self._idle.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        try:
            await self.stream.reset()
        except TransportError:
            pass  # already gone


class PullSessions:
    def __init__(self, transport: Transport, limits: Limits, timeout_s: float) -> None:
        self.transport, self.limits, self.timeout_s = transport, limits, timeout_s
        self._sessions: dict[str, _Session] = {}
        self._opening: dict[str, asyncio.Future[_Session | None]] = {}
        self._one_shot_until: dict[str, float] = {}  # peer -> when a stream is tried again
        self.clock = time.monotonic

    async def request(self, peer: str, request: PullRequest) -> PullResponse:
        try:
            data = await asyncio.wait_for(self._ask(peer, request), self.timeout_s)
        except TimeoutError as exc:
            session = self._sessions.pop(peer, None)
            if session is not None:  # its order is lost: whatever waits on it fails too
                await session.fail(PullFailed("timeout", f"no answer from {peer} in {self.timeout_s} s"))
            raise PullFailed("timeout", f"no answer from {peer} in {self.timeout_s} s") from exc
        if data is None:  # the peer does not serve sessions: one stream per pull
            return await request_pull(self.transport, peer, request, self.limits, self.timeout_s)
        try:
            return checked_answer(request, decode(data, self.limits))
        except WireError as exc:
            raise PullFailed(exc.reason, exc.detail) from exc

    async def _ask(self, peer: str, request: PullRequest) -> bytes | None:
        session = await self._session(peer)
        if session is None:
            return None
        try:
            return await session.ask(request)
        finally:
            if session.failed and self._sessions.get(peer) is session:
                del self._sessions[peer]

    async def _session(self, peer: str) -> _Session | None:
        """The open session to `peer`, opened now if none is (concurrent requests wait for the same opening)."""
        session = self._sessions.get(peer)
        if session is not None and not session.failed:
            return session
        if self._one_shot_until.get(peer, 0.0) > self.clock():
            return None
        self._one_shot_until.pop(peer, None)
        if peer in self._opening:
            return await asyncio.shield(self._opening[peer])
        opening: asyncio.Future[_Session | None] = asyncio.get_running_loop().create_future()
        self._opening[peer] = opening
        session = None
        try:
            stream = await self.transport.open_stream(peer, PULL_STREAM_PROTOCOL)
            session = self._sessions[peer] = _Session(stream, self.limits, self.timeout_s * IDLE_FRACTION)
            session.reader.add_done_callback(lambda _: self._forget(peer, session))
        except TransportError:  # not served there (or gone: the one-shot pull then says so)
            self._one_shot_until[peer] = self.clock() + ONE_SHOT_RETRY_S
        finally:
            del self._opening[peer]
            opening.set_result(session)  # a cancelled opening tells those waiting to use one-shot pulls
        return session

    def _forget(self, peer: str, session: _Session) -> None:
        if self._sessions.get(peer) is session:  # its stream ended: the next request opens a fresh one
            del self._sessions[peer]

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


async def _next_request(stream: Stream, limits: Limits) -> bytes | None:
    """The next request frame's envelope, or None at the client's half-close (between frames only)."""
    try:
        head = await stream.read(LENGTH_BYTES)
        if not head:
            return None
        if len(head) < LENGTH_BYTES:
            head += await stream.read_exactly(LENGTH_BYTES - len(head))
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc
    (length,) = struct.unpack(">I", head)
    if not 1 <= length <= limits.max_message_bytes:
        raise PullFailed("message_too_large", f"frame of {length} bytes")
    try:
        return await stream.read_exactly(length)
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc


async def serve_pull_sessions(transport: Transport, answer: Callable[[str, PullRequest], PullResponse],
                              limits: Limits, timeout_s: float, on_error: Callable[[str, str], None],
                              gate: StreamGate) -> None:
    async def exchange(stream: Stream) -> None:
        peer = stream.remote_peer
        # a deadline per request, not for the stream's life: idle, stalled or vanished, its slot goes to others
        while (data := await asyncio.wait_for(_next_request(stream, limits), timeout_s)) is not None:
            request = decode(data, limits)
            if not isinstance(request, PullRequest):
                raise PullFailed("bad_schema", f"{type(request).__name__} on the pull stream protocol")
            await asyncio.wait_for(stream.write(frame(encode(answer(peer, request)))), timeout_s)
        await stream.close()

    await transport.serve_stream(PULL_STREAM_PROTOCOL, gated(exchange, gate, None, on_error))


async def serve_fanin_streams(transport: Transport, answer: Callable[[str, PullRequest], PullResponse],
                              on_push: Callable[[str, PullResponse], None], limits: Limits, params: FanInParams,
                              on_error: Callable[[str, str], None]) -> None:
    timeout_s = params.pull_timeout_s
    pulls = StreamGate(params.serve_streams, params.serve_streams_per_peer, OVER_PULL)  # one-shot and sessions
    await serve_pulls(transport, answer, limits, timeout_s, on_error, pulls)
    await serve_pull_sessions(transport, answer, limits, timeout_s, on_error, pulls)
    await serve_pushes(transport, on_push, limits, timeout_s, on_error,
                       StreamGate(params.serve_streams, params.serve_streams_per_peer, UNSOLICITED))
