"""Value types that cross component boundaries: what a sampler returns, what the trainer takes, what a step holds.

A leaf module: it imports only `tasks` (pure) and the standard library, so samplers, the trainer, sharing, the
ECHO-2 roles and the node can all exchange these without importing one another.

Every type here is frozen and holds tuples, not lists: a value handed to another component never changes under it.
A changed value is a new value (`dataclasses.replace`). Sequences given to a constructor are stored as tuples.
`tests/unit/test_layering.py` checks both rules.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from swarm_node.tasks import TaskInstance


def _tuples(obj: object, *names: str) -> None:
    """Store the named sequence fields as tuples (a frozen value must not share a list with its caller)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not isinstance(value, tuple):
            object.__setattr__(obj, name, tuple(value))


class OriginKind(enum.Enum):
    LOCAL = "local"  # sampled by this node's own policy (its lag is measured in our versions)
    WORKER = "worker"  # sampled by an ECHO-2 worker of ours, from a policy we published
    PEER = "peer"  # received from another peer (SAPO), re-scored by our verifier


@dataclass(frozen=True)
class Origin:
    """Who generated a group's completions. Only a `LOCAL` group's log-probs are our own sampler's: every other
    origin is off-policy for the loss (its log-probs only enter the truncated importance weight)."""

    kind: OriginKind
    peer_id: str = ""  # PEER (and a WORKER known by its peer id): the sender

    @classmethod
    def peer(cls, peer_id: str) -> Origin:
        return cls(OriginKind.PEER, peer_id)

    @property
    def is_local(self) -> bool:
        return self.kind is OriginKind.LOCAL


LOCAL = Origin(OriginKind.LOCAL)
WORKER = Origin(OriginKind.WORKER)


@dataclass(frozen=True)
class Completion:
    """One sampled completion: token ids (ending with EOS when the model stopped), decoded text (without EOS),
    the processed log-prob of each sampled token, and the policy version that produced it.

    A completion resumed under newer policies (APRIL, train/partial.py) carries `spans`: (first token index, policy
    version) of each token span, in token order, the first at index 0; `version` is then the newest span's (the
    policy that finished it). Empty `spans`: one span, (0, version)."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    version: int
    spans: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "token_ids", "logprobs", "spans")
        if self.spans and not isinstance(self.spans[0], tuple):
            raise TypeError("Completion.spans holds (start, version) tuples")
        object.__setattr__(self, "spans", tuple(tuple(s) for s in self.spans))

    @classmethod
    def from_spans(cls, token_ids: Sequence[int], text: str, logprobs: Sequence[float],
                   spans: Sequence[tuple[int, int]], version: int) -> Completion:
        """A completion of the given spans: versioned by the newest span, `version` where there are none; one span is
        kept as its version alone, as our sampler keeps one (both read the same)."""
        spans = tuple(spans)
        if not spans:
            return cls(tuple(token_ids), text, tuple(logprobs), version)
        return cls(tuple(token_ids), text, tuple(logprobs), spans[-1][1], spans if len(spans) > 1 else ())

    def version_spans(self) -> tuple[tuple[int, int], ...]:
        """(first token index, policy version) of each span: `spans`, or the one span (0, version)."""
        return self.spans or ((0, self.version),)

    @property
    def oldest_version(self) -> int:
        """The oldest policy that sampled any of its tokens (what the staleness bound reads)."""
        return min(v for _, v in self.version_spans())

    def token_versions(self) -> tuple[int, ...]:
        """The policy version that sampled each token."""
        spans = self.version_spans()
        out: list[int] = []
        for k, (start, version) in enumerate(spans):
            end = spans[k + 1][0] if k + 1 < len(spans) else len(self.token_ids)
            out.extend([version] * (end - start))
        return tuple(out)


@dataclass(frozen=True)
class TrainSample:
    """One completion with its prompt, behaviour log-probs (one per completion token) and advantage.

    The two optional fields serve external completions (sharing/corrections.py); absent, training is unchanged.
    `token_weights`: a fixed weight per completion token multiplying its loss term (0 drops the token).
    `is_cap`: for an off-policy row, its own cap on min(pi_proximal / mu, cap) instead of `train.is_cap`.
    `stale_tokens`: for an off-policy row of our own, which completion tokens an older policy sampled (a completion
    resumed under a newer policy, APRIL); the stale correction applies to those alone. None: all of them."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    advantage: float
    off_policy: bool = False  # behaviour policy is older than the trained one: apply the IS weight
    token_weights: tuple[float, ...] | None = None  # one per completion token, or None (all 1)
    is_cap: float | None = None  # None: the trainer's train.is_cap
    stale_tokens: tuple[bool, ...] | None = None  # one per completion token, or None (all, when off_policy)

    def __post_init__(self) -> None:
        _tuples(self, "prompt_ids", "completion_ids", "behaviour_logprobs", "token_weights", "stale_tokens")


@dataclass(frozen=True)
class ScoredGroup:
    """G completions of one task instance, scored by our own verifier, with group-relative advantages."""

    inst: TaskInstance
    prompt_ids: tuple[int, ...]
    completions: tuple[Completion, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...] = ()
    origin: Origin = LOCAL
    pivot: int | None = None  # a completion that trains no row (MC-GRPO's median completion), or None
    # Per completion: well-formed and fully right (empty: a reward >= 1 is right, as without reward terms).
    correct: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "prompt_ids", "completions", "rewards", "advantages", "correct")

    def trained(self) -> list[tuple[Completion, float]]:
        """(completion, advantage) of each completion that trains a row: all but the pivot."""
        return [(c, a) for i, (c, a) in enumerate(zip(self.completions, self.advantages, strict=True))
                if i != self.pivot]

    @property
    def version(self) -> int:
        """The policy version that generated the completions (within one lineage; see train/staleness.py)."""
        return self.completions[0].version if self.completions else 0

    @property
    def oldest_version(self) -> int:
        """The oldest policy that sampled any token of the group (a resumed completion's first span: APRIL)."""
        return min((c.oldest_version for c in self.completions), default=0)

    @property
    def has_signal(self) -> bool:
        return any(a != 0.0 for a in self.advantages)

    def correctness(self) -> tuple[float, ...]:
        """1.0 for each completion that was right, else 0.0 (whatever reward terms added to its reward)."""
        return tuple(float(c) for c in (self.correct or tuple(r >= 1.0 for r in self.rewards)))

    @property
    def accuracy(self) -> float:
        right = self.correctness()
        return sum(right) / len(right)


@dataclass(frozen=True)
class PoolEntry:
    """A re-scored external group waiting in the experience pool."""

    group: ScoredGroup
    sender: str
    key: bytes  # content hash (sharing/wire.content_key)
    received_step: int  # our training step when it arrived
    retokenized: bool = False  # sender used another tokenizer: its log-probs do not apply to our token ids


@dataclass(frozen=True)
class ShareReport:
    """What a SAPO peer did for one step (sharing/peer.py): received, dropped, and its pool after taking."""

    received: int
    dropped: Mapping[str, int]  # this step's drops by reason (stored read-only)
    pool_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "dropped", MappingProxyType(dict(self.dropped)))

    def metrics(self, externals: tuple[PoolEntry, ...]) -> dict[str, Any]:
        """The peer fields of a step's metrics (absent for a node that does not share); `external_signal`: the
        external groups with signal (all of them unless `[share] filter_no_signal` is off)."""
        rewards = [r for e in externals for r in e.group.rewards]
        return {"external_used": len(externals), "external_signal": sum(1 for e in externals if e.group.has_signal),
                "external_sources": sorted({e.sender for e in externals}),
                "external_reward_mean": sum(rewards) / len(rewards) if rewards else None,
                "pool_size": self.pool_size, "received": self.received, "external_dropped": dict(self.dropped)}


@dataclass(frozen=True)
class Draft:
    """The first half of a step: this step's groups, sampled and scored (and, for a peer, published); a SAPO peer
    adds the external groups it took from its pool for this step and its report (`share`)."""

    groups: tuple[ScoredGroup, ...]
    gen_s: float
    gen_tokens: int
    started: float
    version: int  # the policy version that generated the groups
    draw: int = 0  # the node's batch number of this draw (a published group's id derives from it)
    externals: tuple[PoolEntry, ...] = ()
    share: ShareReport | None = None  # None: a node that does not share
    # the rollout mode's counters for this draft (train/partial.py), e.g. ("resume_failed", 2); empty for sync
    rollout: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _tuples(self, "groups", "externals", "rollout")


@dataclass(frozen=True)
class SkippedStep:
    """A step that produced nothing to train on, and why (e.g. a non-finite reward). It still counts as a step."""

    reason: str

