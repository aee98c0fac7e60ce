"""Wire formats added for broadcast: the announce's relay fields, WorkerControl, and chunk-stream frames."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from protocol.chunks import (
    AnnounceFrame,
    AnnounceRequest,
    ChunkHeader,
    ChunkRequest,
    ErrorFrame,
    decode_request,
    decode_response,
    encode_frame,
    frame_length,
    frame_limit,
)
from protocol.codec import decode, encode
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import TOPIC_CONTROL, TOPIC_POLICY, PolicyAnnounce, WorkerControl
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip

OWNER = "QmLearner"
NOW = 1_700_000_000.0
SMALL = Limits(max_receivers=3, max_chunk_bytes=100, max_message_bytes=4096)


def announce(**overrides: Any) -> PolicyAnnounce:
    digests = tuple(hashlib.sha256(bytes([k])).digest() for k in range(4))
    fields: dict[str, Any] = dict(owner=OWNER + "/main", version=7, base_version=6, size=400,
                                  sha256=b"\xab" * 32, chunk_count=4, encoding="topk-bf16", created_at=NOW,
                                  chunk_sha256=digests, state_sha256="sha256:" + "cd" * 32, schedule="stripe:2",
                                  receivers=("QmA", "QmB", "QmC"))
    fields.update(overrides)
    return PolicyAnnounce(**fields)


def reason(data: bytes, limits: Limits = SMALL) -> str:
    with pytest.raises(WireError) as info:
        decode(data, limits)
    assert info.value.verdict == Verdict.REJECT
    return info.value.reason


def test_announce_with_relay_fields_round_trips_byte_exactly() -> None:
    msg = announce(receivers=["QmA", "QmB"], chunk_sha256=list(announce().chunk_sha256))
    assert msg.receivers == ("QmA", "QmB") and isinstance(msg.chunk_sha256, tuple)  # lists normalised
    data = encode(msg)
    assert decode(data, SMALL) == msg and encode(decode(data, SMALL)) == data
    body = msgpack.unpackb(data)["body"]
    assert list(body)[8:] == ["chunk_sha256", "state", "schedule", "receivers"]
    assert body["chunk_sha256"] == b"".join(msg.chunk_sha256)  # one blob of 4 x 32 bytes


def test_an_announce_without_relay_fields_is_still_valid() -> None:
    bare = PolicyAnnounce(OWNER, 3, 2, 100, b"\x01" * 32, 2, "dense-bf16", NOW)
    assert (bare.chunk_sha256, bare.state_sha256, bare.schedule, bare.receivers) == ((), "", "", ())
    assert decode(encode(bare), Limits()) == bare


REJECTS: list[tuple[str, Callable[[], bytes], str]] = [
    ("digests not 32 x chunks", lambda: encode(announce(chunk_sha256=announce().chunk_sha256[:3])), "bad_schema"),
    ("owner among receivers", lambda: encode(announce(receivers=("QmA", OWNER))), "bad_schema"),
    ("duplicate receiver", lambda: encode(announce(receivers=("QmA", "QmA"))), "duplicate_receiver"),
    ("receivers over limit", lambda: encode(announce(receivers=("QmA", "QmB", "QmC", "QmD"))), "too_many_receivers"),
    ("receiver not a peer id", lambda: encode(announce(receivers=("QmA/x",))), "bad_peer_id"),
    ("receivers without schedule", lambda: encode(announce(schedule="")), "bad_schema"),
    ("receivers without digests", lambda: encode(announce(chunk_sha256=())), "bad_schema"),
    ("chunk over max_chunk_bytes", lambda: encode(announce(size=401)), "out_of_range"),  # ceil(401/4) = 101
    ("state too long", lambda: encode(announce(state_sha256="x" * 129)), "name_too_long"),
    ("receivers not an array", lambda: _with_body(receivers="QmA"), "bad_schema"),
    ("digests as an array", lambda: _with_body(chunk_sha256=[b"\x00" * 32] * 4), "bad_schema"),
    ("control: unknown action", lambda: encode(WorkerControl("QmW", "pause", NOW)), "bad_schema"),
    ("control: target not a peer id", lambda: encode(WorkerControl("Qm W", "stop", NOW)), "bad_peer_id"),
]


def _with_body(**changes: Any) -> bytes:
    obj = msgpack.unpackb(encode(announce()), raw=False)
    obj["body"].update(changes)
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize(("case", "build", "expected"), REJECTS, ids=[c for c, _, _ in REJECTS])
def test_violations_are_rejected_with_their_reason(case: str, build: Callable[[], bytes], expected: str) -> None:
    assert reason(build()) == expected


def test_values_at_each_limit_are_accepted() -> None:
    assert decode(encode(announce(size=400)), SMALL).size == 400  # chunks of exactly max_chunk_bytes
    assert len(decode(encode(announce()), SMALL).receivers) == 3
    # A long list of receivers (strings) passes the parser where a long list of groups would not.
    many = tuple(f"Qm{i}" for i in range(1024))
    assert decode(encode(announce(receivers=many)), Limits()).receivers == many


def test_worker_control_bytes_topic_and_attribution() -> None:
    msg = WorkerControl(target="QmWorker", action="start", created_at=100.0)
    expected = bytes.fromhex(
        "83 a1 76 05 a4 74 79 70 65 ae 77 6f 72 6b 65 72 5f 63 6f 6e 74 72 6f 6c a4 62 6f 64 79 83 a6 74 61 72 67"
        " 65 74 a8 51 6d 57 6f 72 6b 65 72 a6 61 63 74 69 6f 6e a5 73 74 61 72 74 aa 63 72 65 61 74 65 64 5f 61 74"
        " cb 40 59 00 00 00 00 00 00")
    assert encode(msg) == expected and decode(expected, Limits()) == msg
    policy = AcceptPolicy(tasks=frozenset(), max_index=1)
    ok = WorkerControl("QmWorker", "stop", NOW)
    verdict = validate_gossip(TOPIC_CONTROL, encode(ok), OWNER, limits=Limits(), policy=policy, now=NOW,
                              replay=ReplayGuard(600))
    assert verdict.verdict == Verdict.ACCEPT and verdict.message == ok
    wrong = validate_gossip(TOPIC_POLICY, encode(ok), OWNER, limits=Limits(), policy=policy, now=NOW,
                            replay=ReplayGuard(600))
    assert (wrong.verdict, wrong.reason) == (Verdict.REJECT, "wrong_topic")


# ------------------------------------------------------------------------------------------------ chunk frames
def test_frames_round_trip() -> None:
    limits = Limits()
    request = ChunkRequest(OWNER, 7, 6, (0, 2, 4))
    frame = encode_frame(request)
    assert frame[:4] == (len(frame) - 4).to_bytes(4, "big")
    assert decode_request(frame[4:], limits) == request
    assert decode_request(encode_frame(AnnounceRequest(OWNER))[4:], limits) == AnnounceRequest(OWNER)
    for response in (ChunkHeader(5), AnnounceFrame(encode(announce())), ErrorFrame("unknown_version: x")):
        assert decode_response(encode_frame(response)[4:], limits) == response
    assert encode_frame(ChunkHeader(5)) == b"\x00\x00\x00\x08\x81\xa5chunk\x05"


def body(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_bad_frames_are_rejected() -> None:
    limits = Limits(max_chunks=8)
    assert frame_length(b"\x00\x00\x00\x05", limits) == 5
    for prefix, expected in ((b"\xff\xff\xff\xff", "frame_too_large"), (b"\x00\x00\x00\x00", "bad_frame"),
                             (b"\x00\x00", "bad_frame"),
                             ((frame_limit(limits) + 1).to_bytes(4, "big"), "frame_too_large")):
        with pytest.raises(WireError) as info:
            frame_length(prefix, limits)
        assert info.value.reason == expected
    def request(**changes: Any) -> bytes:
        return body({"op": "chunks", "owner": OWNER, "version": 1, "base": 0, "idx": b"\x01\x00\x00\x00", **changes})

    assert decode_request(request(), limits) == ChunkRequest(OWNER, 1, 0, (1,))
    for bad in (b"\xc1", body([1, 2]), request(idx=b"".join(k.to_bytes(4, "little") for k in (3, 1))),
                request(idx=b"\x00\x00\x00"), request(idx=b""), request(idx=b"\x00" * 36),  # 9 > max_chunks
                request(base=2), request(x=1), body({"op": "delete", "owner": OWNER}),
                body({"op": "announces", "owner": "not a policy"})):
        with pytest.raises(WireError):
            decode_request(bad, limits)
    for bad in (body({"chunk": -1}), body({"chunk": 8}), body({"chunk": 1, "x": 2}), body({"announce": "text"}),
                body({"error": "e" * 201}), body({"what": 1}), body({"chunk": True})):
        with pytest.raises(WireError):
            decode_response(bad, limits)
