"""Property tests: valid messages round-trip byte-exactly; any other bytes only ever raise WireError."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz_wire import value_paths
from protocol.codec import decode, encode
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import (
    ROLES,
    SCHEMA_VERSION,
    TOPIC_TYPES,
    TYPE_TAGS,
    CompletionWire,
    Message,
    PolicyAnnounce,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
)
from protocol.validation import AcceptPolicy, ReplayGuard, validate_gossip

LIMITS = Limits()
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
peer_ids = st.text(BASE58, min_size=1, max_size=52)
policy_ids = st.one_of(peer_ids, st.builds("{}/{}".format, peer_ids,
                                           st.text("abcxyz019._-", min_size=1, max_size=20)))
u63 = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
timestamps = st.floats(0.0, 1e11)
logprobs = st.floats(max_value=0.0, width=32, allow_nan=False, allow_infinity=False)


U32_MAX = 2**32 - 1


@st.composite
def version_spans(draw: st.DrawFn, n_tokens: int, max_version: int) -> tuple[tuple[int, int], ...]:
    """Valid spans of a completion of `n_tokens` in a group of version >= `max_version`: starts from 0 and versions
    strictly ascending, every start a token, no version above `max_version`; often none."""
    k = draw(st.integers(0, min(n_tokens, 5, max_version + 1)))
    if k == 0:
        return ()
    starts = [0, *sorted(draw(st.permutations(range(1, n_tokens)))[:k - 1])]
    # Distinct versions without rejection sampling (a unique list from a small range filters too much).
    versions = sorted(draw(st.permutations(range(max_version + 1)))[:k] if max_version < 64 else
                      draw(st.lists(st.integers(0, max_version), min_size=k, max_size=k, unique=True)))
    return tuple(zip(starts, versions, strict=True))


@st.composite
def completions(draw: st.DrawFn, max_version: int = U32_MAX) -> CompletionWire:
    n = draw(st.integers(0, 12))
    return CompletionWire(token_ids=draw(st.lists(st.integers(0, LIMITS.vocab_size - 1), min_size=n, max_size=n)),
                          text=draw(st.text(max_size=60)), logprobs=draw(st.lists(logprobs, min_size=n, max_size=n)),
                          claimed_reward=draw(finite), spans=draw(version_spans(n, max_version)))


@st.composite
def groups(draw: st.DrawFn) -> RolloutGroup:
    # Small versions half the time, so that span versions meet the group's own (the bound is inclusive).
    version = draw(st.one_of(st.integers(0, 8), u63))
    return RolloutGroup(
        group_id=draw(st.binary(min_size=16, max_size=16)), policy_id=draw(policy_ids), policy_version=version,
        task=draw(st.builds(TaskRefWire, st.text(max_size=30), st.text(max_size=100), u63, u63)),
        completions=draw(st.lists(completions(min(version, U32_MAX)), min_size=1, max_size=4)),
        tokenizer_hash=draw(st.text(max_size=30)), model_family=draw(st.text(max_size=30)),
        created_at=draw(timestamps))


batches = st.builds(RolloutBatch, st.lists(groups(), min_size=1, max_size=3, unique_by=lambda g: g.group_id))
statuses = st.builds(Status, role=st.sampled_from(ROLES), capabilities=st.lists(st.text(max_size=20), max_size=5),
                     throughput=st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
                     policy_version=u63, follows=st.one_of(st.just(""), policy_ids), created_at=timestamps)


@st.composite
def announces(draw: st.DrawFn) -> PolicyAnnounce:
    version = draw(u63)
    size = draw(st.integers(1, LIMITS.max_policy_bytes))
    return PolicyAnnounce(owner=draw(policy_ids), version=version, base_version=draw(st.integers(0, version)),
                          size=size, sha256=draw(st.binary(min_size=32, max_size=32)),
                          chunk_count=draw(st.integers(1, min(size, LIMITS.max_chunks))),
                          encoding=draw(st.text(min_size=1, max_size=20)), created_at=draw(timestamps))


messages = st.one_of(batches, statuses, announces())


def decode_or_wire_error(data: bytes, limits: Limits = LIMITS) -> Message | None:
    """Decode; a WireError is fine, any other exception fails the test. A success must be canonical-stable."""
    try:
        msg = decode(data, limits)
    except WireError:
        return None
    assert decode(encode(msg), limits) == msg
    return msg


@FAST
@given(messages)
def test_every_valid_message_round_trips_byte_exactly(msg: Message) -> None:
    data = encode(msg)
    assert decode(data, LIMITS) == msg
    assert encode(decode(data, LIMITS)) == data


@FAST
@given(groups(), st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=6), st.binary(max_size=3))
def test_any_spans_blob_decodes_to_valid_spans_or_is_bad_spans(group: RolloutGroup,
                                                              pairs: list[tuple[int, int]], tail: bytes) -> None:
    """Whatever (start, version) pairs, or stray bytes, a completion's spans hold: the decoder either returns spans
    that are valid for the completion and its group (and re-encodes them byte-exactly) or says `bad_spans`."""
    obj = msgpack.unpackb(encode(RolloutBatch((group,))), raw=False)
    completion = obj["body"]["groups"][0]["completions"][0]
    completion["spans"] = b"".join(a.to_bytes(4, "little") + b.to_bytes(4, "little") for a, b in pairs) + tail
    data = msgpack.packb(obj, use_bin_type=True)
    try:
        msg = decode(data, LIMITS)
    except WireError as err:
        assert (err.reason, err.verdict) == ("bad_spans", Verdict.REJECT)
        return
    assert isinstance(msg, RolloutBatch)
    (decoded, *_) = msg.groups[0].completions
    spans = decoded.spans
    n = len(decoded.token_ids)
    assert not tail and spans == tuple(pairs)
    assert not spans or (spans[0][0] == 0 and spans[-1][0] < n and spans[-1][1] <= group.policy_version)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in zip(spans, spans[1:], strict=False))
    assert encode(msg) == data


@FAST
@given(st.binary(max_size=2000))
def test_random_bytes_only_raise_wire_error(data: bytes) -> None:
    decode_or_wire_error(data)


@FAST
@given(messages, st.data())
def test_mutated_bytes_only_raise_wire_error(msg: Message, data: st.DataObject) -> None:
    raw = bytearray(encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "byte"]))
        pos = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "flip" and raw:
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate":
            del raw[pos:]
        elif kind == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del raw[pos:pos + data.draw(st.integers(1, 8))]
        elif raw:
            raw[pos] = data.draw(st.sampled_from([0x00, 0x7F, 0x80, 0x90, 0xA0, 0xC0, 0xC1, 0xC4, 0xCB, 0xD7,
                                                  0xDC, 0xDD, 0xDE, 0xDF, 0xFF]))
    decode_or_wire_error(bytes(raw))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30)


@FAST
@given(st.sampled_from(sorted(TYPE_TAGS.values())), msgpack_values)
def test_msgpack_valid_wrong_schema_only_raises_wire_error(tag: str, body: Any) -> None:
    decode_or_wire_error(msgpack.packb({"v": SCHEMA_VERSION, "type": tag, "body": body}, use_bin_type=True))


@FAST
@given(messages, st.data())
def test_field_replaced_by_any_value_only_raises_wire_error(msg: Message, data: st.DataObject) -> None:
    obj = msgpack.unpackb(encode(msg), raw=False)
    path = data.draw(st.sampled_from(value_paths(obj)[1:]))
    parent = obj
    for step in path[:-1]:
        parent = parent[step]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(msgpack_values)
    decode_or_wire_error(msgpack.packb(obj, use_bin_type=True))


@FAST
@given(messages, st.binary(max_size=8), st.integers(0, 10_000), st.sampled_from(sorted(TOPIC_TYPES)))
def test_validate_gossip_never_raises(msg: Message, noise: bytes, cut: int, topic: str) -> None:
    data = encode(msg)
    guard = ReplayGuard(LIMITS.max_age_s)
    policy = AcceptPolicy(tasks=frozenset(), max_index=10)
    for candidate in (data, data[:cut] + noise + data[cut:], data[:cut]):
        result = validate_gossip(topic, candidate, "12D3KooWx", limits=LIMITS, policy=policy, now=1e9,
                                 replay=guard)
        assert result.verdict in (Verdict.ACCEPT, Verdict.REJECT, Verdict.IGNORE)
        assert (result.message is None) == (result.verdict != Verdict.ACCEPT)


def test_fuzz_bench_inputs_only_raise_wire_error() -> None:
    from bench.fuzz_wire import run

    result = run(inputs=3000, seed=1)
    assert result["crashes"] == 0, result["crash_examples"]
    assert sum(result["verdicts"].values()) == 3000
    assert result["verdicts"]["accept"] > 0 and result["verdicts"]["reject"] > 0
