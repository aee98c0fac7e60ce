"""Node <-> network-host frames, host settings on the wire, and the restart backoff (pure logic)."""

from __future__ import annotations

import msgpack
import pytest

from swarm_node.transport.libp2p.ipc import (
    HEADER,
    MAX_FRAME_BYTES,
    MAX_SCORES,
    FrameDecoder,
    HostSettings,
    IpcError,
    Op,
    check_scores,
    encode,
)
from swarm_node.transport.supervisor import Backoff, RestartTracker


def test_frame_bytes_are_length_prefixed_msgpack() -> None:
    frame = encode(Op.CALL, 7, "publish", ["t", b"\x00\x01"])
    # msgpack: fixarray(4), 2, 7, fixstr(7) "publish", fixarray(2), fixstr(1) "t", bin8 len 2
    body = bytes([0x94, 0x02, 0x07, 0xA7]) + b"publish" + bytes([0x92, 0xA1]) + b"t" + bytes([0xC4, 0x02, 0, 1])
    assert frame == len(body).to_bytes(4, "big") + body


def test_decoder_reassembles_frames_split_anywhere() -> None:
    frames = [encode(Op.DELIVER, "topic", b"x" * 1000, "peer", 1.5), encode(Op.S_CREDIT, 3, 262144),
              encode(Op.READY, "12D3", ["/ip4/127.0.0.1/tcp/1"], [])]
    stream = b"".join(frames)
    for cut in (1, 3, 4, 5, 700, len(stream) - 1):
        decoder = FrameDecoder()
        out = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert out == [(Op.DELIVER, ["topic", b"x" * 1000, "peer", 1.5]), (Op.S_CREDIT, [3, 262144]),
                       (Op.READY, ["12D3", ["/ip4/127.0.0.1/tcp/1"], []])]
        assert decoder.pending == 0


def test_decoder_byte_by_byte() -> None:
    decoder = FrameDecoder()
    frame = encode(Op.VERDICT, 1, 2)
    out = [f for b in frame for f in decoder.feed(bytes([b]))]
    assert out == [(Op.VERDICT, [1, 2])]


@pytest.mark.parametrize("body, message", [
    (msgpack.packb({"op": 1}), "not \\[op"),
    (msgpack.packb([]), "not \\[op"),
    (msgpack.packb([99]), "unknown op 99"),
    (b"\xc1", "undecodable"),  # 0xc1 is never used in msgpack
    (msgpack.packb([1]) + b"\x00", "undecodable"),  # trailing bytes
])
def test_decoder_rejects_bad_bodies(body: bytes, message: str) -> None:
    with pytest.raises(IpcError, match=message):
        FrameDecoder().feed(HEADER.pack(len(body)) + body)


def test_oversized_frames_refused_both_ways() -> None:
    with pytest.raises(IpcError, match="exceeds"):
        FrameDecoder().feed(HEADER.pack(MAX_FRAME_BYTES + 1))
    with pytest.raises(IpcError, match="exceeds"):
        encode(Op.S_DATA, 1, b"\0" * MAX_FRAME_BYTES)


def test_host_settings_round_trip_and_unknown_keys() -> None:
    settings = HostSettings(listen=("/ip4/127.0.0.1/tcp/0",), announce=("/ip4/1.2.3.4/tcp/4001",), seen_ttl_s=2)
    wire = msgpack.unpackb(msgpack.packb(settings.to_wire()))  # tuples travel as lists
    assert HostSettings.from_wire(wire) == settings
    with pytest.raises(IpcError, match="unknown host settings"):
        HostSettings.from_wire({**wire, "bogus": 1})


def test_backoff_values() -> None:
    backoff = Backoff(initial_s=0.5, factor=2.0, max_s=4.0, jitter=0.5)
    assert [backoff.delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.delay(1, 0.5) == 1.0 * (1 - 0.25)
    assert backoff.delay(10_000) == 4.0  # no float overflow for absurd attempt counts
    with pytest.raises(ValueError):
        backoff.delay(-1)
    with pytest.raises(ValueError):
        Backoff(initial_s=0)


def test_restart_tracker_resets_after_stable_run() -> None:
    tracker = RestartTracker(stable_s=60)
    tracker.started(0)
    assert tracker.failed(5) == 0  # first crash
    tracker.started(6)
    assert tracker.failed(7) == 1  # crash loop: back off more
    assert tracker.failed(8) == 2  # a failed start (never started) counts too
    tracker.started(10)
    assert tracker.failed(100) == 0  # it ran 90 s: a fresh start


def test_scores_op_round_trip_and_checks() -> None:
    table = {"12D3KooWGood": 2.5, "12D3KooWBad": -1000.0}
    [(op, fields)] = FrameDecoder().feed(encode(Op.SCORES, table))
    assert op is Op.SCORES and check_scores(fields[0]) == table
    for bad in ({"p": float("nan")}, {"p": True}, {"p": "1"}, {1: 1.0}, {"p" * 200: 1.0}, [1.0],
                {f"p{i}": 0.0 for i in range(MAX_SCORES + 1)}):
        with pytest.raises(IpcError):
            check_scores(bad)


def test_gossipsub_score_params_and_the_pushed_table_in_the_host() -> None:
    """py-libp2p ships every weight at 0: ours are set, ordered as the spec requires, and P6 reads SCORES."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from swarm_node.transport.base import ValidationResult
    from swarm_node.transport.libp2p.host import NetworkHost, score_params

    settings = HostSettings()
    params = score_params(settings, lambda _peer: -3.0)
    assert params.p4_invalid_messages.weight == settings.invalid_penalty > 0
    assert 0 < params.p4_invalid_messages.decay < 1
    assert params.p6_appl_slack_weight == settings.app_score_weight > 0
    assert params.p5_behavior_penalty_weight > 0 and 0 < params.p5_behavior_penalty_decay < 1
    assert 0 > params.gossip_threshold > params.publish_threshold > params.graylist_threshold > -1000.0
    assert params.p7_ip_colocation_weight == 0.0  # loopback simulations: every node on one IP

    host = NetworkHost(create_new_key_pair(), settings)
    good, bad = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(2))
    assert host.gossipsub.scorer.score(bad, ["t"]) == 0.0
    [(op, fields)] = FrameDecoder().feed(encode(Op.SCORES, {good.to_base58(): 2.0, bad.to_base58(): -1000.0}))
    host._dispatch(op, fields, None)  # type: ignore[arg-type]  # SCORES needs no nursery
    scorer = host.gossipsub.scorer
    assert scorer.score(good, ["t"]) == 2.0 and not scorer.is_graylisted(good, ["t"])
    assert scorer.score(bad, ["t"]) == -1000.0 and scorer.is_graylisted(bad, ["t"])

    import trio

    async def verdict(signer: str) -> ValidationResult:
        return await host._app_validate("t", signer, b"x")
    assert trio.run(verdict, bad.to_base58()) is ValidationResult.IGNORE  # no VALIDATE round trip to the node
    assert host.counters["graylisted_signer"] == 1
    assert trio.run(verdict, good.to_base58()) is ValidationResult.ACCEPT  # "t" is not a validated topic


def test_the_node_answers_an_expired_validation_ignore_without_validating() -> None:
    """Under a flood the host gives up on a VALIDATE after its timeout; the node must not spend its time validating
    the backlog of such requests (that starved honest messages for ~80 s after one flood): past the deadline it
    answers IGNORE at once, and only requests still in time reach the validator."""
    import time

    from swarm_node.identity import generate
    from swarm_node.transport.base import ValidationResult
    from swarm_node.transport.libp2p.transport import LibP2PTransport

    seen: list[bytes] = []
    sent: list[tuple] = []

    class Recorder:
        def send(self, *frame: object) -> None:
            sent.append(frame)

    transport = LibP2PTransport(generate(b"v" * 32))
    transport._validators["t"] = lambda signer, data: (seen.append(data), ValidationResult.REJECT)[1]
    now = time.time()
    transport._dispatch(Recorder(), Op.VALIDATE, [1, "t", "peer", b"late", now - 1.0])  # type: ignore[arg-type]
    transport._dispatch(Recorder(), Op.VALIDATE, [2, "t", "peer", b"fresh", now + 60.0])  # type: ignore[arg-type]
    assert seen == [b"fresh"]
    assert sent == [(Op.VERDICT, 1, int(ValidationResult.IGNORE)), (Op.VERDICT, 2, int(ValidationResult.REJECT))]
    assert transport.stats.validation_expired == 1 and transport.stats.validated["REJECT"] == 1
