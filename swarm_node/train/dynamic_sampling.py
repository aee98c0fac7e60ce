"""Dynamic sampling for a node alone (DAPO's, here a rollout mode: `[run.rollout] kind = "dynamic"`): keep
generating groups until I of them carry signal, within a cap, instead of training on fewer.

Contract (pure: no sampler, no clock): `sample_until_signal(generate, has_signal, target, max_factor)` calls
`generate(round, count)` for `count` new groups, round after round, until `target` (I) groups have signal or
`target * max_factor` groups were generated. Each round asks only for the groups with signal still missing (never
more than the cap leaves), so a step never has more than I groups with signal: none is generated to be thrown away,
and every generated group is returned (in order) to be counted, its tokens among the step's. The result says how
many groups were generated, how many have signal and how many rounds it took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

G = TypeVar("G")
DEFAULT_MAX_FACTOR = 4  # issue 30: at most 4 times I groups per step


@dataclass(frozen=True)
class SignalDraw(Generic[G]):
    groups: tuple[G, ...]  # every group generated this step, in order
    with_signal: int  # of them, those with signal (at most the target)
    rounds: int  # generate calls

    @property
    def generated(self) -> int:
        return len(self.groups)


def next_count(target: int, cap: int, generated: int, with_signal: int) -> int:
    """Groups the next round asks for: those with signal still missing, within what the cap leaves (0: done)."""
    return max(0, min(target - with_signal, cap - generated))


def sample_until_signal(generate: Callable[[int, int], Sequence[G]], has_signal: Callable[[G], bool], target: int,
                        max_factor: int = DEFAULT_MAX_FACTOR) -> SignalDraw[G]:
    """Round r calls `generate(r, count)`; see the module contract."""
    if target < 1 or max_factor < 1:
        raise ValueError(f"dynamic sampling needs target >= 1 and max_factor >= 1, got {target} and {max_factor}")
    cap = target * max_factor
    groups: list[G] = []
    with_signal = rounds = 0
    while (count := next_count(target, cap, len(groups), with_signal)) > 0:
        new = list(generate(rounds, count))
        rounds += 1
        if not new:  # a source with nothing left would loop forever
            break
        groups.extend(new)
        with_signal += sum(1 for g in new if has_signal(g))
    return SignalDraw(tuple(groups), with_signal, rounds)
