"""Codec: exact bytes of small messages, round trips, and one test per limit/schema rule (reason + verdict)."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from protocol.codec import decode, encode, replay_keys
from protocol.errors import Verdict, WireError
from protocol.limits import Limits
from protocol.messages import (
    SCHEMA_VERSION,
    CompletionWire,
    DigestBatch,
    DigestWire,
    PolicyAnnounce,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
    WorkerControl,
)

PEER = "12D3KooWPeerA"
NOW = 1_700_000_000.0


def group(**overrides: Any) -> RolloutGroup:
    fields: dict[str, Any] = dict(
        group_id=bytes(range(16)), policy_id="Qm1", policy_version=2, task=TaskRefWire("chain_sum", "{}", 0, 5),
        completions=(CompletionWire((1, 256), "ab", (-0.5, -0.25), 1.0),), tokenizer_hash="tok",
        model_family="qwen2", created_at=1e9)
    fields.update(overrides)
    return RolloutGroup(**fields)


def status(**overrides: Any) -> Status:
    fields: dict[str, Any] = dict(role="peer", capabilities=("rollouts",), throughput=1.5, policy_version=3,
                                  follows="", created_at=100.0)
    fields.update(overrides)
    return Status(**fields)


def announce(**overrides: Any) -> PolicyAnnounce:
    fields: dict[str, Any] = dict(owner=PEER + "/main", version=7, base_version=6, size=1000, sha256=b"\xab" * 32,
                                  chunk_count=4, encoding="dense-bf16", created_at=NOW)
    fields.update(overrides)
    return PolicyAnnounce(**fields)


def fails(data: bytes, limits: Limits = Limits(), now: float | None = None) -> WireError:
    with pytest.raises(WireError) as info:
        decode(data, limits, now)
    return info.value


# ----------------------------------------------------------------------------------------------- exact bytes


def test_status_exact_bytes() -> None:
    expected = (
        b"\x83"                                         # fixmap, 3 entries: the envelope
        b"\xa1v" b"\x05"                                # "v": 5
        b"\xa4type" b"\xa6status"                       # "type": "status"
        b"\xa4body" b"\x86"                             # "body": fixmap, 6 entries
        b"\xa4role" b"\xa4peer"
        b"\xaccapabilities" b"\x91" b"\xa8rollouts"     # fixarray of 1 string
        b"\xaathroughput" b"\xcb" + struct.pack(">d", 1.5)
        + b"\xaepolicy_version" b"\x03"
        b"\xa7follows" b"\xa0"                          # empty string
        b"\xaacreated_at" b"\xcb" + bytes.fromhex("4059000000000000")  # 100.0 as float64 big-endian
    )
    assert encode(status()) == expected
    assert decode(expected, Limits()) == status()


def test_rollout_exact_bytes_with_little_endian_blobs() -> None:
    expected = (
        b"\x83\xa1v\x05\xa4type\xa8rollouts\xa4body"
        b"\x81\xa6groups\x91"                           # {"groups": [ one group ]}
        b"\x89"                                         # the group: 9 keys
        b"\xa2id\xc4\x10" + bytes(range(16))            # bin8 of 16 bytes
        + b"\xa6policy\xa3Qm1"
        b"\xa7version\x02"
        b"\xa4task\x84\xa7dataset\xa9chain_sum\xa6config\xa2{}\xa4seed\x00\xa5index\x05"
        b"\xabcompletions\x91\x85"                      # one completion: 5 keys
        b"\xa6tokens\xc4\x08" b"\x01\x00\x00\x00" b"\x00\x01\x00\x00"   # uint32 LE: 1, 256
        b"\xa4text\xa2ab"
        b"\xa8logprobs\xc4\x08" b"\x00\x00\x00\xbf" b"\x00\x00\x80\xbe"  # float32 LE: -0.5, -0.25
        b"\xa6reward\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"              # 1.0
        b"\xa5spans\xc4\x00"                           # no version spans: the group's version (schema 5)
        b"\xa9tokenizer\xa3tok"
        b"\xa6family\xa5qwen2"
        b"\xa6format\xabanswer-line"                    # the prompt format (schema 2)
        b"\xaacreated_at\xcb\x41\xcd\xcd\x65\x00\x00\x00\x00"          # 1e9 = 0x3B9ACA00 as float64
    )
    batch = RolloutBatch((group(),))
    assert encode(batch) == expected
    assert decode(expected, Limits()) == batch


def test_spans_of_a_resumed_completion_exact_bytes() -> None:
    """A completion of 3 tokens whose first 2 were sampled by version 1 and the last by version 2 (APRIL resumed
    it), in a group of version 2: its spans travel as one bin of (start, version) uint32 little-endian pairs."""
    resumed = CompletionWire((1, 256, 3), "abc", (-0.5, -0.25, -1.0), 1.0, [[0, 1], [2, 2]])
    batch = RolloutBatch((group(completions=(resumed,)),))
    spans_field = (b"\xa5spans" b"\xc4\x10"                # "spans": bin8 of 16 bytes (2 pairs)
                   b"\x00\x00\x00\x00" b"\x01\x00\x00\x00"    # (start 0, version 1)
                   b"\x02\x00\x00\x00" b"\x02\x00\x00\x00")   # (start 2, version 2)
    data = encode(batch)
    assert data.count(spans_field) == 1
    assert data[data.index(b"\xa6reward"):].startswith(b"\xa6reward\xcb" + struct.pack(">d", 1.0) + spans_field)
    assert len(data) == 269 + 4 + 1 + 4 + 16  # the rollout of WIRE.md + a token, its log-prob, "c", 2 spans
    decoded = decode(data, Limits())
    assert decoded == batch
    assert decoded.groups[0].completions[0].spans == ((0, 1), (2, 2))  # lists normalised to tuples
    assert encode(decoded) == data


def test_every_hex_example_of_wire_md_is_what_encode_writes() -> None:
    """WIRE.md's worked examples, in order: the status, the rollout group, its spans field for a resumed
    completion, the worker control and the digest batch (a schema bump must regenerate them)."""
    text = (Path(__file__).resolve().parents[2] / "protocol" / "WIRE.md").read_text()
    blocks = [bytes.fromhex(b) for b in re.findall(r"```\n([0-9a-f \n]+)```", text)]
    resumed = CompletionWire((1, 256), "ab", (-0.5, -0.25), 1.0, ((0, 1), (1, 2)))
    with_spans = encode(RolloutBatch((group(completions=(resumed,)),)))
    spans_field = with_spans[with_spans.index(b"\xa5spans"):with_spans.index(b"\xa9tokenizer")]
    digests = DigestBatch(shard=1, round=7, digests=(DigestWire(bytes(range(16)), "chain_sum:5", 0.25, True,
                                                                b"\xaa" * 32),),
                          created_at=100.0, shards=3, addrs=("/ip4/1.2.3.4/tcp/4001",))
    assert blocks == [encode(status()), encode(RolloutBatch((group(),))), spans_field,
                      encode(WorkerControl(target="QmWorker", action="start", created_at=100.0)), encode(digests)]
    assert [len(b) for b in blocks] == [120, 269, 24, 79, 207]  # the sizes WIRE.md states


def test_round_trip_each_type_and_lists_normalised_to_tuples() -> None:
    batch = RolloutBatch([group(), group(group_id=b"\x01" * 16, completions=[CompletionWire([], "", [], 0.0)])])
    for msg in (batch, status(capabilities=["relay", "deltas"], role="worker", follows=PEER), announce()):
        data = encode(msg)
        assert decode(data, Limits()) == msg
        assert encode(decode(data, Limits())) == data


def test_logprobs_are_float32_on_the_wire() -> None:
    msg = RolloutBatch((group(completions=(CompletionWire((3,), "x", (-0.1,), 0.0),)),))
    (completion,) = decode(encode(msg), Limits()).groups[0].completions
    assert completion.logprobs == (struct.unpack("<f", struct.pack("<f", -0.1))[0],)
    assert completion.logprobs != (-0.1,)


def test_int_for_float_field_accepted_and_reencoded_as_float() -> None:
    obj = msgpack.unpackb(encode(status()), raw=False)
    obj["body"]["created_at"] = 100  # another implementation may write 100.0 as an int
    data = msgpack.packb(obj, use_bin_type=True)
    assert decode(data, Limits()) == status()
    assert encode(decode(data, Limits())) == encode(status())


def test_replay_key_is_independent_of_key_order() -> None:
    batch = RolloutBatch((group(),))
    obj = msgpack.unpackb(encode(batch), raw=False)
    obj["body"]["groups"][0] = dict(reversed(list(obj["body"]["groups"][0].items())))
    reordered = msgpack.packb(obj, use_bin_type=True)
    assert reordered != encode(batch)
    assert replay_keys(decode(reordered, Limits())) == replay_keys(batch)
    assert replay_keys(RolloutBatch((group(created_at=2e9),)))[0][0] != replay_keys(batch)[0][0]


def test_encode_refuses_unencodable_values() -> None:
    with pytest.raises(WireError) as info:
        encode(RolloutBatch((group(completions=(CompletionWire((1, 2), "ab", (-0.5,), 0.0),)),)))
    assert info.value.reason == "bad_blob"
    with pytest.raises(WireError) as info:
        encode(status(follows="\ud800"))  # a lone surrogate has no UTF-8 encoding
    assert info.value.reason == "unencodable"
    with pytest.raises(WireError) as info:
        encode(RolloutBatch((group(completions=(CompletionWire((-1,), "a", (0.0,), 0.0),)),)))
    assert info.value.reason == "unencodable"
    with pytest.raises(WireError):
        encode("not a message")  # type: ignore[arg-type]


@pytest.mark.parametrize("spans", [((0, 2**32),), ((-1, 1),), ((0, 1, 2),), ((0, 1.0),), ((0, True),)])
def test_encode_refuses_spans_that_are_not_uint32_pairs(spans: tuple[tuple[Any, ...], ...]) -> None:
    with pytest.raises(WireError) as info:
        encode(RolloutBatch((group(completions=(CompletionWire((1, 2), "ab", (-0.5, -0.5), 0.0, spans),)),)))
    assert info.value.reason == "unencodable"


# ---------------------------------------------------------------------------------------------- limits/schema

SMALL = Limits(max_message_bytes=4096, max_groups_per_message=2, max_completions_per_group=2,
               max_tokens_per_completion=4, max_text_chars=8, vocab_size=300, max_name_chars=24,
               max_config_chars=32, max_capabilities=2, max_policy_bytes=1000, max_chunks=10,
               max_digests_per_message=2, max_pulls_per_request=2, max_spans_per_completion=2)


def raw(msg: Any) -> Any:
    return msgpack.unpackb(encode(msg), raw=False)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def mutated_group(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    obj = raw(RolloutBatch((group(),)))
    mutate(obj["body"]["groups"][0])
    return pack(obj)


def mutated_completion(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    return mutated_group(lambda g: mutate(g["completions"][0]))


def set_key(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.__setitem__(key, value)


def n_completions(n: int) -> bytes:
    c = CompletionWire((1,), "a", (-1.0,), 0.0)
    return encode(RolloutBatch((group(completions=(c,) * n),)))


def n_groups(n: int) -> bytes:
    return encode(RolloutBatch(tuple(group(group_id=bytes([i]) * 16) for i in range(n))))


def n_tokens(n: int) -> bytes:
    return encode(RolloutBatch((group(completions=(CompletionWire((1,) * n, "a", (-1.0,) * n, 0.0),)),)))


def spans_blob(*pairs: tuple[int, int]) -> bytes:
    """(start, version) pairs as the wire packs them, whatever their order."""
    return struct.pack(f"<{2 * len(pairs)}I", *(x for pair in pairs for x in pair))


def nested_empty_arrays(width: int, depth: int) -> bytes:
    data = b"\x90"
    for _ in range(depth):
        data = bytes([0x90 + width]) + data * width
    return data


REJECTS: list[tuple[str, Callable[[], bytes], str]] = [
    ("message bytes", lambda: b"\x90" * 4097, "message_too_large"),
    ("groups max+1", lambda: n_groups(3), "too_many_groups"),
    ("groups far over", lambda: n_groups(10), "too_large"),
    ("completions max+1", lambda: n_completions(3), "too_many_completions"),
    ("no completions", lambda: n_completions(0), "bad_schema"),
    ("tokens max+1", lambda: n_tokens(5), "too_many_tokens"),
    ("tokens far over", lambda: n_tokens(100), "too_large"),
    ("text max+1", lambda: encode(RolloutBatch((group(completions=(CompletionWire((), "a" * 9, (), 0.),)),))),
     "text_too_long"),
    ("token >= vocab", lambda: encode(RolloutBatch((group(completions=(CompletionWire((300,), "", (0.0,), 0.),)),))),
     "token_out_of_vocab"),
    ("positive logprob", lambda: mutated_completion(set_key("logprobs", struct.pack("<ff", -1.0, 0.5))),
     "bad_logprob"),
    ("nan logprob", lambda: mutated_completion(set_key("logprobs", struct.pack("<ff", -1.0, math.nan))),
     "bad_logprob"),
    ("-inf logprob", lambda: mutated_completion(set_key("logprobs", struct.pack("<ff", -math.inf, -1.0))),
     "bad_logprob"),
    ("blob not multiple of 4", lambda: mutated_completion(set_key("tokens", b"\x01\x00\x00")), "bad_blob"),
    ("blob lengths differ", lambda: mutated_completion(set_key("logprobs", struct.pack("<f", -1.0))), "bad_blob"),
    ("tokens as list", lambda: mutated_completion(set_key("tokens", [1, 2])), "bad_schema"),
    ("spans not a multiple of 8", lambda: mutated_completion(set_key("spans", b"\x00" * 12)), "bad_spans"),
    ("spans max+1", lambda: mutated_completion(set_key("spans", spans_blob((0, 0), (1, 1), (1, 2)))), "bad_spans"),
    ("first span not at 0", lambda: mutated_completion(set_key("spans", spans_blob((1, 2)))), "bad_spans"),
    ("span starts repeat", lambda: mutated_completion(set_key("spans", spans_blob((0, 1), (0, 2)))), "bad_spans"),
    ("span start at the token count",  # the group's completion has 2 tokens
     lambda: mutated_completion(set_key("spans", spans_blob((0, 1), (2, 2)))), "bad_spans"),
    ("span versions repeat", lambda: mutated_completion(set_key("spans", spans_blob((0, 2), (1, 2)))), "bad_spans"),
    ("span versions descend", lambda: mutated_completion(set_key("spans", spans_blob((0, 2), (1, 1)))), "bad_spans"),
    ("span newer than the group",  # the group's version is 2
     lambda: mutated_completion(set_key("spans", spans_blob((0, 1), (1, 3)))), "bad_spans"),
    ("spans as list", lambda: mutated_completion(set_key("spans", [[0, 1]])), "bad_schema"),
    ("spans missing", lambda: mutated_completion(lambda c: c.pop("spans")), "bad_schema"),
    ("nan reward", lambda: mutated_completion(set_key("reward", math.nan)), "non_finite"),
    ("inf reward", lambda: mutated_completion(set_key("reward", math.inf)), "non_finite"),
    ("nan created_at", lambda: mutated_group(set_key("created_at", math.nan)), "bad_timestamp"),
    ("negative created_at", lambda: mutated_group(set_key("created_at", -1.0)), "bad_timestamp"),
    ("created_at year 5000+", lambda: mutated_group(set_key("created_at", 1e12)), "bad_timestamp"),
    ("bool as version", lambda: mutated_group(set_key("version", True)), "bad_schema"),
    ("negative version", lambda: mutated_group(set_key("version", -1)), "out_of_range"),
    ("uint64 index", lambda: mutated_group(lambda g: g["task"].__setitem__("index", 2**64 - 1)), "out_of_range"),
    ("config too long", lambda: mutated_group(lambda g: g["task"].__setitem__("config", "x" * 33)), "config_too_long"),
    ("missing key", lambda: mutated_group(lambda g: g.pop("family")), "bad_schema"),
    ("extra key", lambda: mutated_group(set_key("extra", 1)), "bad_schema"),
    ("short group id", lambda: mutated_group(set_key("id", b"\x00" * 15)), "bad_schema"),
    ("policy id with space", lambda: mutated_group(set_key("policy", "Qm 1")), "bad_policy_id"),
    ("policy id empty name", lambda: mutated_group(set_key("policy", "Qm1/")), "bad_policy_id"),
    ("policy id too long", lambda: mutated_group(set_key("policy", "Q" * 25)), "name_too_long"),
    ("duplicate group id", lambda: encode(RolloutBatch((group(), group(policy_version=3)))), "duplicate_group"),
    ("many tiny containers", lambda: nested_empty_arrays(3, 6), "too_large"),
    ("duplicate map key", lambda: b"\x83\xa1v\x01\xa1v\x01\xa4type\xa6status", "duplicate_key"),
    ("trailing bytes", lambda: encode(status()) + b"\x00", "bad_msgpack"),
    ("truncated", lambda: encode(status())[:-3], "bad_msgpack"),
    ("invalid utf-8", lambda: b"\x81\xa1v\xa2\xff\xfe", "bad_msgpack"),
    ("ext type", lambda: pack({"v": SCHEMA_VERSION, "type": "status", "body": msgpack.ExtType(1, b"")}), "bad_schema"),
    ("not a map", lambda: pack([1, "status", {}]), "bad_envelope"),
    ("string version", lambda: pack({"v": "1", "type": "status", "body": {}}), "bad_envelope"),
    ("unknown type", lambda: pack({"v": SCHEMA_VERSION, "type": "chat", "body": {}}), "unknown_type"),
    ("envelope extra key", lambda: pack({"v": SCHEMA_VERSION, "type": "status", "body": raw(status())["body"], "x": 0}),
     "bad_schema"),
    ("unknown role", lambda: encode(status(role="boss")), "bad_schema"),
    ("too many capabilities", lambda: encode(status(capabilities=("a", "b", "c"))), "too_many_capabilities"),
    ("negative throughput", lambda: encode(status(throughput=-1.0)), "out_of_range"),
    ("bad follows", lambda: encode(status(follows="not a policy")), "bad_policy_id"),
    ("base after version", lambda: encode(announce(base_version=8)), "out_of_range"),
    ("size over limit", lambda: encode(announce(size=1001)), "out_of_range"),
    ("zero size", lambda: encode(announce(size=0, chunk_count=1)), "out_of_range"),
    ("more chunks than max", lambda: encode(announce(chunk_count=11)), "out_of_range"),
    ("short sha256", lambda: encode(announce(sha256=b"\x00" * 31)), "bad_schema"),
    ("empty encoding", lambda: encode(announce(encoding="")), "bad_schema"),
]


@pytest.mark.parametrize(("case", "build", "reason"), REJECTS, ids=[case for case, _, _ in REJECTS])
def test_violation_is_rejected_with_its_reason(case: str, build: Callable[[], bytes], reason: str) -> None:
    err = fails(build(), SMALL)
    assert (err.reason, err.verdict) == (reason, Verdict.REJECT), err


@pytest.mark.parametrize(("spans", "detail"), [
    (b"\x00" * 12, "groups[0].completions[0].spans: 12 bytes is not a multiple of 8"),
    (spans_blob((0, 0), (1, 1), (1, 2)), "groups[0].completions[0].spans: 3 spans > 2"),
    (spans_blob((1, 2)), "groups[0].completions[0].spans: the first span starts at token 1, not 0"),
    (spans_blob((0, 1), (0, 2)), "groups[0].completions[0].spans: starts [0, 0] are not strictly ascending"),
    (spans_blob((0, 1), (2, 2)), "groups[0].completions[0].spans: a span starts at token 2 of 2"),
    (spans_blob((0, 2), (1, 1)), "groups[0].completions[0].spans: versions [2, 1] are not strictly ascending"),
    (spans_blob((0, 1), (1, 3)), "groups[0].completions[0].spans: version 3 > the group's version 2"),
])
def test_bad_spans_detail_is_one_line_naming_the_completion(spans: bytes, detail: str) -> None:
    err = fails(mutated_completion(set_key("spans", spans)), SMALL)
    assert (err.reason, err.verdict, err.detail) == ("bad_spans", Verdict.REJECT, detail)


def test_spans_count_is_checked_before_the_text_and_the_vocabulary() -> None:
    # Cheap-first: a blob length is checked before any text length, token scan or span content.
    def too_much(c: dict[str, Any]) -> None:
        c["spans"] = spans_blob((5, 5), (4, 4), (3, 3))
        c["text"] = "x" * 9
        c["tokens"] = struct.pack("<II", 300, 300)
    assert fails(mutated_completion(too_much), SMALL).reason == "bad_spans"


def test_values_at_each_limit_are_accepted() -> None:
    assert len(decode(n_groups(2), SMALL).groups) == 2
    at_limit = CompletionWire((1, 2), "ab", (-1.0, -1.0), 0.0, ((0, 1), (1, 2)))  # 2 spans, newest = the group's
    assert decode(encode(RolloutBatch((group(completions=(at_limit,)),))), SMALL).groups[0].completions == (at_limit,)
    assert len(decode(n_completions(2), SMALL).groups[0].completions) == 2
    assert decode(n_tokens(4), SMALL).groups[0].completions[0].token_ids == (1, 1, 1, 1)
    top = encode(RolloutBatch((group(completions=(CompletionWire((299,), "a" * 8, (0.0,), 0.0),)),)))
    assert decode(top, SMALL).groups[0].completions[0].token_ids == (299,)
    assert decode(encode(announce(size=1000, chunk_count=10, base_version=7)), SMALL).chunk_count == 10


def test_largest_valid_message_fits_the_parse_budget() -> None:
    limits = Limits()
    c = CompletionWire((), "", (), 0.0)
    groups = tuple(group(group_id=i.to_bytes(16, "big"), completions=(c,) * limits.max_completions_per_group)
                   for i in range(limits.max_groups_per_message))
    assert len(decode(encode(RolloutBatch(groups)), limits).groups) == limits.max_groups_per_message
    # One key too many in every map is still a schema error, not a budget overflow.
    obj = raw(RolloutBatch(groups))
    for g in obj["body"]["groups"]:
        g["x"] = 0
        for comp in g["completions"]:
            comp["x"] = 0
    assert fails(pack(obj), limits).reason == "bad_schema"


def test_unknown_version_is_ignored_even_with_an_unknown_body() -> None:
    for data in (pack({"v": 6, "type": "status", "body": raw(status())["body"]}),
                 pack({"v": 6, "kind": "something new", "payload": [1, 2, 3]}),
                 pack({"v": 0})):
        err = fails(data)
        assert (err.reason, err.verdict) == ("unknown_version", Verdict.IGNORE)


def test_a_peer_of_another_schema_version_is_refused_naming_both_versions() -> None:
    """Schema 5 added a completion's version spans (schema 4: the digest batch's shard count and addresses): a
    schema-4 peer's messages are ignored (so are schema 3's, 2's and 1's), the reason one line naming both
    versions."""
    assert SCHEMA_VERSION == 5
    for old_version in (4, 3, 2, 1):
        old = raw(status())
        old["v"] = old_version
        err = fails(pack(old))
        assert (err.reason, err.verdict) == ("unknown_version", Verdict.IGNORE)
        assert err.detail == f"the sender speaks schema version {old_version}, this node speaks 5"
    # A schema-4 rollout batch (its completions have no "spans") is ignored, not rejected as bad_schema.
    v4 = raw(RolloutBatch((group(),)))
    v4["v"] = 4
    del v4["body"]["groups"][0]["completions"][0]["spans"]
    err = fails(pack(v4))
    assert (err.reason, err.verdict, err.detail) == ("unknown_version", Verdict.IGNORE,
                                                     "the sender speaks schema version 4, this node speaks 5")


def test_freshness_window_ignores_stale_and_future() -> None:
    limits = Limits(max_age_s=60.0, max_clock_skew_s=5.0)
    assert decode(encode(status(created_at=NOW - 60.0)), limits, NOW) == status(created_at=NOW - 60.0)
    assert decode(encode(status(created_at=NOW + 5.0)), limits, NOW) == status(created_at=NOW + 5.0)
    for created_at, reason in ((NOW - 60.5, "stale"), (NOW + 5.5, "future")):
        err = fails(encode(status(created_at=created_at)), limits, NOW)
        assert (err.reason, err.verdict) == (reason, Verdict.IGNORE)
    # Every group of a batch is checked, not only the first.
    batch = RolloutBatch((group(created_at=NOW), group(group_id=b"\x01" * 16, created_at=NOW - 61.0)))
    assert fails(encode(batch), limits, NOW).reason == "stale"


def test_malformed_and_stale_is_rejected_not_ignored() -> None:
    data = mutated_completion(set_key("reward", math.nan))  # created_at 1e9 is decades stale
    err = fails(data, Limits(), NOW)
    assert (err.reason, err.verdict) == ("non_finite", Verdict.REJECT)


def test_non_bytes_input_is_a_wire_error() -> None:
    assert fails("text").reason == "bad_msgpack"  # type: ignore[arg-type]
    assert decode(bytearray(encode(status())), Limits()) == status()
    assert decode(memoryview(encode(status())), Limits()) == status()


def test_limits_reject_bad_configuration() -> None:
    with pytest.raises(ValueError):
        Limits(vocab_size=0)
    with pytest.raises(ValueError):
        Limits(max_age_s=math.inf)
    with pytest.raises(ValueError):
        Limits(vocab_size=2**32 + 1)
