"""Frames of the chunk stream protocol `/swarm-node/chunks/1` (pulling policy payload chunks), sans-I/O.

Contract (the format is documented in WIRE.md, "Chunk streams"):
- A frame is a 4-byte big-endian length L, 1 <= L <= frame_limit(limits), then L bytes holding one msgpack map.
  A `chunk` frame is followed by the chunk's bytes; their length comes from the announce, never from the frame.
- The client writes one request frame and half-closes; the server answers with frames, then closes.
- `encode_frame(msg)` writes a frame; `frame_length(prefix, limits)` checks a length prefix before anything is
  read; `decode_request` / `decode_response` decode a frame's map with bounded msgpack and an exact schema check.
  Any bad input raises `WireError` (REJECT), and nothing else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.errors import reject
from protocol.fields import expect_int, expect_map, expect_policy_id, expect_str
from protocol.limits import Limits

PROTOCOL_ID = "/swarm-node/chunks/1"
LENGTH_BYTES = 4
MAX_ERROR_CHARS = 200
_INDEX = struct.Struct("<I")


@dataclass(frozen=True)
class ChunkRequest:
    """Pull chunks `chunks` (strictly ascending) of the payload taking `owner`'s policy from `base_version` to
    `version` (a snapshot when equal), each sent as soon as the server has it."""

    owner: str
    version: int
    base_version: int
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class AnnounceRequest:
    """Which versions of `owner` does the server hold? Answered with `AnnounceFrame`s, oldest first."""

    owner: str


@dataclass(frozen=True)
class ChunkHeader:
    """Chunk `chunk`'s bytes follow this frame."""

    chunk: int


@dataclass(frozen=True)
class AnnounceFrame:
    """An encoded PolicyAnnounce envelope (decode it with protocol.codec.decode)."""

    data: bytes


@dataclass(frozen=True)
class ErrorFrame:
    """The server refuses the request (`reason` is a short code plus detail); it closes the stream after it."""

    reason: str


Request = ChunkRequest | AnnounceRequest
Response = ChunkHeader | AnnounceFrame | ErrorFrame


def frame_limit(limits: Limits) -> int:
    """Largest frame body: an announce (a gossip message) plus room for the frame's own key."""
    return limits.max_message_bytes + 1024


def _pack_indices(chunks: tuple[int, ...]) -> bytes:
    return b"".join(_INDEX.pack(k) for k in chunks)


_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    ChunkRequest: lambda m: {"op": "chunks", "owner": m.owner, "version": m.version, "base": m.base_version,
                             "idx": _pack_indices(m.chunks)},
    AnnounceRequest: lambda m: {"op": "announces", "owner": m.owner},
    ChunkHeader: lambda m: {"chunk": m.chunk},
    AnnounceFrame: lambda m: {"announce": bytes(m.data)},
    ErrorFrame: lambda m: {"error": m.reason[:MAX_ERROR_CHARS]},
}


def encode_frame(msg: Request | Response) -> bytes:
    body = msgpack.packb(_ENCODERS[type(msg)](msg), use_bin_type=True)
    return len(body).to_bytes(LENGTH_BYTES, "big") + body


def frame_length(prefix: bytes, limits: Limits) -> int:
    """The body length announced by a 4-byte prefix; REJECT `frame_too_large` / `bad_frame` before reading it."""
    if len(prefix) != LENGTH_BYTES:
        raise reject("bad_frame", f"length prefix of {len(prefix)} bytes")
    n = int.from_bytes(prefix, "big")
    if n == 0:
        raise reject("bad_frame", "empty frame")
    if n > frame_limit(limits):
        raise reject("frame_too_large", f"{n} bytes > {frame_limit(limits)}")
    return n


def _unpack(body: bytes, limits: Limits) -> dict[str, Any]:
    if len(body) > frame_limit(limits):
        raise reject("frame_too_large", f"{len(body)} bytes > {frame_limit(limits)}")
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, max_str_len=4 * MAX_ERROR_CHARS
                              + 4 * limits.max_name_chars, max_bin_len=frame_limit(limits), max_array_len=0,
                              max_map_len=5, max_ext_len=0)
    except (ValueError, TypeError, OverflowError) as exc:  # msgpack's errors for malformed or oversized input
        raise reject("bad_frame", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    if type(obj) is not dict:
        raise reject("bad_frame", f"expected a map, got {type(obj).__name__}")
    return obj


def decode_request(body: bytes, limits: Limits) -> Request:
    obj = _unpack(body, limits)
    op = obj.get("op")
    if op == "announces":
        f = expect_map(obj, ("op", "owner"), "request")
        return AnnounceRequest(expect_policy_id(f["owner"], "owner", limits))
    if op != "chunks":
        raise reject("bad_frame", f"unknown request op {str(op)[:40]!r}")
    f = expect_map(obj, ("op", "owner", "version", "base", "idx"), "request")
    idx = f["idx"]
    if type(idx) is not bytes or not idx or len(idx) % _INDEX.size:
        raise reject("bad_frame", "idx: expected a non-empty uint32 blob")
    chunks = tuple(k for (k,) in _INDEX.iter_unpack(idx))
    if len(chunks) > limits.max_chunks or any(a >= b for a, b in zip(chunks, chunks[1:], strict=False)):
        raise reject("bad_frame", "idx: chunk indices must be strictly ascending and at most max_chunks")
    version = expect_int(f["version"], "version")
    return ChunkRequest(expect_policy_id(f["owner"], "owner", limits), version,
                        expect_int(f["base"], "base", 0, version), chunks)


def decode_response(body: bytes, limits: Limits) -> Response:
    obj = _unpack(body, limits)
    if "chunk" in obj:
        chunk = expect_map(obj, ("chunk",), "response")["chunk"]
        return ChunkHeader(expect_int(chunk, "chunk", 0, limits.max_chunks - 1))
    if "announce" in obj:
        data = expect_map(obj, ("announce",), "response")["announce"]
        if type(data) is not bytes:
            raise reject("bad_frame", "announce: expected bytes")
        return AnnounceFrame(data)
    if "error" in obj:
        return ErrorFrame(expect_str(expect_map(obj, ("error",), "response")["error"], "error", MAX_ERROR_CHARS))
    raise reject("bad_frame", f"unknown response keys {sorted(map(str, obj))[:5]}")
