"""msgpack codec for wire messages: `encode(msg) -> bytes`, `decode(data, limits, now) -> msg`.

Contract:
- encode writes the canonical form: map keys in the documented order, minimal ints, float64 floats, token ids
  as a little-endian uint32 blob, log-probs as a little-endian float32 blob. decode(encode(m)) == m and
  encode(decode(b)) == b for every canonical b (log-probs are rounded to float32 by encode).
- decode validates before it allocates: the byte length first, then msgpack with length bounds derived from the
  limits (no list, string or blob larger than the limits allow is ever built, and parsing stops once more
  containers and entries exist than a valid message holds), then an exact schema check
  (key sets, types, ranges), blob checks (vocabulary, finite non-positive log-probs) and, when `now` is given,
  freshness. Any failure raises `WireError`; no other exception leaves decode for any input bytes.
- Reject-class failures are all checked before the ignore-class timestamp window, so a message that is both
  malformed and stale is rejected.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from protocol.errors import ignore, reject
from protocol.limits import MAX_INT, MAX_TIMESTAMP, Limits
from protocol.messages import (
    GROUP_ID_BYTES,
    ROLES,
    SCHEMA_VERSION,
    SHA256_BYTES,
    TAG_TYPES,
    TYPE_TAGS,
    WORKER_ACTIONS,
    CompletionWire,
    Message,
    PolicyAnnounce,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
    WorkerControl,
    created_at_values,
    policy_owner,
)

_TOKEN_DTYPE = np.dtype("<u4")
_LOGPROB_DTYPE = np.dtype("<f4")
_POLICY_ID = re.compile(r"[A-Za-z0-9]+(/[A-Za-z0-9._-]+)?", re.ASCII)
_PEER_ID = re.compile(r"[A-Za-z0-9]+", re.ASCII)

ENVELOPE_KEYS = ("v", "type", "body")
GROUP_KEYS = ("id", "policy", "version", "task", "completions", "tokenizer", "family", "created_at")
TASK_KEYS = ("dataset", "config", "seed", "index")
COMPLETION_KEYS = ("tokens", "text", "logprobs", "reward")
ANNOUNCE_KEYS = ("owner", "version", "base_version", "size", "sha256", "chunks", "encoding", "created_at",
                 "chunk_sha256", "state", "schedule", "receivers")
STATUS_KEYS = ("role", "capabilities", "throughput", "policy_version", "follows", "created_at")
CONTROL_KEYS = ("target", "action", "created_at")
# The largest map in the schema (the announce) has 12 keys; one more still reaches the schema check (reason
# "bad_schema"), anything larger is refused before it is built.
_MAX_MAP_LEN = 12 + 1


# ---------------------------------------------------------------------------------------------------- encode


def _task_obj(t: TaskRefWire) -> dict[str, Any]:
    return {"dataset": t.dataset, "config": t.config, "seed": t.seed, "index": t.index}


def _completion_obj(c: CompletionWire) -> dict[str, Any]:
    if len(c.token_ids) != len(c.logprobs):
        raise reject("bad_blob", f"{len(c.token_ids)} token ids but {len(c.logprobs)} log-probs")
    return {"tokens": np.asarray(c.token_ids, dtype=_TOKEN_DTYPE).tobytes(), "text": c.text,
            "logprobs": np.asarray(c.logprobs, dtype=_LOGPROB_DTYPE).tobytes(), "reward": float(c.claimed_reward)}


def _group_obj(g: RolloutGroup) -> dict[str, Any]:
    return {"id": bytes(g.group_id), "policy": g.policy_id, "version": g.policy_version, "task": _task_obj(g.task),
            "completions": [_completion_obj(c) for c in g.completions], "tokenizer": g.tokenizer_hash,
            "family": g.model_family, "created_at": float(g.created_at)}


def _announce_obj(a: PolicyAnnounce) -> dict[str, Any]:
    # Chunk digests travel as one blob: one bin instead of an array of chunk_count objects to parse.
    if any(len(d) != SHA256_BYTES for d in a.chunk_sha256):
        raise reject("unencodable", f"chunk_sha256: every digest must be {SHA256_BYTES} bytes")
    return {"owner": a.owner, "version": a.version, "base_version": a.base_version, "size": a.size,
            "sha256": bytes(a.sha256), "chunks": a.chunk_count, "encoding": a.encoding,
            "created_at": float(a.created_at), "chunk_sha256": b"".join(bytes(d) for d in a.chunk_sha256),
            "state": a.state_sha256, "schedule": a.schedule, "receivers": list(a.receivers)}


def _status_obj(s: Status) -> dict[str, Any]:
    return {"role": s.role, "capabilities": list(s.capabilities), "throughput": float(s.throughput),
            "policy_version": s.policy_version, "follows": s.follows, "created_at": float(s.created_at)}


def _control_obj(c: WorkerControl) -> dict[str, Any]:
    return {"target": c.target, "action": c.action, "created_at": float(c.created_at)}


def _rollouts_obj(b: RolloutBatch) -> dict[str, Any]:
    return {"groups": [_group_obj(g) for g in b.groups]}


_BODY_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    RolloutBatch: _rollouts_obj, PolicyAnnounce: _announce_obj, Status: _status_obj, WorkerControl: _control_obj,
}


def _body_obj(msg: Message) -> dict[str, Any]:
    return _BODY_ENCODERS[type(msg)](msg)


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
        body = _body_obj(msg)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a token id outside uint32
        raise reject("unencodable", str(exc)) from exc
    return _pack({"v": SCHEMA_VERSION, "type": tag, "body": body})


def replay_keys(msg: Message) -> list[tuple[bytes, float]]:
    """(sha256 of the canonical encoding, created_at) per replay unit: each group of a batch, else the message.

    Hashing the canonical re-encoding rather than the received bytes makes a re-encoded copy (other key order,
    wider ints) count as the same message."""
    if isinstance(msg, RolloutBatch):
        return [(hashlib.sha256(_pack(_group_obj(g))).digest(), g.created_at) for g in msg.groups]
    return [(hashlib.sha256(encode(msg)).digest(), msg.created_at)]


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


def _fields(obj: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if type(obj) is not dict:
        raise reject("bad_schema", f"{where}: expected a map, got {type(obj).__name__}")
    if obj.keys() != set(keys):
        raise reject("bad_schema", f"{where}: keys {sorted(map(repr, obj))} != {sorted(keys)}")
    return obj


def _int(value: Any, where: str, low: int = 0, high: int = MAX_INT) -> int:
    if type(value) is not int:  # bool is an int subclass; a msgpack true is not a number here
        raise reject("bad_schema", f"{where}: expected an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise reject("out_of_range", f"{where}: {value} not in [{low}, {high}]")
    return value


def _float(value: Any, where: str) -> float:
    # ints are accepted for interop (some msgpack encoders write 1.0 as 1); encode always writes float64.
    if type(value) is not float and type(value) is not int:
        raise reject("bad_schema", f"{where}: expected a float, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise reject("non_finite", f"{where}: {out}")
    return out


def _str(value: Any, where: str, max_chars: int, reason: str = "name_too_long") -> str:
    if type(value) is not str:
        raise reject("bad_schema", f"{where}: expected a string, got {type(value).__name__}")
    if len(value) > max_chars:
        raise reject(reason, f"{where}: {len(value)} chars > {max_chars}")
    return value


def _bin(value: Any, where: str) -> bytes:
    if type(value) is not bytes:
        raise reject("bad_schema", f"{where}: expected bytes, got {type(value).__name__}")
    return value


def _list(value: Any, where: str, max_len: int, reason: str, min_len: int = 1) -> list[Any]:
    if type(value) is not list:
        raise reject("bad_schema", f"{where}: expected an array, got {type(value).__name__}")
    if len(value) > max_len:
        raise reject(reason, f"{where}: {len(value)} > {max_len}")
    if len(value) < min_len:
        raise reject("bad_schema", f"{where}: fewer than {min_len} entries")
    return value


def _peer_id(value: Any, where: str, limits: Limits) -> str:
    text = _str(value, where, limits.max_name_chars)
    if not _PEER_ID.fullmatch(text):
        raise reject("bad_peer_id", f"{where}: {text[:80]!r} is not a peer id")
    return text


def _policy_id(value: Any, where: str, limits: Limits) -> str:
    text = _str(value, where, limits.max_name_chars)
    if not _POLICY_ID.fullmatch(text):
        raise reject("bad_policy_id", f"{where}: {text[:80]!r} is not '<peer id>' or '<peer id>/<name>'")
    return text


def _timestamp(value: Any, where: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise reject("bad_schema", f"{where}: expected a float, got {type(value).__name__}")
    out = float(value)
    if not 0.0 <= out <= MAX_TIMESTAMP:  # also false for NaN
        raise reject("bad_timestamp", f"{where}: {out}")
    return out


def _task(obj: Any, where: str, limits: Limits) -> TaskRefWire:
    f = _fields(obj, TASK_KEYS, where)
    return TaskRefWire(dataset=_str(f["dataset"], f"{where}.dataset", limits.max_name_chars),
                       config=_str(f["config"], f"{where}.config", limits.max_config_chars, "config_too_long"),
                       seed=_int(f["seed"], f"{where}.seed"), index=_int(f["index"], f"{where}.index"))


def _completion(obj: Any, where: str, limits: Limits) -> CompletionWire:
    f = _fields(obj, COMPLETION_KEYS, where)
    tokens, logprobs = _bin(f["tokens"], f"{where}.tokens"), _bin(f["logprobs"], f"{where}.logprobs")
    if len(tokens) % 4:
        raise reject("bad_blob", f"{where}.tokens: {len(tokens)} bytes is not a multiple of 4")
    if len(tokens) // 4 > limits.max_tokens_per_completion:
        raise reject("too_many_tokens", f"{where}: {len(tokens) // 4} > {limits.max_tokens_per_completion}")
    if len(logprobs) != len(tokens):
        raise reject("bad_blob", f"{where}: {len(tokens)} token bytes but {len(logprobs)} log-prob bytes")
    text = _str(f["text"], f"{where}.text", limits.max_text_chars, reason="text_too_long")
    reward = _float(f["reward"], f"{where}.reward")
    ids = np.frombuffer(tokens, dtype=_TOKEN_DTYPE)
    if ids.size and int(ids.max()) >= limits.vocab_size:
        raise reject("token_out_of_vocab", f"{where}: token id {int(ids.max())} >= vocab {limits.vocab_size}")
    lps = np.frombuffer(logprobs, dtype=_LOGPROB_DTYPE)
    # A log-probability is finite and <= 0; NaN fails the comparison as well.
    if lps.size and not (np.isfinite(lps).all() and (lps <= 0).all()):
        raise reject("bad_logprob", f"{where}: log-probs must be finite and <= 0")
    return CompletionWire(token_ids=tuple(ids.tolist()), text=text, logprobs=tuple(lps.tolist()),
                          claimed_reward=reward)


def _group(obj: Any, where: str, limits: Limits) -> RolloutGroup:
    f = _fields(obj, GROUP_KEYS, where)
    group_id = _bin(f["id"], f"{where}.id")
    if len(group_id) != GROUP_ID_BYTES:
        raise reject("bad_schema", f"{where}.id: {len(group_id)} bytes, expected {GROUP_ID_BYTES}")
    completions = _list(f["completions"], f"{where}.completions", limits.max_completions_per_group,
                        "too_many_completions")
    return RolloutGroup(
        group_id=group_id, policy_id=_policy_id(f["policy"], f"{where}.policy", limits),
        policy_version=_int(f["version"], f"{where}.version"), task=_task(f["task"], f"{where}.task", limits),
        completions=tuple(_completion(c, f"{where}.completions[{i}]", limits) for i, c in enumerate(completions)),
        tokenizer_hash=_str(f["tokenizer"], f"{where}.tokenizer", limits.max_name_chars),
        model_family=_str(f["family"], f"{where}.family", limits.max_name_chars),
        created_at=_timestamp(f["created_at"], f"{where}.created_at"))


def _rollouts(obj: Any, limits: Limits) -> RolloutBatch:
    f = _fields(obj, ("groups",), "body")
    groups = _list(f["groups"], "body.groups", limits.max_groups_per_message, "too_many_groups")
    decoded = tuple(_group(g, f"groups[{i}]", limits) for i, g in enumerate(groups))
    if len({g.group_id for g in decoded}) != len(decoded):
        raise reject("duplicate_group", "two groups in one message share a group id")
    return RolloutBatch(groups=decoded)


def _announce(obj: Any, limits: Limits) -> PolicyAnnounce:
    f = _fields(obj, ANNOUNCE_KEYS, "body")
    version = _int(f["version"], "version")
    size = _int(f["size"], "size", 1, limits.max_policy_bytes)
    digest = _bin(f["sha256"], "sha256")
    if len(digest) != SHA256_BYTES:
        raise reject("bad_schema", f"sha256: {len(digest)} bytes, expected {SHA256_BYTES}")
    encoding = _str(f["encoding"], "encoding", limits.max_name_chars)
    if not encoding:
        raise reject("bad_schema", "encoding: empty")
    owner = _policy_id(f["owner"], "owner", limits)
    chunks = _int(f["chunks"], "chunks", 1, min(limits.max_chunks, size))
    blob = _bin(f["chunk_sha256"], "chunk_sha256")
    if len(blob) not in (0, SHA256_BYTES * chunks):
        raise reject("bad_schema", f"chunk_sha256: {len(blob)} bytes, expected 0 or {SHA256_BYTES} x {chunks}")
    # The largest chunk of the even split; a relay buffers whole chunks, so it is bounded when chunks are listed.
    if blob and -(-size // chunks) > limits.max_chunk_bytes:
        raise reject("out_of_range", f"chunk of {-(-size // chunks)} bytes > {limits.max_chunk_bytes}")
    state = _str(f["state"], "state", limits.max_name_chars)
    schedule = _str(f["schedule"], "schedule", limits.max_name_chars)
    raw_receivers = _list(f["receivers"], "receivers", limits.max_receivers, "too_many_receivers", min_len=0)
    receivers = tuple(_peer_id(r, f"receivers[{i}]", limits) for i, r in enumerate(raw_receivers))
    if len(set(receivers)) != len(receivers):
        raise reject("duplicate_receiver", "a peer id appears twice in receivers")
    if policy_owner(owner) in receivers:
        raise reject("bad_schema", "receivers: the owner is the source, not a receiver")
    # A relay plan needs a schedule and per-chunk digests (relays verify each chunk before forwarding it).
    if receivers and not (schedule and blob):
        raise reject("bad_schema", "receivers need a schedule and chunk_sha256")
    return PolicyAnnounce(owner=owner, version=version,
                          base_version=_int(f["base_version"], "base_version", 0, version), size=size,
                          sha256=digest, chunk_count=chunks, encoding=encoding,
                          created_at=_timestamp(f["created_at"], "created_at"),
                          chunk_sha256=tuple(blob[i:i + SHA256_BYTES] for i in range(0, len(blob), SHA256_BYTES)),
                          state_sha256=state, schedule=schedule, receivers=receivers)


def _status(obj: Any, limits: Limits) -> Status:
    f = _fields(obj, STATUS_KEYS, "body")
    role = _str(f["role"], "role", limits.max_name_chars)
    if role not in ROLES:
        raise reject("bad_schema", f"role: {role[:40]!r} not in {ROLES}")
    caps = _list(f["capabilities"], "capabilities", limits.max_capabilities, "too_many_capabilities", min_len=0)
    throughput = _float(f["throughput"], "throughput")
    if throughput < 0:
        raise reject("out_of_range", f"throughput: {throughput} < 0")
    follows = f["follows"]
    follows = _policy_id(follows, "follows", limits) if follows != "" else ""
    return Status(role=role,
                  capabilities=tuple(_str(c, f"capabilities[{i}]", limits.max_name_chars) for i, c in enumerate(caps)),
                  throughput=throughput, policy_version=_int(f["policy_version"], "policy_version"),
                  follows=follows, created_at=_timestamp(f["created_at"], "created_at"))


def _control(obj: Any, limits: Limits) -> WorkerControl:
    f = _fields(obj, CONTROL_KEYS, "body")
    action = _str(f["action"], "action", limits.max_name_chars)
    if action not in WORKER_ACTIONS:
        raise reject("bad_schema", f"action: {action[:40]!r} not in {WORKER_ACTIONS}")
    return WorkerControl(target=_peer_id(f["target"], "target", limits), action=action,
                         created_at=_timestamp(f["created_at"], "created_at"))


_BODY_DECODERS: dict[type, Callable[[Any, Limits], Message]] = {
    RolloutBatch: _rollouts, PolicyAnnounce: _announce, Status: _status, WorkerControl: _control,
}


def _object_budget(limits: Limits) -> int:
    """Twice the arrays and maps plus their entries of the largest valid message: room for one entry over
    each limit or an extra key everywhere, so that such a message still gets its precise reason."""
    groups, completions = limits.max_groups_per_message + 1, limits.max_completions_per_group + 1
    envelope = 2 * (1 + len(ENVELOPE_KEYS)) + 2  # envelope map, body map and the groups array
    per_group = (1 + len(GROUP_KEYS)) + (1 + len(TASK_KEYS)) + (1 + completions) \
        + completions * (1 + len(COMPLETION_KEYS)) + 1
    status = (1 + len(STATUS_KEYS)) + (1 + limits.max_capabilities + 1)
    announce = (1 + len(ANNOUNCE_KEYS) + 1) + (1 + limits.max_receivers + 1)
    return 2 * (envelope + max(groups * per_group, status, announce, 1 + len(CONTROL_KEYS) + 1))


def _unpack(data: bytes, limits: Limits) -> Any:
    # Bounds one past each schema limit: a count just over a limit still reaches the schema check and gets its
    # precise reason; anything larger is refused by msgpack before the container is allocated.
    max_chars = max(limits.max_text_chars, limits.max_config_chars, limits.max_name_chars)
    max_other_array = max(limits.max_groups_per_message, limits.max_completions_per_group) + 1
    on_list, on_pairs = _container_hooks(_object_budget(limits), max_other_array)
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, list_hook=on_list, object_pairs_hook=on_pairs,
            max_str_len=4 * (max_chars + 1),
            # token blobs, or an announce's chunk digests (never more than the message itself)
            max_bin_len=max(4 * (limits.max_tokens_per_completion + 1), 64,
                            min(SHA256_BYTES * (limits.max_chunks + 1), limits.max_message_bytes)),
            max_array_len=max(limits.max_groups_per_message, limits.max_completions_per_group,
                              limits.max_capabilities, limits.max_receivers) + 1,
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
        raise ignore("unknown_version", f"schema version {obj['v']}, this node speaks {SCHEMA_VERSION}")
    envelope = _fields(obj, ENVELOPE_KEYS, "envelope")
    tag = envelope["type"]
    cls = TAG_TYPES.get(tag) if type(tag) is str else None
    if cls is None:
        raise reject("unknown_type", f"type tag {tag[:40]!r}" if type(tag) is str else type(tag).__name__)
    msg = _BODY_DECODERS[cls](envelope["body"], limits)
    if now is not None:
        check_fresh(msg, limits, now)
    return msg
