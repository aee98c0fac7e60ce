"""Gossip validation: the checks beyond decoding, and their composition into one verdict per message.

Contract: pure functions and one state machine (`ReplayGuard`); time is always an argument, nothing here reads a
clock or does I/O. `validate_gossip` never raises for any input bytes; it returns ACCEPT with the message, or
REJECT/IGNORE with a reason. Checks run in this order, all REJECT-class ones first:
decode (schema, limits) -> topic carries this type -> policy ids belong to the signer -> freshness (IGNORE)
-> task references allowed (IGNORE) -> tokenizer allowed (IGNORE) -> replay (IGNORE).
Only a message that passes everything is remembered by the replay guard.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.codec import check_fresh, decode, replay_keys
from protocol.errors import Verdict, WireError, ignore, reject
from protocol.limits import MAX_INT, Limits
from protocol.messages import (
    DigestBatch,
    Message,
    PolicyAnnounce,
    RolloutBatch,
    TaskRefWire,
    digest_topic,
    policy_owner,
    topic_type,
)


@dataclass(frozen=True)
class AcceptPolicy:
    """What this node accepts from peers (by default: its own task config).

    tasks: allowed (dataset, canonical config) pairs; max_index: task indices must be below it (the dataset size);
    seeds: allowed seeds, None for any; tokenizer_hashes: allowed tokenizer hashes, None for any;
    delegates: policy owner peer id -> peer ids allowed to sign rollouts for that owner's policies (ECHO-2
    workers sampling a learner's policy). A policy announce is only ever accepted from its owner.
    """

    tasks: frozenset[tuple[str, str]]
    max_index: int
    seeds: frozenset[int] | None = None
    tokenizer_hashes: frozenset[str] | None = None
    delegates: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.max_index <= MAX_INT + 1:
            raise ValueError(f"AcceptPolicy.max_index must be in [1, 2**63], got {self.max_index}")


def check_task_ref(ref: TaskRefWire, policy: AcceptPolicy) -> None:
    """IGNORE unless the reference names an allowed (dataset, config), an allowed seed and an index in bounds:
    a peer must not make us build arbitrary datasets. Another task is not an attack, so no penalty."""
    if (ref.dataset, ref.config) not in policy.tasks:
        raise ignore("task_not_allowed", f"{ref.dataset[:40]!r} with config {ref.config[:80]!r}")
    if policy.seeds is not None and ref.seed not in policy.seeds:
        raise ignore("task_not_allowed", f"seed {ref.seed}")
    if not 0 <= ref.index < policy.max_index:
        raise ignore("task_index_out_of_range", f"index {ref.index} >= {policy.max_index}")


def check_attribution(msg: Message, signer_peer_id: str,
                      delegates: Mapping[str, frozenset[str]] | None = None) -> None:
    """REJECT a message that claims a policy its signer does not own (or is not a delegate for).

    `signer_peer_id` is the base58 string of the peer that signed the pubsub message (StrictSign), not the
    forwarder. Status messages carry no attributed policy."""
    if isinstance(msg, RolloutBatch):
        for group in msg.groups:
            owner = policy_owner(group.policy_id)
            if owner != signer_peer_id and signer_peer_id not in (delegates or {}).get(owner, ()):
                raise reject("forged_attribution", f"policy {group.policy_id[:80]!r} signed by {signer_peer_id}")
    elif isinstance(msg, PolicyAnnounce) and policy_owner(msg.owner) != signer_peer_id:
        raise reject("forged_attribution", f"announce for {msg.owner[:80]!r} signed by {signer_peer_id}")


def check_topic(topic: str, msg: Message) -> None:
    """REJECT a message type that does not belong on the topic it arrived on."""
    expected = topic_type(topic)
    if expected is None:
        raise reject("wrong_topic", f"unknown topic {topic[:80]!r}")
    if not isinstance(msg, expected):
        raise reject("wrong_topic", f"{type(msg).__name__} on {topic}")
    if isinstance(msg, DigestBatch) and digest_topic(msg.shard) != topic:
        raise reject("wrong_topic", f"digests of shard {msg.shard} on {topic}")


class ReplayGuard:
    """Remembers accepted message ids for the accepted created-at window, in bounded memory.

    An id is remembered until its created_at falls out of the window (`now - max_age_s`), after which the
    freshness check refuses the message anyway. When `capacity` ids are held, the one with the oldest created_at
    is forgotten and the guard raises its floor to that created_at: anything created at or before the floor
    counts as a replay. Under overload the accepted window shrinks instead of replays getting through.
    """

    def __init__(self, max_age_s: float, capacity: int = 131_072) -> None:
        if capacity < 1:
            raise ValueError("ReplayGuard capacity must be >= 1")
        self.max_age_s = max_age_s
        self.capacity = capacity
        self.floor = float("-inf")  # created_at at or below this is refused (set by capacity evictions)
        self._seen: dict[bytes, float] = {}
        self._by_age: list[tuple[float, bytes]] = []  # heap of (created_at, id)

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now: float) -> None:
        """Forget ids whose created_at has left the window; called by the other methods as well."""
        horizon = now - self.max_age_s
        while self._by_age and self._by_age[0][0] < horizon:
            _, key = heapq.heappop(self._by_age)
            del self._seen[key]

    def is_replay(self, key: bytes, created_at: float, now: float) -> bool:
        """Whether accepting (key, created_at) now could accept a replay."""
        self.expire(now)
        return key in self._seen or created_at <= self.floor or created_at < now - self.max_age_s

    def remember(self, key: bytes, created_at: float, now: float) -> None:
        self.expire(now)
        if key in self._seen:
            return
        while len(self._seen) >= self.capacity:
            oldest, old_key = heapq.heappop(self._by_age)
            del self._seen[old_key]
            self.floor = max(self.floor, oldest)
        self._seen[key] = created_at
        heapq.heappush(self._by_age, (created_at, key))


@dataclass(frozen=True)
class Validated:
    """The outcome for one gossip message: ACCEPT carries the message, REJECT/IGNORE a reason code."""

    verdict: Verdict
    message: Message | None = None
    reason: str = ""
    detail: str = ""


def check_message(msg: Message, topic: str, signer_peer_id: str, limits: Limits, policy: AcceptPolicy,
                  now: float) -> None:
    """Every check on a decoded message except replay; raises WireError."""
    check_topic(topic, msg)
    check_attribution(msg, signer_peer_id, policy.delegates)
    check_fresh(msg, limits, now)
    if isinstance(msg, RolloutBatch):
        for group in msg.groups:
            check_task_ref(group.task, policy)
            if policy.tokenizer_hashes is not None and group.tokenizer_hash not in policy.tokenizer_hashes:
                raise ignore("tokenizer_mismatch", f"tokenizer {group.tokenizer_hash[:80]!r}")


def validate_gossip(topic: str, data: bytes, signer_peer_id: str, *, limits: Limits, policy: AcceptPolicy,
                    now: float, replay: ReplayGuard) -> Validated:
    """Decode and validate one gossip message and map it to ACCEPT / REJECT / IGNORE.

    REJECT: malformed, over a limit, wrong topic, forged attribution. IGNORE: unknown schema version, stale or
    future created_at, task or tokenizer this node does not take, replay (an honest peer may forward a message
    we have already seen, so replays are not penalised). An accepted message is remembered for replay."""
    try:
        msg = decode(data, limits, now=None)  # freshness is checked after the REJECT-class checks
        check_message(msg, topic, signer_peer_id, limits, policy, now)
        keys = replay_keys(msg)
        if any(replay.is_replay(key, created_at, now) for key, created_at in keys):
            raise ignore("replay", "message or group already accepted, or older than the replay window")
    except WireError as err:
        return Validated(err.verdict, None, err.reason, err.detail)
    for key, created_at in keys:
        replay.remember(key, created_at, now)
    return Validated(Verdict.ACCEPT, msg)
