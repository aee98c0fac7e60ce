"""Task selections (`TASK_SELECTIONS`): the order of a task source's training stream over its mix.

A selection is `fn(rng, weights, size, count, turn, rates=None) -> [(specialty, index), ...]`: `count` picks of a
specialty (a position in the mix, whose weights are given) and an instance index in [0, size). `turn` is how many
prompts the stream has drawn before this call, for selections that rotate; `rates` (a `PassRates`, the task
source's estimates from `pass_rates.PassRateBook`) is read by the difficulty-targeted selection only. Every
selection but `adaptive` draws exactly `rng.randrange(size)` per pick and nothing else for a mix of one, so a
single-task stream is the same whatever those selections (and the same as before mixes existed).

`adaptive` (VCRL, CurES, DARS: prompts of moderate difficulty carry the most signal): each pick's specialty is
drawn (one `rng.random()`, for a mix of more than one) with probability `ADAPTIVE_FLOOR / n + (1 - ADAPTIVE_FLOOR) *
v_s / sum(v)`, where `v_s = p_s (1 - p_s)` is the expected reward variance at the specialty's estimated pass rate
(uniform when every v is 0): the floor keeps every specialty drawn, so none starves and its estimate stays fresh.
Then, when the specialty has replay candidates (`rates.replayable`: instances the node itself sampled with mixed
outcomes, a few times at most; not already picked in this call), with probability `ADAPTIVE_REPLAY` (one
`rng.random()`) the candidate with the largest v at its instance estimate is replayed (the oldest on ties): VCRL's
memory bank. A procedural dataset rarely repeats an instance by chance, and the default model's pass rate per
question is nearly always 0 or 1 (docs/SAPO_REGIMES.md), so a specialty's rate cannot tell which new instance
will carry signal; an instance whose group had signal very likely has it again. Otherwise `ADAPTIVE_CANDIDATES`
indices are drawn (`rng.randrange(size)` each) and the one with the largest v at its instance estimate is taken
(the first on ties: an instance never seen has its specialty's rate). With no replay candidates the draws are
those of the selection before replay existed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from swarm_node import variants
from swarm_node.tasks.pass_rates import signal_value

ADAPTIVE_FLOOR = 0.2  # share of adaptive draws spread uniformly over the specialties (exploration)
ADAPTIVE_CANDIDATES = 4  # indices an adaptive pick chooses among
ADAPTIVE_REPLAY = 0.5  # chance that a pick replays an instance whose own group had signal, when there is one


class PassRates(Protocol):
    """Estimated pass rates by position in the mix (`TaskSource` answers from its `PassRateBook`)."""

    def family(self, specialty: int) -> float: ...

    def instance(self, specialty: int, index: int) -> float: ...

    def replayable(self, specialty: int) -> list[tuple[int, float]]: ...


TaskSelection = Callable[..., list[tuple[int, int]]]


def reads_rates(selection: TaskSelection) -> bool:
    """Whether a selection reads the pass rates (the node then keeps them); marked by `@reading_rates`."""
    return bool(getattr(selection, "reads_rates", False))


def reading_rates(selection: TaskSelection) -> TaskSelection:
    selection.reads_rates = True  # type: ignore[attr-defined]
    return selection
TASK_SELECTIONS: variants.Registry[TaskSelection] = variants.Registry("task.selection", variants.TASK_SELECTIONS)


@TASK_SELECTIONS.register("uniform")
def select_uniform(rng: random.Random, weights: Sequence[float], size: int, count: int,
                   turn: int, rates: PassRates | None = None) -> list[tuple[int, int]]:
    """Independent uniform draws: a specialty uniformly (weights ignored), then an index uniformly."""
    n = len(weights)
    return [(rng.randrange(n) if n > 1 else 0, rng.randrange(size)) for _ in range(count)]


@TASK_SELECTIONS.register("weighted")
def select_weighted(rng: random.Random, weights: Sequence[float], size: int, count: int,
                    turn: int, rates: PassRates | None = None) -> list[tuple[int, int]]:
    """Each prompt's specialty drawn independently with probability proportional to its weight."""
    n = len(weights)
    return [(rng.choices(range(n), weights=weights)[0] if n > 1 else 0, rng.randrange(size)) for _ in range(count)]


@TASK_SELECTIONS.register("balanced")
def select_balanced(rng: random.Random, weights: Sequence[float], size: int, count: int,
                    turn: int, rates: PassRates | None = None) -> list[tuple[int, int]]:
    """SAPO's balanced mix: specialties take turns in mix order (weights ignored). Prompt number t of the stream
    gets specialty t mod n: a step of n prompts has exactly one of each, a step of fewer continues the rotation
    where the previous one stopped, so over steps every specialty appears equally often."""
    n = len(weights)
    return [((turn + j) % n, rng.randrange(size)) for j in range(count)]


def adaptive_probabilities(rates: PassRates | None, n: int) -> list[float]:
    """Each specialty's draw probability under `adaptive` (module docstring)."""
    values = [signal_value(rates.family(s)) if rates is not None else 0.0 for s in range(n)]
    total = sum(values)
    if total <= 0.0:
        return [1.0 / n] * n
    return [ADAPTIVE_FLOOR / n + (1.0 - ADAPTIVE_FLOOR) * v / total for v in values]


@TASK_SELECTIONS.register("adaptive")
@reading_rates
def select_adaptive(rng: random.Random, weights: Sequence[float], size: int, count: int,
                    turn: int, rates: PassRates | None = None) -> list[tuple[int, int]]:
    """Difficulty-targeted picks (module docstring); weights ignored."""
    n = len(weights)
    probs = adaptive_probabilities(rates, n)
    picks: list[tuple[int, int]] = []
    for _ in range(count):
        specialty = 0
        if n > 1:
            u, acc = rng.random(), 0.0
            specialty = n - 1  # rounding: a u past the last cumulative sum falls on the last specialty
            for s, p in enumerate(probs):
                acc += p
                if u < acc:
                    specialty = s
                    break
        replay = [(i, rate) for i, rate in rates.replayable(specialty)
                  if (specialty, i) not in picks] if rates is not None else []
        if replay and rng.random() < ADAPTIVE_REPLAY:
            values = [signal_value(rate) for _, rate in replay]
            picks.append((specialty, replay[values.index(max(values))][0]))
            continue
        candidates = [rng.randrange(size) for _ in range(ADAPTIVE_CANDIDATES)]
        if rates is None:
            picks.append((specialty, candidates[0]))
            continue
        values = [signal_value(rates.instance(specialty, i)) for i in candidates]
        picks.append((specialty, candidates[values.index(max(values))]))
    return picks
