"""Scoring rollout groups: our verifier's rewards and group-relative advantages (and the estimator's pivot, a
completion that trains no row), and the samples they train.

A group's rewards always come from our own verifier (`TaskSource.reward`) on a question regenerated from the task
reference; whoever generated the completions, nothing they claim about correctness is used here. A completion that
is not well-formed (`tasks.well_formed`: the answer alone, then EOS) gets reward 0 without being verified, under
every reward mode, so it never gets a positive advantage; callers pass the model's EOS ids as `eos_id` (and the
tokenizer's special ids) for this check, `eos_id=None` skips it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import torch

from swarm_node import tasks
from swarm_node.rl.advantages import ADVANTAGE_ESTIMATORS
from swarm_node.types import LOCAL, Completion, Origin, ScoredGroup, TrainSample


def score_group(inst: tasks.TaskInstance, prompt_ids: Sequence[int], completions: Sequence[Completion],
                reward: Callable[[tasks.TaskInstance, str], float] = tasks.score, advantage: str = "grpo",
                origin: Origin = LOCAL, eos_id: int | Collection[int] | None = None,
                special_ids: Collection[int] = ()) -> ScoredGroup:
    """Score every completion with `reward` (the task's verifier) and compute advantages; non-finite raises.
    With `eos_id`, a completion that is not well-formed scores 0 (`tasks.well_formed`)."""
    rewards = [reward(inst, c.text)
               if eos_id is None or tasks.well_formed(c.token_ids, c.text, eos_id, special_ids) else 0.0
               for c in completions]
    if not all(math.isfinite(r) for r in rewards):
        raise FloatingPointError(f"non-finite reward for task {inst.ref}")
    estimator = ADVANTAGE_ESTIMATORS[advantage]
    values = torch.tensor(rewards, dtype=torch.float64)
    return ScoredGroup(inst, prompt_ids, completions, rewards, estimator(values).tolist(), origin,
                       estimator.pivot(values))


def to_samples(groups: Sequence[ScoredGroup], off_policy: Sequence[bool] | None = None) -> list[TrainSample]:
    """The training rows of `groups` (a group's pivot trains none); `off_policy[i]` marks group i's rows for the
    stale correction (default: none is)."""
    flags = off_policy if off_policy is not None else [False] * len(groups)
    return [TrainSample(g.prompt_ids, c.token_ids, c.logprobs, a, off)
            for g, off in zip(groups, flags, strict=True)
            for c, a in g.trained() if c.token_ids]
