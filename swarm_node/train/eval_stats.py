"""Intervals and paired comparisons for held-out evals: how sure a number is, and whether two arms differ.

Contract (pure: numpy only, deterministic for a given `seed`):
- An arm's outcomes are per question: a mapping {question key: score in [0, 1]} (1/0 for exact accuracy). A question
  asked more than once in one eval is one key whose score is the mean of its answers (`per_question`), so an
  interval never counts a repeated question twice: an eval is no larger than its distinct questions.
- `mean_over_nodes(per_node)`: several nodes' outcomes as one arm: per question, the mean over the nodes, on the
  questions every node answered (a swarm's nodes evaluated on the same questions).
- `mean_ci95(outcomes)`: the mean and the percentile-bootstrap 95% interval over questions.
- `paired_diff(a, b)`: on the questions both arms answered, the mean of a - b and its bootstrap interval, the pairs
  kept together (resampling questions, not arms), which cancels how hard each question is.
- `mcnemar_p(a, b)`: the exact two-sided McNemar p-value of two 0/1 arms on their common questions (a binomial test
  on the discordant questions).
- `seeds_then_questions(per_seed)`: the mean over seeds of each seed's mean, with an interval from a bootstrap that
  resamples seeds, then questions within each drawn seed, so the interval carries both sources of noise. The values
  may be gains (after - before of one question: `paired_values`).
An interval is `(low, high)`; with a single question (or seed) it is the point itself.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
_CHUNK = 250  # resamples drawn at once: bounds memory at 250 x questions indices


@dataclass(frozen=True)
class Estimate:
    mean: float
    ci95: tuple[float, float]
    n: int  # distinct questions (or seeds) it rests on

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.ci95[0]:.3f}, {self.ci95[1]:.3f}]"


def per_question(answers: Iterable[tuple[str, float]]) -> dict[str, float]:
    """(question key, score) pairs -> {key: mean score}: a repeated question counts once."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for key, score in answers:
        sums[key] += score
        counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


def mean_over_nodes(per_node: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """{question: the mean over the nodes of its outcome} on the questions all of them answered; {} without nodes."""
    if not per_node:
        return {}
    common = set.intersection(*(set(o) for o in per_node))
    return {q: statistics.fmean(o[q] for o in per_node) for q in sorted(common)}


def paired_values(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """{question: a - b} on the questions both arms answered."""
    common = sorted(a.keys() & b.keys())
    if not common:
        raise ValueError("the two arms share no question: a paired comparison needs the same questions")
    return {key: a[key] - b[key] for key in common}


def _bootstrap_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    n = len(values)
    out = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        out[start:start + size] = values[rng.integers(0, n, size=(size, n))].mean(axis=1)
    return out


def _interval(draws: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


def mean_ci95(outcomes: Mapping[str, float], resamples: int = RESAMPLES, seed: int = 0) -> Estimate:
    if not outcomes:
        raise ValueError("no questions to estimate from")
    values = np.array([outcomes[k] for k in sorted(outcomes)], dtype=np.float64)
    mean = float(values.mean())
    if len(values) == 1:
        return Estimate(mean, (mean, mean), 1)
    return Estimate(mean, _interval(_bootstrap_means(values, resamples, np.random.default_rng(seed))), len(values))


def paired_diff(a: Mapping[str, float], b: Mapping[str, float], resamples: int = RESAMPLES,
                seed: int = 0) -> Estimate:
    return mean_ci95(paired_values(a, b), resamples, seed)


def mcnemar_p(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Exact two-sided p-value; scores other than 0 and 1 are refused (the test is for right/wrong outcomes)."""
    diffs = paired_values(a, b)
    if any(a[k] not in (0.0, 1.0) or b[k] not in (0.0, 1.0) for k in diffs):
        raise ValueError("McNemar's test needs 0/1 outcomes; use paired_diff for scores")
    only_a = sum(1 for d in diffs.values() if d > 0)
    discordant = only_a + sum(1 for d in diffs.values() if d < 0)
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(only_a, discordant - only_a) + 1)) / 2 ** discordant
    return min(1.0, 2 * tail)


def seeds_then_questions(per_seed: Sequence[Mapping[str, float]], resamples: int = RESAMPLES,
                         seed: int = 0) -> Estimate:
    """Mean over seeds of the per-seed means; the interval resamples seeds, then questions within each drawn seed."""
    if not per_seed or any(not outcomes for outcomes in per_seed):
        raise ValueError("every seed needs at least one question")
    rng = np.random.default_rng(seed)
    arrays = [np.array([o[k] for k in sorted(o)], dtype=np.float64) for o in per_seed]
    mean = float(np.mean([v.mean() for v in arrays]))
    k = len(arrays)
    # Each seed's own question-resampled means, one per (resample, slot): a seed drawn twice in one resample gets
    # two independent question resamples, as a nested bootstrap would.
    inner = [_bootstrap_means(v, resamples * k, rng) if len(v) > 1 else np.full(resamples * k, v[0])
             for v in arrays]
    picks = rng.integers(0, k, size=(resamples, k))
    draws = np.array([np.mean([inner[s][r * k + j] for j, s in enumerate(picks[r])]) for r in range(resamples)])
    if k == 1 and len(arrays[0]) == 1:
        return Estimate(mean, (mean, mean), 1)
    return Estimate(mean, _interval(draws), k)
