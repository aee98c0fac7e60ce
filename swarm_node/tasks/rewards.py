"""Rewards beyond correctness (`REWARD_TERMS`): what a well-formed completion's reward adds to its correctness.

Correctness (reasoning-gym's verifier on the extracted answer, under the reward mode: `source.REWARD_MODES`) stays
the core; a completion that is not well-formed scores 0 before any term applies (`train.scoring`). Each term is
registered by name with a weight, and a weight of 0 (the default) leaves the reward as it was:
- `format_bonus` w: + w for every well-formed completion (rl-swarm's early format reward), right or wrong;
- `length_penalty` w: - w * correctness * tokens / budget (ids, EOS included, over the generation budget): a right
  answer that uses the whole budget keeps 1 - w, one that uses one token nearly 1.
Every node re-computes every reward itself with its own terms and budget (peers' groups included).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from swarm_node import variants

# A term's change to the reward: (weight, correctness, completion tokens, budget) -> delta.
Term = Callable[[float, float, int, int], float]
REWARD_TERMS: variants.Registry[Term] = variants.Registry("reward term", variants.REWARD_TERMS)
REWARD_TERMS.add("format_bonus", lambda weight, correct, tokens, budget: weight)
REWARD_TERMS.add("length_penalty", lambda weight, correct, tokens, budget: -weight * correct * tokens / budget)


@dataclass(frozen=True)
class RewardTerms:
    """The weighted terms of a node's reward and the budget the length term divides by (0: no length term)."""

    weights: tuple[tuple[str, float], ...] = ()  # (term name, weight); weight 0 terms do nothing
    budget: int = 0

    def __post_init__(self) -> None:
        for name, _ in self.weights:
            REWARD_TERMS[name]  # noqa: B018 - an unknown name raises here, naming the choices
        if any(weight for _, weight in self.weights) and self.budget < 1:
            raise ValueError("reward terms need the generation budget (RewardTerms.budget >= 1)")

    def apply(self, correctness: float, tokens: int) -> float:
        """The reward of a well-formed completion with this correctness and this many ids."""
        return correctness + sum(REWARD_TERMS[name](weight, correctness, tokens, self.budget)
                                 for name, weight in self.weights if weight)


NO_TERMS = RewardTerms()
