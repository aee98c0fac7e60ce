"""The server side of `/swarm-node/chunks/1`: answer one incoming request per stream from the version store.

Contract: a request is one frame followed by the client's half-close (data after it is a bad frame). A catalog
request (`AnnounceRequest`) is answered with the announces of the owner's complete versions, oldest first. A
`ChunkRequest` waits up to `announce_wait_s` for the version to be known, then sends each chunk (a ChunkHeader
frame, then its bytes through the shaper) as soon as this node holds it, waiting at most `stall_s` per chunk; a
version that is unknown, failed, evicted or not relayed here gets an error frame. A bad frame is counted in
`stats.protocol_errors`, answered with an error frame and the stream closed; a stalled client is reset.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.chunks import (
    AnnounceFrame,
    AnnounceRequest,
    ChunkHeader,
    ChunkRequest,
    ErrorFrame,
    decode_request,
    encode_frame,
)
from protocol.codec import encode
from protocol.errors import Verdict, WireError
from swarm_node.policy_sync.store import BroadcastStats, VersionStore
from swarm_node.policy_sync.streams import StreamIO, reset_quietly
from swarm_node.transport.base import Stream, TransportError

log = logging.getLogger(__name__)


class ChunkServer:
    """Serves chunk-stream requests from `store`; see the module docstring."""

    def __init__(self, store: VersionStore, io: StreamIO, stats: BroadcastStats, announce_wait_s: float) -> None:
        self.store = store
        self.io = io
        self.stats = stats
        self.announce_wait_s = announce_wait_s

    async def serve(self, stream: Stream) -> None:
        """One incoming request: chunks of a version (each sent as soon as we hold it) or our catalog."""
        try:
            request = await self.io.read_frame(stream, decode_request)
            if await asyncio.wait_for(stream.read(1), self.io.stall_s) != b"":
                raise WireError("bad_frame", Verdict.REJECT, "data after the request (half-close after it)")
            if isinstance(request, AnnounceRequest):
                for announce in self.store.held(request.owner):
                    await stream.write(encode_frame(AnnounceFrame(encode(announce))))
            else:
                await self._serve_chunks(stream, request)
            await stream.close()
        except WireError as err:
            self.stats.protocol_errors[err.reason] += 1
            log.info("bad chunk-stream request from %s: %s", stream.remote_peer, err)
            try:
                await stream.write(encode_frame(ErrorFrame(f"{err.reason}: {err.detail}")))
                await stream.close()
            except TransportError:
                pass
        except asyncio.TimeoutError:
            await reset_quietly(stream)

    async def _serve_chunks(self, stream: Stream, request: ChunkRequest) -> None:
        key = (request.owner, request.version, request.base_version)
        known = await self.store.announced.wait_until(lambda: key in self.store.versions, self.announce_wait_s)
        held = self.store.get(key)
        if not known or held is None:
            await stream.write(encode_frame(ErrorFrame(f"unknown_version: {request.owner} v{request.version}")))
            return
        if request.chunks[-1] >= held.announce.chunk_count:
            raise WireError("bad_index", Verdict.REJECT, f"chunk {request.chunks[-1]} of {held.announce.chunk_count}")
        for k in request.chunks:
            ok = await held.changed.wait_until(lambda k=k: held.chunk(k) is not None or bool(held.error)  # type: ignore[misc]
                                               or (held.payload is None and held.receiver is None), self.io.stall_s)
            data = held.chunk(k)
            if not ok or data is None:  # we failed, were evicted, or do not relay this version at all
                await stream.write(encode_frame(ErrorFrame(f"not_held: chunk {k} ({held.error or 'not relaying'})")))
                return
            await stream.write(encode_frame(ChunkHeader(k)))
            await self.io.write_chunk(stream, data)
            self.stats.served_chunks += 1
