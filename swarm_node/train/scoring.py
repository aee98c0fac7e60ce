"""Scoring rollout groups: our verifier's rewards and group-relative advantages (and the estimator's pivot, a
completion that trains no row), and the samples they train.

A group's rewards always come from our own verifier (`TaskSource.reward`) on a question regenerated from the task
reference, applied to the answer the prompt format extracts (`fmt`, default answer-line); whoever generated the
completions, nothing they claim about correctness is used here. A completion that is not well-formed (the format's
`well_formed`: for answer-line the answer alone, then EOS) gets reward 0 without being verified, under every reward
mode and whatever the reward terms, so it never gets a positive advantage; callers pass the model's EOS ids as
`eos_id` (and the tokenizer's special ids) for this check, `eos_id=None` skips it. A well-formed completion's reward
is its correctness plus the node's reward terms (`tasks.RewardTerms`: format bonus, length penalty; none by
default); the group records which completions were right (`ScoredGroup.correct`), whatever the terms add.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swarm_node import tasks
from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS
from swarm_node.types import LOCAL, Completion, Origin, ScoredGroup, TrainSample

# A completion's correctness: (instance, completion text, format) -> the verifier's score of the extracted answer.
Reward = Callable[[tasks.TaskInstance, str, tasks.PromptFormat], float]


def score_group(inst: tasks.TaskInstance, prompt_ids: Sequence[int], completions: Sequence[Completion],
                reward: Reward = tasks.score, advantage: str = "grpo", origin: Origin = LOCAL,
                eos_id: int | Collection[int] | None = None, special_ids: Collection[int] = (),
                fmt: tasks.PromptFormat = tasks.ANSWER_LINE, terms: tasks.RewardTerms = tasks.NO_TERMS) -> ScoredGroup:
    """Score every completion with `reward` (the task's verifier, on what `fmt` extracts) plus `terms`, and compute
    advantages; non-finite raises. With `eos_id`, a completion that is not well-formed in `fmt` scores 0."""
    rewards: list[float] = []
    correct: list[bool] = []
    for c in completions:
        ok = eos_id is None or fmt.well_formed(c.token_ids, c.text, eos_id, special_ids)
        correctness = reward(inst, c.text, fmt) if ok else 0.0
        rewards.append(terms.apply(correctness, len(c.token_ids)) if ok else 0.0)
        correct.append(ok and correctness >= 1.0)
    if not all(math.isfinite(r) for r in rewards):
        raise FloatingPointError(f"non-finite reward for task {inst.ref}")
    estimator = ADVANTAGE_ESTIMATORS[advantage]
    values = torch.tensor(rewards, dtype=torch.float64)
    return ScoredGroup(inst, prompt_ids, completions, rewards, estimator(values).tolist(), origin,
                       estimator.pivot(values), correct)


class Generated(Protocol):
    """A group as generated, not yet scored (train/partial.PendingGroup)."""

    @property
    def inst(self) -> tasks.TaskInstance: ...
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def completions(self) -> Sequence[Completion]: ...


@dataclass(frozen=True)
class GroupScorer:
    """How a node scores its own groups: `score_group` with its verifier, estimator, EOS and special ids, format
    and reward terms. `has_signal` is the dynamic rollout mode's test (scoring a group again costs little against
    generating it)."""

    reward: Reward
    advantage: str
    eos_ids: Collection[int]
    special_ids: Collection[int]
    fmt: tasks.PromptFormat
    terms: tasks.RewardTerms

    def __call__(self, group: Generated) -> ScoredGroup:
        return score_group(group.inst, group.prompt_ids, group.completions, self.reward, self.advantage,
                           eos_id=self.eos_ids, special_ids=self.special_ids, fmt=self.fmt, terms=self.terms)

    def has_signal(self, group: Generated) -> bool:
        return self(group).has_signal


def to_samples(groups: Sequence[ScoredGroup], off_policy: Sequence[bool] | None = None,
               current_version: int | None = None) -> list[TrainSample]:
    """The training rows of `groups` (a group's pivot trains none); `off_policy[i]` marks group i's rows for the
    stale correction (default: none is). With `current_version`, a completion resumed under several policies
    (APRIL) marks the tokens an older policy sampled (`TrainSample.stale_tokens`), so the correction applies to
    those alone; a row whose tokens are all stale, or all fresh, keeps `stale_tokens` None."""
    flags = off_policy if off_policy is not None else [False] * len(groups)
    return [_sample(g, c, a, off, current_version)
            for g, off in zip(groups, flags, strict=True)
            for c, a in g.trained() if c.token_ids]


def _sample(group: ScoredGroup, c: Completion, advantage: float, off_policy: bool,
            current_version: int | None) -> TrainSample:
    stale: tuple[bool, ...] | None = None
    # only our own sampler's log-probs can be fresh: another process's rows stay off-policy whole
    if current_version is not None and group.origin.is_local and len(c.version_spans()) > 1:
        marks = tuple(v < current_version for v in c.token_versions())
        if any(marks) and not all(marks):
            stale = marks
        off_policy = off_policy or any(marks)
    return TrainSample(group.prompt_ids, c.token_ids, c.logprobs, advantage, off_policy,
                       stale_tokens=stale if off_policy else None)
