"""Paired ratios: ours against a baseline measured in the same run, the median over runs of the per-run ratio.

A ratio of two separate medians mixes runs taken under different machine load; the ratio of the two values of
one run, where they were interleaved, cancels most of it. The
per-run values are kept beside the ratio, so anyone can check it.
"""

from __future__ import annotations

import statistics


def per_run_ratios(ours: list[float], baseline: list[float]) -> list[float]:
    """ours[j] / baseline[j] for each run j (the two lists are the same runs, in order)."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"paired runs need equal, non-empty lists (got {len(ours)} and {len(baseline)})")
    return [o / b for o, b in zip(ours, baseline, strict=True)]


def paired_ratio(ours: list[float], baseline: list[float]) -> float:
    """The median of the per-run ratios."""
    return statistics.median(per_run_ratios(ours, baseline))
