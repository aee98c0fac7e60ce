"""Group-relative advantage estimators, registered by name.

Each estimator maps the rewards of one group (G completions of one prompt, shape [G]) to advantages [G], and may
name a pivot: the one completion whose row is left out of the loss. A singleton group or a group whose rewards are
all equal carries no learning signal and gets zeros (and no pivot).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarm_node import variants

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
PivotFn = Callable[[torch.Tensor], "int | None"]
EPS = 1e-6


def _no_pivot(rewards: torch.Tensor) -> int | None:
    return None


@dataclass(frozen=True)
class Estimator:
    """`estimator(rewards)` -> advantages; `pivot(rewards)` -> the index of the completion excluded from the loss,
    or None."""

    advantages: AdvantageFn
    pivot: PivotFn = _no_pivot

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        return self.advantages(rewards)


ADVANTAGE_ESTIMATORS: variants.Registry[Estimator] = variants.Registry("advantage", variants.ADVANTAGES)


def _no_signal(rewards: torch.Tensor) -> bool:
    return rewards.numel() < 2 or bool((rewards.max() - rewards.min()).abs() < EPS)


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(r - mean) / std, with the population std (divide by G), as in GRPO/SAPO."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    return centred / centred.pow(2).mean().sqrt()


def mean_baseline_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r - mean, without std scaling (Dr. GRPO: removes the bias toward low-variance groups)."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    return rewards - rewards.mean()


def median_baseline_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r - median, robust for small groups where one outlier moves the mean (MC-GRPO, Kim 2026). The median of an
    even group is the mean of its two middle rewards (torch.median would take the lower one, biasing every
    advantage up)."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    ordered = rewards.sort().values
    n = ordered.numel()
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return rewards - median


def median_pivot(rewards: torch.Tensor) -> int | None:
    """MC-GRPO's pivot: in an odd group (G + 1 completions) the first completion whose reward is the median. Its
    advantage is 0 and it is left out of the loss, so G completions train and the token mean counts only theirs.
    An even group has no pivot."""
    n = rewards.numel()
    if n % 2 == 0 or _no_signal(rewards.double()):
        return None
    median = rewards.sort().values[n // 2]
    return int(torch.nonzero(rewards == median)[0])


ADVANTAGE_ESTIMATORS.add("grpo", Estimator(grpo_advantages))
ADVANTAGE_ESTIMATORS.add("dr_grpo", Estimator(mean_baseline_advantages))
ADVANTAGE_ESTIMATORS.add("median", Estimator(median_baseline_advantages, median_pivot))
