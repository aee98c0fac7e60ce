"""Bounded fan-in's wire messages (schema 5): digest batches, pull requests and responses, byte for byte, and
what a hostile peer's bytes get (a precise reason, bounded work, nothing decoded before the hash check)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any

import msgpack
import pytest

from protocol import (
    TOPIC_ROLLOUTS,
    AcceptPolicy,
    CompletionWire,
    DigestBatch,
    DigestWire,
    Limits,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
    ReplayGuard,
    RolloutGroup,
    TaskRefWire,
    Verdict,
    WireError,
    decode,
    decode_pulled,
    digest_topic,
    encode,
    encode_group,
    group_content_hash,
    topic_type,
    validate_gossip,
)

NOW = 1_700_000_000.0
ID0 = bytes(range(16))
HASH = b"\xaa" * 32


def digest(group_id: bytes = ID0, **overrides: Any) -> DigestWire:
    fields: dict[str, Any] = dict(group_id=group_id, task="chain_sum:5", reward_variance=0.25, signal=True,
                                  content_hash=HASH)
    fields.update(overrides)
    return DigestWire(**fields)


def batch(*digests: DigestWire, shard: int = 1, created_at: float = 100.0, shards: int = 0,
          addrs: tuple[str, ...] = ()) -> DigestBatch:
    return DigestBatch(shard=shard, round=7, digests=digests or (digest(),), created_at=created_at, shards=shards,
                       addrs=addrs)


ADDR = "/ip4/1.2.3.4/tcp/4001"


def group(group_id: bytes = ID0, created_at: float = 1e9) -> RolloutGroup:
    return RolloutGroup(group_id=group_id, policy_id="Qm1", policy_version=2,
                        task=TaskRefWire("chain_sum", "{}", 0, 5),
                        completions=(CompletionWire((1, 256), "ab", (-0.5, -0.25), 1.0),),
                        tokenizer_hash="tok", model_family="qwen2", created_at=created_at)


def raw(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def fails(data: bytes, limits: Limits | None = None) -> WireError:
    with pytest.raises(WireError) as info:
        decode(data, limits or Limits())
    return info.value


def test_digest_batch_exact_bytes() -> None:
    expected = (
        b"\x83\xa1v\x05\xa4type\xa7digests\xa4body"
        b"\x86"                                          # the body: 6 keys
        b"\xa5shard\x01\xa6shards\x03\xa5round\x07"           # shard 1 of the sender's 3
        b"\xa7digests\x91\x85"                           # one digest of 5 keys
        b"\xa2id\xc4\x10" + ID0
        + b"\xa4task\xabchain_sum:5"
        b"\xa8variance\xcb" + struct.pack(">d", 0.25)
        + b"\xa6signal\xc3"                              # msgpack true
        b"\xa4hash\xc4\x20" + HASH
        + b"\xa5addrs\x91\xb5/ip4/1.2.3.4/tcp/4001"         # one address of 21 characters
        b"\xaacreated_at\xcb" + struct.pack(">d", 100.0)
    )
    assert encode(batch(shards=3, addrs=(ADDR,))) == expected
    assert decode(expected, Limits()) == batch(shards=3, addrs=(ADDR,))
    assert len(expected) == 207
    # 0: the sender has not learnt a shard count yet (it publishes in shard 0 of its own M = 1 meanwhile).
    assert decode(encode(batch(shard=0)), Limits()).shards == 0
    # No address (a sender that listens on no IP network): an empty array, 7 bytes with its key.
    assert decode(encode(batch(shards=3)), Limits()).addrs == ()
    assert len(encode(batch(shards=3))) == 207 - 29 + 7


def test_digest_batch_addresses_in_canonical_form_only() -> None:
    good = ("/ip4/1.2.3.4/tcp/4001", "/ip6/2606:4700::1/tcp/65535", "/ip4/127.0.0.1/tcp/1", "/ip6/::1/tcp/80")
    assert decode(encode(batch(addrs=good)), Limits()).addrs == good
    for bad in ("/ip4/1.2.3.4/tcp/04001", "/ip4/1.2.3.4/tcp/0", "/ip4/1.2.3.4/tcp/65536", "/ip4/01.2.3.4/tcp/1",
                "/ip4/1.2.3/tcp/1", "/ip6/2606:4700:0::1/tcp/1", "/ip6/2606:4700::1/udp/1", "/ip4/1.2.3.4/udp/1/quic",
                "/dns4/example.com/tcp/1", "/ip4/1.2.3.4/tcp/1/p2p/QmPeer", "ip4/1.2.3.4/tcp/1", "/ip4/1.2.3.4/tcp/+1",
                "/ip6/2606:4700::1%eth0/tcp/1", "/ip4/1.2.3.4/tcp/1/", ""):
        err = fails(_with_body(batch(), addrs=[bad]))
        assert (err.reason, err.verdict) == ("bad_addr", Verdict.REJECT), bad


def test_pull_request_exact_bytes_ids_as_one_blob() -> None:
    second = b"\x01" * 16
    expected = (
        b"\x83\xa1v\x05\xa4type\xa4pull\xa4body\x83"
        b"\xa5round\x07"
        b"\xa3ids\xc4\x20" + ID0 + second              # two 16-byte ids in one bin
        + b"\xaacreated_at\xcb" + struct.pack(">d", 100.0)
    )
    msg = PullRequest(round=7, group_ids=[ID0, second], created_at=100.0)
    assert encode(msg) == expected
    assert decode(expected, Limits()) == msg
    assert decode(expected, Limits()).group_ids == (ID0, second)
    assert len(expected) == 85


def test_pull_response_exact_bytes_carries_the_group_encoding_unparsed() -> None:
    encoded = encode_group(group())
    assert len(encoded) == 237  # the 269-byte rollout example of WIRE.md less its envelope and groups array
    refused = b"\x02" * 16
    expected = (
        b"\x83\xa1v\x05\xa4type\xa6pulled\xa4body\x83"
        b"\xa6groups\x91\x82\xa2id\xc4\x10" + ID0 + b"\xa5group\xc4" + bytes([len(encoded)]) + encoded
        + b"\xa7refused\x91\x82\xa2id\xc4\x10" + refused + b"\xa6reason\xa4busy"
        + b"\xaacreated_at\xcb" + struct.pack(">d", 100.0)
    )
    msg = PullResponse(groups=[PulledGroup(ID0, encoded)], refused=[PullRefusal(refused, "busy")], created_at=100.0)
    assert encode(msg) == expected
    assert decode(expected, Limits()) == msg
    # The group's encoding is the group map of a rollout batch, and its hash is the replay id of that group.
    assert encoded == pack(raw(encode_group(group())))
    assert group_content_hash(group()) == hashlib.sha256(encoded).digest()


def test_pulled_group_is_checked_against_the_digest_hash_before_decoding() -> None:
    good = group(created_at=NOW)
    encoded = encode_group(good)
    assert decode_pulled(PulledGroup(ID0, encoded), group_content_hash(good), Limits(), NOW) == good
    # Bytes that are not even msgpack: the hash check answers first, nothing is parsed.
    err = _pulled_fails(PulledGroup(ID0, b"\xc1" * 40), group_content_hash(good))
    assert (err.reason, err.verdict) == ("hash_mismatch", Verdict.REJECT)
    assert err.detail == f"group {ID0.hex()}: content differs from its digest"
    # A valid group other than the announced one (e.g. a lower reward variance): hash mismatch as well.
    other = encode_group(group(created_at=NOW + 1.0))
    assert _pulled_fails(PulledGroup(ID0, other), group_content_hash(good)).reason == "hash_mismatch"
    # The hash matches but the group is not the one asked for.
    err = _pulled_fails(PulledGroup(b"\x09" * 16, encoded), group_content_hash(good))
    assert err.reason == "group_id_mismatch"
    # Over the message limit: refused before hashing.
    big = PulledGroup(ID0, b"\x00" * 1025)
    assert _pulled_fails(big, hashlib.sha256(big.data).digest(), Limits(max_message_bytes=1024)).reason \
        == "message_too_large"
    # Malformed bytes whose hash the digest did announce: the bounded parse rejects them.
    junk = b"\xc1"
    assert _pulled_fails(PulledGroup(ID0, junk), hashlib.sha256(junk).digest()).reason == "bad_msgpack"
    # Stale with `now`; accepted without it.
    old = group(created_at=NOW - 601.0)
    assert _pulled_fails(PulledGroup(ID0, encode_group(old)), group_content_hash(old), now=NOW).reason == "stale"


def test_a_pulled_group_keeps_its_spans_and_checks_them_against_its_version() -> None:
    resumed = CompletionWire((1, 256), "ab", (-0.5, -0.25), 1.0, ((0, 1), (1, 2)))  # the group's version is 2
    good = dataclasses.replace(group(created_at=NOW), completions=(resumed,))
    encoded = encode_group(good)
    assert decode_pulled(PulledGroup(ID0, encoded), group_content_hash(good), Limits(), NOW) == good
    # The encoder does not judge span order; the receiver does, for a pulled group as for a gossiped one.
    newer = dataclasses.replace(good, completions=(dataclasses.replace(resumed, spans=((0, 1), (1, 3))),))
    data = encode_group(newer)
    err = _pulled_fails(PulledGroup(ID0, data), hashlib.sha256(data).digest())
    assert (err.reason, err.detail) == ("bad_spans", "group.completions[0].spans: version 3 > the group's version 2")


def _pulled_fails(pulled: PulledGroup, content_hash: bytes, limits: Limits | None = None,
                  now: float | None = None) -> WireError:
    with pytest.raises(WireError) as info:
        decode_pulled(pulled, content_hash, limits or Limits(), now)
    return info.value


def _with_body(msg: Any, **changes: Any) -> bytes:
    obj = raw(encode(msg))
    obj["body"].update(changes)
    return pack(obj)


def _with_digest(**changes: Any) -> bytes:
    obj = raw(encode(batch()))
    obj["body"]["digests"][0].update(changes)
    return pack(obj)


@pytest.mark.parametrize(("name", "data", "reason"), [
    ("digest id of 15 bytes", lambda: _with_digest(id=b"\x00" * 15), "bad_schema"),
    ("hash of 31 bytes", lambda: _with_digest(hash=b"\x00" * 31), "bad_schema"),
    ("signal as an int", lambda: _with_digest(signal=1), "bad_schema"),
    ("negative variance", lambda: _with_digest(variance=-0.5), "out_of_range"),
    ("non-finite variance", lambda: _with_digest(variance=float("nan")), "non_finite"),
    ("task too long", lambda: _with_digest(task="x" * 129), "name_too_long"),
    ("digest extra key", lambda: _with_digest(x=0), "bad_schema"),
    ("no digests", lambda: _with_body(batch(), digests=[]), "bad_schema"),
    ("shard past the range", lambda: _with_body(batch(), shard=2**16), "out_of_range"),
    ("shard count past the range", lambda: _with_body(batch(), shards=2**16 + 1), "out_of_range"),
    ("shard not below the shard count", lambda: _with_body(batch(), shard=3, shards=3), "out_of_range"),
    ("shard count as a bool", lambda: _with_body(batch(), shards=True), "bad_schema"),
    ("no shard count", lambda: pack({**raw(encode(batch())), "body": {
        k: v for k, v in raw(encode(batch()))["body"].items() if k != "shards"}}), "bad_schema"),
    ("duplicate digest", lambda: encode(batch(digest(), digest(task="other"))), "duplicate_group"),
    ("no addrs key", lambda: pack({**raw(encode(batch())), "body": {
        k: v for k, v in raw(encode(batch()))["body"].items() if k != "addrs"}}), "bad_schema"),
    ("addrs as a string", lambda: _with_body(batch(), addrs=ADDR), "bad_schema"),
    ("address as bytes", lambda: _with_body(batch(), addrs=[ADDR.encode()]), "bad_schema"),
    ("5 addrs", lambda: encode(batch(addrs=tuple(f"/ip4/1.2.3.{i}/tcp/1" for i in range(5)))), "too_many_addrs"),
    ("address of 65 characters", lambda: _with_body(batch(), addrs=["/ip4/1.2.3.4/tcp/1" + "0" * 47]),
     "name_too_long"),
    ("an address twice", lambda: encode(batch(addrs=(ADDR, ADDR))), "duplicate_addr"),
    ("65 digests", lambda: encode(batch(*(digest(i.to_bytes(16, "big")) for i in range(65)))),
     "too_many_digests"),
    ("no ids", lambda: _with_body(PullRequest(7, (ID0,), 100.0), ids=b""), "bad_schema"),
    ("ids not a multiple of 16", lambda: _with_body(PullRequest(7, (ID0,), 100.0), ids=b"\x00" * 17),
     "bad_schema"),
    ("17 ids", lambda: encode(PullRequest(7, tuple(i.to_bytes(16, "big") for i in range(17)), 100.0)),
     "too_many_pulls"),
    ("an id twice", lambda: encode(PullRequest(7, (ID0, ID0), 100.0)), "duplicate_group"),
    ("unknown refusal", lambda: encode(PullResponse((), (PullRefusal(ID0, "later"),), 100.0)), "bad_schema"),
    ("answered twice", lambda: encode(PullResponse((PulledGroup(ID0, b"x"),), (PullRefusal(ID0, "busy"),), 100.0)),
     "duplicate_group"),
    ("9 + 8 answers", lambda: encode(PullResponse(
        tuple(PulledGroup(i.to_bytes(16, "big"), b"x") for i in range(9)),
        tuple(PullRefusal((100 + i).to_bytes(16, "big"), "busy") for i in range(8)), 100.0)), "too_many_pulls"),
    ("pulled group as a map", lambda: _with_body(PullResponse((), (), 100.0), groups=[{"id": ID0, "group": {}}]),
     "bad_schema"),
])
def test_bad_fanin_messages_get_their_precise_reason(name: str, data: Any, reason: str) -> None:
    err = fails(data())
    assert (err.reason, err.verdict) == (reason, Verdict.REJECT), name


def test_largest_valid_fanin_messages_decode_and_many_tiny_objects_do_not() -> None:
    limits = Limits()
    full = batch(*(digest(i.to_bytes(16, "big")) for i in range(limits.max_digests_per_message)),
                 addrs=tuple(f"/ip6/2606:4700:ffff:ffff:ffff:ffff:ffff:fff{i}/tcp/65535" for i in range(4)))
    assert max(len(a) for a in full.addrs) == limits.max_addr_chars - 10
    assert decode(encode(full), limits) == full
    answers = PullResponse(tuple(PulledGroup(i.to_bytes(16, "big"), b"x") for i in range(8)),
                           tuple(PullRefusal((100 + i).to_bytes(16, "big"), "busy") for i in range(8)), 100.0)
    assert decode(encode(answers), limits) == answers
    # An array of 200,000 tiny arrays in a digest batch is refused while being built (bounded CPU and memory).
    flood = pack({"v": 5, "type": "digests", "body": {"shard": 0, "round": 0, "digests": [[]] * 200_000,
                                                       "created_at": 1.0}})
    assert fails(flood).reason == "too_large"


def test_digest_topics_carry_their_shard_only() -> None:
    assert digest_topic(5) == "swarm-node/digests/5/5"
    assert topic_type("swarm-node/digests/5/5") is DigestBatch
    for not_ours in ("swarm-node/digests/5/05", "swarm-node/digests/5/+5", "swarm-node/digests/5/",
                     "swarm-node/digests/5/65536", "swarm-node/digests/4/5", "swarm-node/digests/3/5"):
        assert topic_type(not_ours) is None, not_ours
    policy = AcceptPolicy(tasks=frozenset(), max_index=1)

    def validate(topic: str, data: bytes) -> tuple[Verdict, str]:
        out = validate_gossip(topic, data, "QmPeer", limits=Limits(), policy=policy, now=NOW,
                              replay=ReplayGuard(600.0))
        return out.verdict, out.reason

    data = encode(batch(shard=5, created_at=NOW))
    assert validate(digest_topic(5), data) == (Verdict.ACCEPT, "")
    assert validate(digest_topic(4), data) == (Verdict.REJECT, "wrong_topic")
    assert validate(TOPIC_ROLLOUTS, data) == (Verdict.REJECT, "wrong_topic")
    # Pulls never travel on gossip.
    assert validate(digest_topic(5), encode(PullRequest(7, (ID0,), NOW))) == (Verdict.REJECT, "wrong_topic")
    assert validate(digest_topic(5), encode(batch(shard=5, created_at=NOW - 601.0))) == (Verdict.IGNORE, "stale")
