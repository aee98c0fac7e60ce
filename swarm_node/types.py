"""Value types that cross component boundaries: what a sampler returns, what the trainer takes, what a step holds.

A leaf module: it imports only `tasks` (pure) and the standard library, so samplers, the trainer, sharing, the
ECHO-2 roles and the node can all exchange these without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm_node.tasks import TaskInstance


@dataclass(frozen=True)
class Completion:
    """One sampled completion: token ids (ending with EOS when the model stopped), decoded text (without EOS),
    the processed log-prob of each sampled token, and the policy version that produced it."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    version: int


@dataclass(frozen=True)
class TrainSample:
    """One completion with its prompt, behaviour log-probs (one per completion token) and advantage.

    The two optional fields serve external completions (sharing/corrections.py); absent, training is unchanged.
    `token_weights`: a fixed weight per completion token multiplying its loss term (0 drops the token).
    `is_cap`: for an off-policy row, its own cap on min(pi_proximal / mu, cap) instead of `train.is_cap`."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    off_policy: bool = False  # behaviour policy is older than the trained one: apply the IS weight
    token_weights: list[float] | None = None  # one per completion token, or None (all 1)
    is_cap: float | None = None  # None: the trainer's train.is_cap


@dataclass
class ScoredGroup:
    """G completions of one task instance, scored by our own verifier, with group-relative advantages."""

    inst: TaskInstance
    prompt_ids: list[int]
    completions: list[Completion]
    rewards: list[float]
    advantages: list[float] = field(default_factory=list)
    source: str = "local"  # "local", "worker", or the sending peer's id
    off_policy: bool = False

    @property
    def version(self) -> int:
        """The policy version that generated the completions (within one lineage; see train/staleness.py)."""
        return self.completions[0].version if self.completions else 0

    @property
    def has_signal(self) -> bool:
        return any(a != 0.0 for a in self.advantages)

    @property
    def accuracy(self) -> float:
        return sum(r >= 1.0 for r in self.rewards) / len(self.rewards)


@dataclass(frozen=True)
class PoolEntry:
    """A re-scored external group waiting in the experience pool."""

    group: ScoredGroup
    sender: str
    key: bytes  # content hash (sharing/wire.content_key)
    received_step: int  # our training step when it arrived
    retokenized: bool = False  # sender used another tokenizer: its log-probs do not apply to our token ids


@dataclass
class Draft:
    """The first half of a step: this step's groups, sampled and scored (and, for a peer, published)."""

    groups: list[ScoredGroup]
    gen_s: float
    gen_tokens: int
    started: float
    version: int  # the policy version that generated the groups


@dataclass(frozen=True)
class SkippedStep:
    """A step that produced nothing to train on, and why (e.g. a non-finite reward). It still counts as a step."""

    reason: str
