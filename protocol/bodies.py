"""Per-message bodies of the wire envelope: the canonical map of each message type, and its exact schema check.

Contract: `body_obj(msg)` is the canonical body map of a message (keys in the documented order, token ids and
log-probs as little-endian uint32 / float32 blobs, a completion's version spans as (start, version) uint32 pairs,
chunk digests as one blob); it raises WireError("bad_blob" / "unencodable") for what cannot be represented and lets
TypeError/ValueError/OverflowError through for the codec to turn into "unencodable". `BODY_DECODERS[cls](body,
limits)` checks a decoded body map against the schema (key sets, types, ranges, vocabulary, finite non-positive
log-probs, well-ordered version spans, duplicates) and builds the message, raising WireError and nothing else. The
envelope, msgpack bounds and freshness are `protocol.codec`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from protocol.addrs import parse_dial_addr
from protocol.errors import reject
from protocol.fields import (
    expect_bin,
    expect_float,
    expect_int,
    expect_list,
    expect_map,
    expect_peer_id,
    expect_policy_id,
    expect_str,
    expect_timestamp,
)
from protocol.limits import Limits
from protocol.messages import (
    GROUP_ID_BYTES,
    MAX_SHARD,
    PULL_REFUSALS,
    ROLES,
    SHA256_BYTES,
    WORKER_ACTIONS,
    CompletionWire,
    DigestBatch,
    DigestWire,
    Message,
    PolicyAnnounce,
    PulledGroup,
    PullRefusal,
    PullRequest,
    PullResponse,
    RolloutBatch,
    RolloutGroup,
    Status,
    TaskRefWire,
    WorkerControl,
    policy_owner,
)
from protocol.spans import check_spans_size, decode_spans, spans_blob

_TOKEN_DTYPE = np.dtype("<u4")
_LOGPROB_DTYPE = np.dtype("<f4")

GROUP_KEYS = ("id", "policy", "version", "task", "completions", "tokenizer", "family", "format", "created_at")
TASK_KEYS = ("dataset", "config", "seed", "index")
COMPLETION_KEYS = ("tokens", "text", "logprobs", "reward", "spans")
ANNOUNCE_KEYS = ("owner", "version", "base_version", "size", "sha256", "chunks", "encoding", "created_at",
                 "chunk_sha256", "state", "schedule", "receivers")
STATUS_KEYS = ("role", "capabilities", "throughput", "policy_version", "follows", "created_at")
CONTROL_KEYS = ("target", "action", "created_at")
DIGEST_BATCH_KEYS = ("shard", "shards", "round", "digests", "addrs", "created_at")
DIGEST_KEYS = ("id", "task", "variance", "signal", "hash")
PULL_KEYS = ("round", "ids", "created_at")
PULLED_KEYS = ("groups", "refused", "created_at")
PULLED_GROUP_KEYS = ("id", "group")
REFUSAL_KEYS = ("id", "reason")


# ---------------------------------------------------------------------------------------------------- encode

def _task_obj(t: TaskRefWire) -> dict[str, Any]:
    return {"dataset": t.dataset, "config": t.config, "seed": t.seed, "index": t.index}


def _completion_obj(c: CompletionWire) -> dict[str, Any]:
    if len(c.token_ids) != len(c.logprobs):
        raise reject("bad_blob", f"{len(c.token_ids)} token ids but {len(c.logprobs)} log-probs")
    return {"tokens": np.asarray(c.token_ids, dtype=_TOKEN_DTYPE).tobytes(), "text": c.text,
            "logprobs": np.asarray(c.logprobs, dtype=_LOGPROB_DTYPE).tobytes(), "reward": float(c.claimed_reward),
            "spans": spans_blob(c.spans)}


def group_obj(g: RolloutGroup) -> dict[str, Any]:
    return {"id": bytes(g.group_id), "policy": g.policy_id, "version": g.policy_version, "task": _task_obj(g.task),
            "completions": [_completion_obj(c) for c in g.completions], "tokenizer": g.tokenizer_hash,
            "family": g.model_family, "format": g.prompt_format, "created_at": float(g.created_at)}


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
    return {"groups": [group_obj(g) for g in b.groups]}


def _digest_obj(d: DigestWire) -> dict[str, Any]:
    if type(d.signal) is not bool:
        raise reject("unencodable", f"digest signal must be a bool, got {type(d.signal).__name__}")
    return {"id": bytes(d.group_id), "task": d.task, "variance": float(d.reward_variance), "signal": d.signal,
            "hash": bytes(d.content_hash)}


def _digests_obj(b: DigestBatch) -> dict[str, Any]:
    return {"shard": b.shard, "shards": b.shards, "round": b.round, "digests": [_digest_obj(d) for d in b.digests],
            "addrs": list(b.addrs), "created_at": float(b.created_at)}


def _pull_obj(r: PullRequest) -> dict[str, Any]:
    # Group ids travel as one blob of 16-byte ids: one bin instead of an array of objects to parse.
    if any(len(i) != GROUP_ID_BYTES for i in r.group_ids):
        raise reject("unencodable", f"ids: every group id must be {GROUP_ID_BYTES} bytes")
    return {"round": r.round, "ids": b"".join(bytes(i) for i in r.group_ids), "created_at": float(r.created_at)}


def _pulled_obj(r: PullResponse) -> dict[str, Any]:
    return {"groups": [{"id": bytes(g.group_id), "group": bytes(g.data)} for g in r.groups],
            "refused": [{"id": bytes(x.group_id), "reason": x.reason} for x in r.refused],
            "created_at": float(r.created_at)}


_BODY_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    RolloutBatch: _rollouts_obj, PolicyAnnounce: _announce_obj, Status: _status_obj, WorkerControl: _control_obj,
    DigestBatch: _digests_obj, PullRequest: _pull_obj, PullResponse: _pulled_obj,
}


def body_obj(msg: Message) -> dict[str, Any]:
    return _BODY_ENCODERS[type(msg)](msg)


# ---------------------------------------------------------------------------------------------------- decode


def _task(obj: Any, where: str, limits: Limits) -> TaskRefWire:
    f = expect_map(obj, TASK_KEYS, where)
    return TaskRefWire(dataset=expect_str(f["dataset"], f"{where}.dataset", limits.max_name_chars),
                       config=expect_str(f["config"], f"{where}.config", limits.max_config_chars, "config_too_long"),
                       seed=expect_int(f["seed"], f"{where}.seed"), index=expect_int(f["index"], f"{where}.index"))


def _completion(obj: Any, where: str, limits: Limits, vocab: int) -> CompletionWire:
    f = expect_map(obj, COMPLETION_KEYS, where)
    tokens, logprobs = expect_bin(f["tokens"], f"{where}.tokens"), expect_bin(f["logprobs"], f"{where}.logprobs")
    if len(tokens) % 4:
        raise reject("bad_blob", f"{where}.tokens: {len(tokens)} bytes is not a multiple of 4")
    if len(tokens) // 4 > limits.max_tokens_per_completion:
        raise reject("too_many_tokens", f"{where}: {len(tokens) // 4} > {limits.max_tokens_per_completion}")
    if len(logprobs) != len(tokens):
        raise reject("bad_blob", f"{where}: {len(tokens)} token bytes but {len(logprobs)} log-prob bytes")
    spans_blob = check_spans_size(expect_bin(f["spans"], f"{where}.spans"), limits.max_spans_per_completion, where)
    text = expect_str(f["text"], f"{where}.text", limits.max_text_chars, reason="text_too_long")
    reward = expect_float(f["reward"], f"{where}.reward")
    spans = decode_spans(spans_blob, len(tokens) // 4, where)  # at most max_spans pairs: cheaper than the vocab scan
    ids = np.frombuffer(tokens, dtype=_TOKEN_DTYPE)
    if ids.size and int(ids.max()) >= vocab:
        raise reject("token_out_of_vocab", f"{where}: token id {int(ids.max())} >= vocab {vocab}")
    lps = np.frombuffer(logprobs, dtype=_LOGPROB_DTYPE)
    # A log-probability is finite and <= 0; NaN fails the comparison as well.
    if lps.size and not (np.isfinite(lps).all() and (lps <= 0).all()):
        raise reject("bad_logprob", f"{where}: log-probs must be finite and <= 0")
    return CompletionWire(token_ids=tuple(ids.tolist()), text=text, logprobs=tuple(lps.tolist()),
                          claimed_reward=reward, spans=spans)


def _group(obj: Any, where: str, limits: Limits) -> RolloutGroup:
    f = expect_map(obj, GROUP_KEYS, where)
    group_id = expect_bin(f["id"], f"{where}.id")
    if len(group_id) != GROUP_ID_BYTES:
        raise reject("bad_schema", f"{where}.id: {len(group_id)} bytes, expected {GROUP_ID_BYTES}")
    completions = expect_list(f["completions"], f"{where}.completions", limits.max_completions_per_group,
                        "too_many_completions")
    tokenizer = expect_str(f["tokenizer"], f"{where}.tokenizer", limits.max_name_chars)
    ours = not limits.tokenizer_hash or tokenizer == limits.tokenizer_hash
    vocab = limits.vocab_size if ours else limits.max_foreign_vocab  # another tokenizer's ids: re-tokenised, not used
    policy_id = expect_policy_id(f["policy"], f"{where}.policy", limits)
    version = expect_int(f["version"], f"{where}.version")
    task = _task(f["task"], f"{where}.task", limits)
    decoded = tuple(_completion(c, f"{where}.completions[{i}]", limits, vocab) for i, c in enumerate(completions))
    for i, c in enumerate(decoded):
        # The group's version is the newest policy that sampled any of its tokens: a newer span is a lie about
        # which policy a receiver's staleness bound should read.
        if c.spans and c.spans[-1][1] > version:  # versions ascend: the last span is the newest
            raise reject("bad_spans", f"{where}.completions[{i}].spans: version {c.spans[-1][1]} > the group's "
                                      f"version {version}")
    return RolloutGroup(
        group_id=group_id, policy_id=policy_id, policy_version=version, task=task, completions=decoded,
        tokenizer_hash=tokenizer,
        model_family=expect_str(f["family"], f"{where}.family", limits.max_name_chars),
        created_at=expect_timestamp(f["created_at"], f"{where}.created_at"),
        prompt_format=expect_str(f["format"], f"{where}.format", limits.max_name_chars))


def decode_group(obj: Any, limits: Limits) -> RolloutGroup:
    """One group map outside a batch (a pulled group's decoded bytes)."""
    return _group(obj, "group", limits)


def _rollouts(obj: Any, limits: Limits) -> RolloutBatch:
    f = expect_map(obj, ("groups",), "body")
    groups = expect_list(f["groups"], "body.groups", limits.max_groups_per_message, "too_many_groups")
    decoded = tuple(_group(g, f"groups[{i}]", limits) for i, g in enumerate(groups))
    if len({g.group_id for g in decoded}) != len(decoded):
        raise reject("duplicate_group", "two groups in one message share a group id")
    return RolloutBatch(groups=decoded)


def _announce(obj: Any, limits: Limits) -> PolicyAnnounce:
    f = expect_map(obj, ANNOUNCE_KEYS, "body")
    version = expect_int(f["version"], "version")
    size = expect_int(f["size"], "size", 1, limits.max_policy_bytes)
    digest = expect_bin(f["sha256"], "sha256")
    if len(digest) != SHA256_BYTES:
        raise reject("bad_schema", f"sha256: {len(digest)} bytes, expected {SHA256_BYTES}")
    encoding = expect_str(f["encoding"], "encoding", limits.max_name_chars)
    if not encoding:
        raise reject("bad_schema", "encoding: empty")
    owner = expect_policy_id(f["owner"], "owner", limits)
    chunks = expect_int(f["chunks"], "chunks", 1, min(limits.max_chunks, size))
    blob = expect_bin(f["chunk_sha256"], "chunk_sha256")
    if len(blob) not in (0, SHA256_BYTES * chunks):
        raise reject("bad_schema", f"chunk_sha256: {len(blob)} bytes, expected 0 or {SHA256_BYTES} x {chunks}")
    # The largest chunk of the even split; a relay buffers whole chunks, so it is bounded when chunks are listed.
    if blob and -(-size // chunks) > limits.max_chunk_bytes:
        raise reject("out_of_range", f"chunk of {-(-size // chunks)} bytes > {limits.max_chunk_bytes}")
    state = expect_str(f["state"], "state", limits.max_name_chars)
    schedule = expect_str(f["schedule"], "schedule", limits.max_name_chars)
    raw_receivers = expect_list(f["receivers"], "receivers", limits.max_receivers, "too_many_receivers", min_len=0)
    receivers = tuple(expect_peer_id(r, f"receivers[{i}]", limits) for i, r in enumerate(raw_receivers))
    if len(set(receivers)) != len(receivers):
        raise reject("duplicate_receiver", "a peer id appears twice in receivers")
    if policy_owner(owner) in receivers:
        raise reject("bad_schema", "receivers: the owner is the source, not a receiver")
    # A relay plan needs a schedule and per-chunk digests (relays verify each chunk before forwarding it).
    if receivers and not (schedule and blob):
        raise reject("bad_schema", "receivers need a schedule and chunk_sha256")
    return PolicyAnnounce(owner=owner, version=version,
                          base_version=expect_int(f["base_version"], "base_version", 0, version), size=size,
                          sha256=digest, chunk_count=chunks, encoding=encoding,
                          created_at=expect_timestamp(f["created_at"], "created_at"),
                          chunk_sha256=tuple(blob[i:i + SHA256_BYTES] for i in range(0, len(blob), SHA256_BYTES)),
                          state_sha256=state, schedule=schedule, receivers=receivers)


def _status(obj: Any, limits: Limits) -> Status:
    f = expect_map(obj, STATUS_KEYS, "body")
    role = expect_str(f["role"], "role", limits.max_name_chars)
    if role not in ROLES:
        raise reject("bad_schema", f"role: {role[:40]!r} not in {ROLES}")
    caps = expect_list(f["capabilities"], "capabilities", limits.max_capabilities, "too_many_capabilities", min_len=0)
    throughput = expect_float(f["throughput"], "throughput")
    if throughput < 0:
        raise reject("out_of_range", f"throughput: {throughput} < 0")
    follows = f["follows"]
    follows = expect_policy_id(follows, "follows", limits) if follows != "" else ""
    capabilities = tuple(expect_str(c, f"capabilities[{i}]", limits.max_name_chars) for i, c in enumerate(caps))
    return Status(role=role, capabilities=capabilities,
                  throughput=throughput, policy_version=expect_int(f["policy_version"], "policy_version"),
                  follows=follows, created_at=expect_timestamp(f["created_at"], "created_at"))


def _control(obj: Any, limits: Limits) -> WorkerControl:
    f = expect_map(obj, CONTROL_KEYS, "body")
    action = expect_str(f["action"], "action", limits.max_name_chars)
    if action not in WORKER_ACTIONS:
        raise reject("bad_schema", f"action: {action[:40]!r} not in {WORKER_ACTIONS}")
    return WorkerControl(target=expect_peer_id(f["target"], "target", limits), action=action,
                         created_at=expect_timestamp(f["created_at"], "created_at"))


def _group_id(value: Any, where: str) -> bytes:
    group_id = expect_bin(value, where)
    if len(group_id) != GROUP_ID_BYTES:
        raise reject("bad_schema", f"{where}: {len(group_id)} bytes, expected {GROUP_ID_BYTES}")
    return group_id


def _digest(obj: Any, where: str, limits: Limits) -> DigestWire:
    f = expect_map(obj, DIGEST_KEYS, where)
    content_hash = expect_bin(f["hash"], f"{where}.hash")
    if len(content_hash) != SHA256_BYTES:
        raise reject("bad_schema", f"{where}.hash: {len(content_hash)} bytes, expected {SHA256_BYTES}")
    variance = expect_float(f["variance"], f"{where}.variance")
    if variance < 0:
        raise reject("out_of_range", f"{where}.variance: {variance} < 0")
    if type(f["signal"]) is not bool:
        raise reject("bad_schema", f"{where}.signal: expected a bool, got {type(f['signal']).__name__}")
    return DigestWire(group_id=_group_id(f["id"], f"{where}.id"),
                      task=expect_str(f["task"], f"{where}.task", limits.max_name_chars),
                      reward_variance=variance, signal=f["signal"], content_hash=content_hash)


def _digests(obj: Any, limits: Limits) -> DigestBatch:
    f = expect_map(obj, DIGEST_BATCH_KEYS, "body")
    raw = expect_list(f["digests"], "digests", limits.max_digests_per_message, "too_many_digests")
    digests = tuple(_digest(d, f"digests[{i}]", limits) for i, d in enumerate(raw))
    if len({d.group_id for d in digests}) != len(digests):
        raise reject("duplicate_group", "two digests in one batch share a group id")
    shard = expect_int(f["shard"], "shard", 0, MAX_SHARD)
    shards = expect_int(f["shards"], "shards", 0, MAX_SHARD + 1)
    if shards and shard >= shards:  # a sender publishes in one of its own M shards
        raise reject("out_of_range", f"shard {shard} is not below the sender's shard count {shards}")
    return DigestBatch(shard=shard, round=expect_int(f["round"], "round"), digests=digests,
                       created_at=expect_timestamp(f["created_at"], "created_at"), shards=shards,
                       addrs=_dial_addrs(f["addrs"], limits))


def _dial_addrs(value: Any, limits: Limits) -> tuple[str, ...]:
    raw = expect_list(value, "addrs", limits.max_digest_addrs, "too_many_addrs", min_len=0)
    addrs = tuple(expect_str(a, f"addrs[{i}]", limits.max_addr_chars) for i, a in enumerate(raw))
    for i, addr in enumerate(addrs):
        if parse_dial_addr(addr) is None:
            raise reject("bad_addr", f"addrs[{i}]: {addr[:80]!r} is not a canonical /ip4|ip6/<ip>/tcp/<port>")
    if len(set(addrs)) != len(addrs):
        raise reject("duplicate_addr", "an address appears twice in addrs")
    return addrs


def _pull(obj: Any, limits: Limits) -> PullRequest:
    f = expect_map(obj, PULL_KEYS, "body")
    blob = expect_bin(f["ids"], "ids")
    if not blob or len(blob) % GROUP_ID_BYTES:
        raise reject("bad_schema", f"ids: {len(blob)} bytes, expected a positive multiple of {GROUP_ID_BYTES}")
    if len(blob) // GROUP_ID_BYTES > limits.max_pulls_per_request:
        raise reject("too_many_pulls", f"ids: {len(blob) // GROUP_ID_BYTES} > {limits.max_pulls_per_request}")
    ids = tuple(blob[i:i + GROUP_ID_BYTES] for i in range(0, len(blob), GROUP_ID_BYTES))
    if len(set(ids)) != len(ids):
        raise reject("duplicate_group", "a pull request names a group id twice")
    return PullRequest(round=expect_int(f["round"], "round"), group_ids=ids,
                       created_at=expect_timestamp(f["created_at"], "created_at"))


def _pulled(obj: Any, limits: Limits) -> PullResponse:
    f = expect_map(obj, PULLED_KEYS, "body")
    raw_groups = expect_list(f["groups"], "groups", limits.max_pulls_per_request, "too_many_pulls", min_len=0)
    raw_refused = expect_list(f["refused"], "refused", limits.max_pulls_per_request, "too_many_pulls", min_len=0)
    if len(raw_groups) + len(raw_refused) > limits.max_pulls_per_request:
        raise reject("too_many_pulls", f"{len(raw_groups)} groups + {len(raw_refused)} refusals > "
                                       f"{limits.max_pulls_per_request}")
    groups = []
    for i, g in enumerate(raw_groups):
        m = expect_map(g, PULLED_GROUP_KEYS, f"groups[{i}]")
        # The group stays bytes here: the receiver checks its hash against the digest before decoding it.
        groups.append(PulledGroup(group_id=_group_id(m["id"], f"groups[{i}].id"),
                                  data=expect_bin(m["group"], f"groups[{i}].group")))
    refused = []
    for i, r in enumerate(raw_refused):
        m = expect_map(r, REFUSAL_KEYS, f"refused[{i}]")
        reason = expect_str(m["reason"], f"refused[{i}].reason", limits.max_name_chars)
        if reason not in PULL_REFUSALS:
            raise reject("bad_schema", f"refused[{i}].reason: {reason[:40]!r} not in {PULL_REFUSALS}")
        refused.append(PullRefusal(group_id=_group_id(m["id"], f"refused[{i}].id"), reason=reason))
    ids = [g.group_id for g in groups] + [r.group_id for r in refused]
    if len(set(ids)) != len(ids):
        raise reject("duplicate_group", "a pull response answers a group id twice")
    return PullResponse(groups=tuple(groups), refused=tuple(refused),
                        created_at=expect_timestamp(f["created_at"], "created_at"))


BODY_DECODERS: dict[type, Callable[[Any, Limits], Message]] = {
    RolloutBatch: _rollouts, PolicyAnnounce: _announce, Status: _status, WorkerControl: _control,
    DigestBatch: _digests, PullRequest: _pull, PullResponse: _pulled,
}
