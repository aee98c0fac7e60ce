"""msgpack codec for wire messages: `encode(msg) -> bytes`, `decode(data, limits, now) -> msg` (the envelope;
each message type's body is `protocol.bodies`', primitive field checks `protocol.fields`').

Contract:
- encode writes the canonical form: map keys in the documented order, minimal ints, float64 floats, token ids
  as a little-endian uint32 blob, log-probs as a little-endian float32 blob, version spans as a blob of
  little-endian uint32 (start, version) pairs. decode(encode(m)) == m and
  encode(decode(b)) == b for every canonical b (log-probs are rounded to float32 by encode).
- decode validates before it allocates: the byte length first, then msgpack with length bounds derived from the
  limits (no list, string or blob larger than the limits allow is ever built, and parsing stops once more
  containers and entries exist than a valid message holds), then an exact schema check
  (key sets, types, ranges), blob checks (vocabulary, finite non-positive log-probs, ordered version spans) and,
  when `now` is given, freshness. Any failure raises `WireError`; no other exception leaves decode for any input bytes.
- Reject-class failures are all checked before the ignore-class timestamp window, so a message that is both
  malformed and stale is rejected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgpack

from protocol.bodies import (
    ANNOUNCE_KEYS,
    BODY_DECODERS,
    COMPLETION_KEYS,
    CONTROL_KEYS,
    DIGEST_BATCH_KEYS,
    DIGEST_KEYS,
    GROUP_KEYS,
    PULL_KEYS,
    PULLED_GROUP_KEYS,
    PULLED_KEYS,
    REFUSAL_KEYS,
    STATUS_KEYS,
    TASK_KEYS,
    body_obj,
    decode_group,
    group_obj,
)
from protocol.errors import ignore, reject
from protocol.fields import expect_map
from protocol.limits import Limits
from protocol.messages import (
    SCHEMA_VERSION,
    SHA256_BYTES,
    TAG_TYPES,
    TYPE_TAGS,
    Message,
    PulledGroup,
    RolloutBatch,
    RolloutGroup,
    created_at_values,
)

ENVELOPE_KEYS = ("v", "type", "body")
# The largest map in the schema (the announce) has 12 keys; one more still reaches the schema check (reason
# "bad_schema"), anything larger is refused before it is built.
_MAX_MAP_LEN = 12 + 1


# ---------------------------------------------------------------------------------------------------- encode


def _pack(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # wrong field types, lone surrogates, ints > 64 bit
        raise reject("unencodable", str(exc)) from exc


def encode(msg: Message) -> bytes:
    """Canonical bytes of `msg` inside the envelope. Raises WireError("unencodable"/"bad_blob") for values
    that cannot be represented (a sender bug); it does not apply a receiver's Limits."""
    tag = TYPE_TAGS.get(type(msg))
    if tag is None:
        raise reject("unencodable", f"not a wire message: {type(msg).__name__}")
    try:
        body = body_obj(msg)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a token id outside uint32
        raise reject("unencodable", str(exc)) from exc
    return _pack({"v": SCHEMA_VERSION, "type": tag, "body": body})


def replay_keys(msg: Message) -> list[tuple[bytes, float]]:
    """(sha256 of the canonical encoding, created_at) per replay unit: each group of a batch, else the message.

    Hashing the canonical re-encoding rather than the received bytes makes a re-encoded copy (other key order,
    wider ints) count as the same message."""
    if isinstance(msg, RolloutBatch):
        return [(hashlib.sha256(_pack(group_obj(g))).digest(), g.created_at) for g in msg.groups]
    return [(hashlib.sha256(encode(msg)).digest(), msg.created_at)]


def encode_group(group: RolloutGroup) -> bytes:
    """The canonical encoding of one group map (what a pull response carries and a digest's hash covers)."""
    try:
        obj = group_obj(group)
    except (TypeError, ValueError, OverflowError) as exc:
        raise reject("unencodable", str(exc)) from exc
    return _pack(obj)


def group_content_hash(group: RolloutGroup) -> bytes:
    """A digest's content hash: SHA-256 of `encode_group` (the same id replay protection keeps per group)."""
    return encoded_content_hash(encode_group(group))


def encoded_content_hash(encoded: bytes) -> bytes:
    """`group_content_hash` of a group already encoded with `encode_group` (a server holds its groups encoded)."""
    return hashlib.sha256(encoded).digest()


# ---------------------------------------------------------------------------------------------------- decode


class _DuplicateKey(Exception):
    pass


class _TooManyObjects(Exception):
    pass


def _container_hooks(budget: int, max_other_array: int) -> tuple[Callable[[list[Any]], list[Any]],
                                                                 Callable[[list[tuple[Any, Any]]], dict[Any, Any]]]:
    """msgpack hooks that stop parsing once the arrays and maps built so far, plus their entries, exceed
    `budget`: a peer must not make us build hundreds of thousands of tiny objects (CPU and memory amplification)
    before the schema check sees the first. Inner containers complete first, so the count grows as we parse.

    msgpack has one array bound for all arrays, which must admit the longest array of strings (an announce's
    receivers); an array holding anything but strings (groups, completions) longer than `max_other_array` is
    refused here instead, as msgpack would have refused it without the receivers."""
    remaining = [budget]

    def on_list(items: list[Any]) -> list[Any]:
        remaining[0] -= 1 + len(items)
        if remaining[0] < 0:
            raise _TooManyObjects
        if len(items) > max_other_array and any(type(item) is not str for item in items):
            raise _TooManyObjects
        return items

    def on_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        remaining[0] -= 1 + len(pairs)
        if remaining[0] < 0:
            raise _TooManyObjects
        # Reject duplicate keys: implementations disagree on which one wins, so a signed message could mean
        # different things to different peers.
        out = dict(pairs)
        if len(out) != len(pairs):
            raise _DuplicateKey
        return out

    return on_list, on_pairs


def _object_budget(limits: Limits) -> int:
    """Twice the arrays and maps plus their entries of the largest valid message: room for one entry over
    each limit or an extra key everywhere, so that such a message still gets its precise reason."""
    groups, completions = limits.max_groups_per_message + 1, limits.max_completions_per_group + 1
    envelope = 2 * (1 + len(ENVELOPE_KEYS)) + 2  # envelope map, body map and the groups array
    per_group = (1 + len(GROUP_KEYS)) + (1 + len(TASK_KEYS)) + (1 + completions) \
        + completions * (1 + len(COMPLETION_KEYS)) + 1
    status = (1 + len(STATUS_KEYS)) + (1 + limits.max_capabilities + 1)
    announce = (1 + len(ANNOUNCE_KEYS) + 1) + (1 + limits.max_receivers + 1)
    digests = limits.max_digests_per_message + 1
    digest_batch = (1 + len(DIGEST_BATCH_KEYS) + 1) + (1 + digests) + digests * (1 + len(DIGEST_KEYS) + 1) \
        + (1 + limits.max_digest_addrs + 1)
    answers = limits.max_pulls_per_request + 1
    pulled = (1 + len(PULLED_KEYS) + 1) + 2 * (1 + answers) \
        + answers * (2 + len(PULLED_GROUP_KEYS) + len(REFUSAL_KEYS) + 2)
    pull = 1 + len(PULL_KEYS) + 1
    return 2 * (envelope + max(groups * per_group, status, announce, 1 + len(CONTROL_KEYS) + 1, digest_batch,
                               pulled, pull))


def _unpack(data: bytes, limits: Limits) -> Any:
    # Bounds one past each schema limit: a count just over a limit still reaches the schema check and gets its
    # precise reason; anything larger is refused by msgpack before the container is allocated.
    max_chars = max(limits.max_text_chars, limits.max_config_chars, limits.max_name_chars, limits.max_addr_chars)
    max_other_array = max(limits.max_groups_per_message, limits.max_completions_per_group,
                          limits.max_digests_per_message, limits.max_pulls_per_request) + 1
    on_list, on_pairs = _container_hooks(_object_budget(limits), max_other_array)
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, list_hook=on_list, object_pairs_hook=on_pairs,
            max_str_len=4 * (max_chars + 1),
            # token blobs, version spans, or an announce's chunk digests (never more than the message itself)
            max_bin_len=max(4 * (limits.max_tokens_per_completion + 1), 8 * (limits.max_spans_per_completion + 1), 64,
                            min(SHA256_BYTES * (limits.max_chunks + 1), limits.max_message_bytes)),
            max_array_len=max(limits.max_groups_per_message, limits.max_completions_per_group,
                              limits.max_capabilities, limits.max_receivers, limits.max_digests_per_message,
                              limits.max_pulls_per_request, limits.max_digest_addrs) + 1,
            max_map_len=_MAX_MAP_LEN, max_ext_len=0)
    except _DuplicateKey as exc:
        raise reject("duplicate_key", "a map repeats a key") from exc
    except _TooManyObjects as exc:
        raise reject("too_large", "more arrays, maps and entries than any valid message holds") from exc
    except msgpack.ExtraData as exc:
        raise reject("bad_msgpack", "trailing bytes after the message") from exc
    # msgpack signals truncation, bad format bytes, invalid UTF-8, nesting too deep and oversized containers
    # with ValueError subclasses; TypeError/OverflowError are listed as a guard for its hook paths.
    except (ValueError, TypeError, OverflowError) as exc:
        reason = "too_large" if "exceeds max_" in str(exc) else "bad_msgpack"
        raise reject(reason, f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def check_fresh(msg: Message, limits: Limits, now: float) -> None:
    """IGNORE-class time window: every created_at within [now - max_age_s, now + max_clock_skew_s]."""
    for created_at in created_at_values(msg):
        if created_at < now - limits.max_age_s:
            raise ignore("stale", f"created {now - created_at:.1f} s ago > {limits.max_age_s} s")
        if created_at > now + limits.max_clock_skew_s:
            raise ignore("future", f"created {created_at - now:.1f} s ahead > {limits.max_clock_skew_s} s")


def decode(data: bytes, limits: Limits, now: float | None = None) -> Message:
    """Decode and validate one message. `now` (unix seconds) enables the freshness window; leave it None only
    for stored messages and tests. Raises WireError and nothing else."""
    if type(data) is not bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise reject("bad_msgpack", f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
    if len(data) > limits.max_message_bytes:
        raise reject("message_too_large", f"{len(data)} bytes > {limits.max_message_bytes}")
    obj = _unpack(data, limits)
    # The version is read before the rest of the envelope so that a newer peer's layout is ignored, not
    # rejected: a slow-to-upgrade node must not penalise honest forwarders of a newer schema.
    if type(obj) is not dict or type(obj.get("v")) is not int:
        raise reject("bad_envelope", "expected a map with an integer 'v'")
    if obj["v"] != SCHEMA_VERSION:
        raise ignore("unknown_version", f"the sender speaks schema version {obj['v']}, this node speaks "
                                        f"{SCHEMA_VERSION}")
    envelope = expect_map(obj, ENVELOPE_KEYS, "envelope")
    tag = envelope["type"]
    cls = TAG_TYPES.get(tag) if type(tag) is str else None
    if cls is None:
        raise reject("unknown_type", f"type tag {tag[:40]!r}" if type(tag) is str else type(tag).__name__)
    msg = BODY_DECODERS[cls](envelope["body"], limits)
    if now is not None:
        check_fresh(msg, limits, now)
    return msg


def decode_pulled(pulled: PulledGroup, content_hash: bytes, limits: Limits, now: float | None = None
                  ) -> RolloutGroup:
    """A pulled group, checked against its digest's `content_hash` BEFORE any byte of it is parsed: REJECT
    "hash_mismatch" (the server lied or the bytes were corrupted; nothing was decoded), then the same bounded
    parse and schema check as a group in a batch, "group_id_mismatch" when the group is not the one asked for,
    and (with `now`) the freshness window. Raises WireError and nothing else."""
    data = pulled.data
    if len(data) > limits.max_message_bytes:
        raise reject("message_too_large", f"{len(data)} bytes > {limits.max_message_bytes}")
    if encoded_content_hash(data) != content_hash:
        raise reject("hash_mismatch", f"group {pulled.group_id.hex()}: content differs from its digest")
    group = decode_group(_unpack(data, limits), limits)
    if group.group_id != pulled.group_id:
        raise reject("group_id_mismatch", f"asked for {pulled.group_id.hex()}, got {group.group_id.hex()}")
    if now is not None:
        check_fresh(RolloutBatch((group,)), limits, now)
    return group
