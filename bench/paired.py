"""Paired ratios: ours against a baseline measured in the same run, the median over runs of the per-run ratio.

A ratio of two separate medians mixes runs taken under different machine load; the ratio of the two values of
one run, where they were interleaved, cancels most of it. The
per-run values are kept beside the ratio, so anyone can check it.

- `per_run_ratios(ours, baseline)`, `paired_ratio(ours, baseline)`: ours[j] / baseline[j], and their median.
- `paired_ratio_or_none`: the same, or None when a run has no ratio (a baseline of 0, a NaN): no run is dropped.
- `round_order(arms, j)`: the arms in run j's order, rotated by j, so that no arm always goes first (load drifts
  within a run).
- `paired_runs(ours, baseline, keys)` / `paired_ratios(ours, baseline, keys)`: for runs given as dicts of values,
  each run's values of both arms with their ratio per key, and the paired ratio per key.
- `ratio_text(ratio)`: "1.23x", or "n/a" for None (a benchmark's summary line).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

Arm = TypeVar("Arm")


def per_run_ratios(ours: list[float], baseline: list[float]) -> list[float]:
    """ours[j] / baseline[j] for each run j (the two lists are the same runs, in order)."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"paired runs need equal, non-empty lists (got {len(ours)} and {len(baseline)})")
    return [o / b for o, b in zip(ours, baseline, strict=True)]


def paired_ratio(ours: list[float], baseline: list[float]) -> float:
    """The median of the per-run ratios."""
    return statistics.median(per_run_ratios(ours, baseline))


def _defined(value: float) -> bool:
    return math.isfinite(value)


def paired_ratio_or_none(ours: list[float], baseline: list[float]) -> float | None:
    """The paired ratio, or None when any run's ratio is undefined (a baseline of 0, a value NaN or infinite)."""
    if any(not _defined(o) or not _defined(b) or b == 0 for o, b in zip(ours, baseline, strict=True)):
        return None
    return paired_ratio(ours, baseline)


def round_order(arms: Sequence[Arm], run: int) -> list[Arm]:
    """The arms in run `run`'s order: rotated by `run`, so each arm goes first as often as the others."""
    shift = run % len(arms)
    return [*arms[shift:], *arms[:shift]]


def paired_runs(ours: Sequence[Mapping[str, float]], baseline: Sequence[Mapping[str, float]],
                keys: Sequence[str], names: tuple[str, str] = ("ours", "baseline")) -> list[dict[str, Any]]:
    """Run j: {key: {ours: value, baseline: value, ratio: ours / baseline (None when undefined)}} per key."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"paired runs need equal, non-empty lists (got {len(ours)} and {len(baseline)})")
    mine, theirs = names
    return [{k: {mine: o[k], theirs: b[k], "ratio": paired_ratio_or_none([o[k]], [b[k]])} for k in keys}
            for o, b in zip(ours, baseline, strict=True)]


def paired_ratios(ours: Sequence[Mapping[str, float]], baseline: Sequence[Mapping[str, float]],
                  keys: Sequence[str]) -> dict[str, float | None]:
    """{key: the median over runs of ours[j][key] / baseline[j][key]} (None when a run's ratio is undefined)."""
    return {k: paired_ratio_or_none([o[k] for o in ours], [b[k] for b in baseline]) for k in keys}


def ratio_text(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"
