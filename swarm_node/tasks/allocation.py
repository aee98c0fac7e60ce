"""Rollout allocations (`ROLLOUT_ALLOCATIONS`): how many completions each prompt of a step gets.

An allocation is a `RolloutAllocation`: `allocate(rates, group_size) -> [completions per prompt]`, `rates` the
prompts' estimated pass rates (`PassRateBook.rate`), the total always the step's budget `len(rates) * group_size`;
and `largest(group_size)`, the largest group it makes (what a node running it takes from peers by default).
- `fixed`: every prompt gets `group_size` (GRPO's fixed G; the default).
- `dars` (DARS, difficulty-adaptive rollout sampling): hard prompts still unsolved get more completions, so that
  one of them finds a right answer and the group has signal. Each prompt gets `dars_floor(G) = max(2, G // 2)`
  (a group of 2 can still have signal); the rest of the budget goes one completion at a time (D'Hondt's highest
  quotient) to the prompt with the largest `u / (extra + 1)`, `u = (1 - rate) ** G` the chance that G completions
  all fail (still unsolved: near 1 for a hard prompt, 0 for a solved one; the plain hardness 1 - rate barely tells
  pass rates of 5% and 20% apart), `extra` the completions it got beyond the
  floor so far, on ties the one with fewer extra completions, then the first; none past `dars_ceiling(G) = 2 G`. A
  prompt estimated always solved gets the floor, unless the budget left once the others reach the ceiling is shared
  out among them; when every prompt is, they are all alike (G each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swarm_node import variants


@dataclass(frozen=True)
class RolloutAllocation:
    allocate: Callable[[Sequence[float], int], list[int]]
    largest: Callable[[int], int]
    reads_rates: bool  # whether `allocate` reads the rates (the node then keeps pass-rate estimates)


ROLLOUT_ALLOCATIONS: variants.Registry[RolloutAllocation] = variants.Registry("run.rollout_allocation",
                                                                             variants.ROLLOUT_ALLOCATIONS)


def dars_floor(group_size: int) -> int:
    return max(2, group_size // 2)


def dars_ceiling(group_size: int) -> int:
    """The largest group `dars` makes: also the largest a node running it takes from peers."""
    return 2 * group_size


def allocate_fixed(rates: Sequence[float], group_size: int) -> list[int]:
    return [group_size] * len(rates)


def allocate_dars(rates: Sequence[float], group_size: int) -> list[int]:
    floor, ceiling = dars_floor(group_size), dars_ceiling(group_size)
    if floor > group_size:  # G = 1: nothing to move
        return [group_size] * len(rates)
    hardness = [(1.0 - min(1.0, max(0.0, r))) ** group_size for r in rates]
    if not any(hardness):
        hardness = [1.0] * len(rates)
    sizes = [floor] * len(rates)
    for _ in range(len(rates) * (group_size - floor)):
        open_ = [i for i in range(len(rates)) if sizes[i] < ceiling]
        best = max(open_, key=lambda i: (hardness[i] / (sizes[i] - floor + 1), floor - sizes[i], -i))
        sizes[best] += 1
    return sizes


ROLLOUT_ALLOCATIONS.add("fixed", RolloutAllocation(allocate_fixed, lambda group_size: group_size, False))
ROLLOUT_ALLOCATIONS.add("dars", RolloutAllocation(
    allocate_dars, lambda group_size: max(group_size, dars_ceiling(group_size)), True))
