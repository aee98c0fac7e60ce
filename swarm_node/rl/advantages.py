"""Group-relative advantage estimators, registered by name.

Each estimator maps the rewards of one group (G completions of one prompt, shape [G]) to advantages [G].
A singleton group or a group whose rewards are all equal carries no learning signal and gets zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from swarm_node import variants

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]
ADVANTAGE_ESTIMATORS: variants.Registry[AdvantageFn] = variants.Registry("advantage", variants.ADVANTAGES)
register = ADVANTAGE_ESTIMATORS.register
EPS = 1e-6


def _no_signal(rewards: torch.Tensor) -> bool:
    return rewards.numel() < 2 or bool((rewards.max() - rewards.min()).abs() < EPS)


@register("grpo")
def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(r - mean) / std, with the population std (divide by G), as in GRPO/SAPO."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    return centred / centred.pow(2).mean().sqrt()


@register("dr_grpo")
def mean_baseline_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r - mean, without std scaling (Dr. GRPO: removes the bias toward low-variance groups)."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    return rewards - rewards.mean()


@register("median")
def median_baseline_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """r - median, robust for small groups where one outlier moves the mean."""
    rewards = rewards.double()
    if _no_signal(rewards):
        return torch.zeros_like(rewards)
    return rewards - rewards.median()
