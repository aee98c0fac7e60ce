"""Bounded fan-in's pulls over a direct stream of any `Transport` (protocol id `protocol.messages.PULL_PROTOCOL`).

Contract (WIRE.md "Pulls"): a frame is a 4-byte big-endian length L, 1 <= L <= `limits.max_message_bytes`, then
one envelope of L bytes. The client writes one `pull` frame and half-closes; the server answers one `pulled`
frame and closes.
- `request_pull(transport, peer, request, limits, timeout_s)` returns the server's PullResponse, or raises
  `PullFailed` (a transport error, no complete answer within `timeout_s`, a frame out of bounds, a message that
  is not a PullResponse, or one that does not answer exactly the ids asked: `checked_answer`, which
  `sharing.pull_session`'s pulls over one long-lived stream share): the caller counts the pull as lost.
- `serve_pulls(transport, answer, limits, timeout_s, on_error, gate)` serves the protocol: per stream it reads one
  frame (bounded in size), decodes a PullRequest and writes the frame of `answer(requester, request)`, all within
  one deadline of `timeout_s`; a malformed request resets the stream and reports `on_error(requester, reason)`
  (reasons are the codec's). `gate` (`sharing.stream_gate`) caps the streams served at once, in all and per peer:
  a stream past a cap is reset unread and reported with the gate's reason.
- The push fallback, over `PUSH_PROTOCOL`: `send_push(transport, peer, groups, limits, timeout_s)` writes one
  `pulled` frame (no refusals) and closes, expecting no answer (PullFailed as above); `serve_pushes(transport,
  on_push, limits, timeout_s, on_error, gate)` reads one frame per stream (the same deadline and caps) and hands
  the decoded PullResponse to `on_push(sender, response)`.
Only the transport interface is used, so the in-memory and libp2p transports both carry pulls.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from protocol.codec import decode, encode
from protocol.errors import WireError
from protocol.limits import Limits
from protocol.messages import PULL_PROTOCOL, PUSH_PROTOCOL, PullRequest, PullResponse
from swarm_node.sharing.stream_gate import StreamGate
from swarm_node.transport.base import Stream, Transport, TransportError

LENGTH_BYTES = 4
VANISHED = "transport"  # the PullFailed reason of a stream that broke off (reset, ended early, layer down)


class PullFailed(Exception):
    """A pull that got no usable answer; `reason` is a short code (a codec reason, "timeout", "transport")."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def frame(envelope: bytes) -> bytes:
    return struct.pack(">I", len(envelope)) + envelope


async def read_frame(stream: Stream, limits: Limits) -> bytes:
    """One frame's envelope; the length is checked before a byte of the body is read. Raises PullFailed."""
    try:
        (length,) = struct.unpack(">I", await stream.read_exactly(LENGTH_BYTES))
        if not 1 <= length <= limits.max_message_bytes:
            raise PullFailed("message_too_large", f"frame of {length} bytes")
        return await stream.read_exactly(length)
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc


async def read_request(stream: Stream, limits: Limits) -> bytes:
    """The one frame a client sends, then its half-close: the handler must see the end of the client's side before
    it returns, or the transport aborts the stream, answer and all (libp2p: `IpcStream.finish`)."""
    envelope = await read_frame(stream, limits)
    try:
        if await stream.read(1):
            raise PullFailed("bad_schema", "data after the request (half-close after it)")
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc
    return envelope


async def request_pull(transport: Transport, peer: str, request: PullRequest, limits: Limits,
                       timeout_s: float) -> PullResponse:
    async def exchange() -> bytes:
        stream = await transport.open_stream(peer, PULL_PROTOCOL)
        try:
            await stream.write(frame(encode(request)))
            await stream.close()
            return await read_frame(stream, limits)
        finally:
            await stream.reset()

    try:
        data = await asyncio.wait_for(exchange(), timeout_s)
        response = decode(data, limits)
    except TimeoutError as exc:
        raise PullFailed("timeout", f"no answer from {peer} in {timeout_s} s") from exc
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc
    except WireError as exc:
        raise PullFailed(exc.reason, exc.detail) from exc
    return checked_answer(request, response)


def checked_answer(request: PullRequest, response: object) -> PullResponse:
    """`response` if it is a PullResponse answering exactly the ids of `request`, else PullFailed "bad_schema"."""
    if not isinstance(response, PullResponse):
        raise PullFailed("bad_schema", f"{type(response).__name__} in answer to a pull")
    answered = sorted([g.group_id for g in response.groups] + [r.group_id for r in response.refused])
    if answered != sorted(request.group_ids):
        raise PullFailed("bad_schema", "the answer does not answer exactly the ids asked")
    return response


async def serve_pulls(transport: Transport, answer: Callable[[str, PullRequest], PullResponse], limits: Limits,
                      timeout_s: float, on_error: Callable[[str, str], None], gate: StreamGate) -> None:
    async def exchange(stream: Stream) -> None:
        request = decode(await read_request(stream, limits), limits)
        if not isinstance(request, PullRequest):
            raise PullFailed("bad_schema", f"{type(request).__name__} on the pull protocol")
        await stream.write(frame(encode(answer(stream.remote_peer, request))))
        await stream.close()

    await transport.serve_stream(PULL_PROTOCOL, gated(exchange, gate, timeout_s, on_error))


def gated(exchange: Callable[[Stream], Awaitable[None]], gate: StreamGate, timeout_s: float | None,
          on_error: Callable[[str, str], None]) -> Callable[[Stream], Awaitable[None]]:
    """A stream handler that runs `exchange(stream)` within the gate's caps and one deadline of `timeout_s` for
    the whole exchange (None: the exchange keeps its own deadlines); a refused, malformed, stalled or vanished
    stream is reset (the first two reported)."""
    async def handle(stream: Stream) -> None:
        peer = stream.remote_peer
        refused = gate.enter(peer)
        if refused:
            on_error(peer, refused)
            await stream.reset()
            return
        try:
            await asyncio.wait_for(exchange(stream), timeout_s)
        except (PullFailed, WireError) as exc:
            if exc.reason != VANISHED:  # a peer that reset its own stream did nothing to report
                on_error(peer, exc.reason)
            await stream.reset()
        except (TimeoutError, TransportError):
            await stream.reset()  # a stalled or vanished peer: nothing to answer
        finally:
            gate.leave(peer)
    return handle


async def send_push(transport: Transport, peer: str, push: PullResponse, limits: Limits, timeout_s: float) -> None:
    async def send() -> None:
        stream = await transport.open_stream(peer, PUSH_PROTOCOL)
        await stream.write(frame(encode(push)))
        await stream.close()

    try:
        await asyncio.wait_for(send(), timeout_s)
    except TimeoutError as exc:
        raise PullFailed("timeout", f"push to {peer} not taken in {timeout_s} s") from exc
    except TransportError as exc:
        raise PullFailed(VANISHED, str(exc)) from exc


async def serve_pushes(transport: Transport, on_push: Callable[[str, PullResponse], None], limits: Limits,
                       timeout_s: float, on_error: Callable[[str, str], None], gate: StreamGate) -> None:
    async def exchange(stream: Stream) -> None:
        push = decode(await read_request(stream, limits), limits)
        if not isinstance(push, PullResponse) or push.refused:
            raise PullFailed("bad_schema", f"{type(push).__name__} on the push protocol")
        await stream.close()
        on_push(stream.remote_peer, push)

    await transport.serve_stream(PUSH_PROTOCOL, gated(exchange, gate, timeout_s, on_error))
