"""Task selections (`TASK_SELECTIONS`): the order of a task source's training stream over its mix.

A selection is `fn(rng, weights, size, count, turn) -> [(specialty, index), ...]`: `count` picks of a specialty
(a position in the mix, whose weights are given) and an instance index in [0, size). `turn` is how many prompts
the stream has drawn before this call, for selections that rotate. Every selection draws exactly
`rng.randrange(size)` per pick and nothing else for a mix of one, so a single-task stream is the same whatever the
selection (and the same as before mixes existed).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from swarm_node import variants

TaskSelection = Callable[[random.Random, Sequence[float], int, int, int], list[tuple[int, int]]]
TASK_SELECTIONS: variants.Registry[TaskSelection] = variants.Registry("task.selection", variants.TASK_SELECTIONS)


@TASK_SELECTIONS.register("uniform")
def select_uniform(rng: random.Random, weights: Sequence[float], size: int, count: int,
                   turn: int) -> list[tuple[int, int]]:
    """Independent uniform draws: a specialty uniformly (weights ignored), then an index uniformly."""
    n = len(weights)
    return [(rng.randrange(n) if n > 1 else 0, rng.randrange(size)) for _ in range(count)]


@TASK_SELECTIONS.register("weighted")
def select_weighted(rng: random.Random, weights: Sequence[float], size: int, count: int,
                    turn: int) -> list[tuple[int, int]]:
    """Each prompt's specialty drawn independently with probability proportional to its weight."""
    n = len(weights)
    return [(rng.choices(range(n), weights=weights)[0] if n > 1 else 0, rng.randrange(size)) for _ in range(count)]


@TASK_SELECTIONS.register("balanced")
def select_balanced(rng: random.Random, weights: Sequence[float], size: int, count: int,
                    turn: int) -> list[tuple[int, int]]:
    """SAPO's balanced mix: specialties take turns in mix order (weights ignored). Prompt number t of the stream
    gets specialty t mod n: a step of n prompts has exactly one of each, a step of fewer continues the rotation
    where the previous one stopped, so over steps every specialty appears equally often."""
    n = len(weights)
    return [((turn + j) % n, rng.randrange(size)) for j in range(count)]
