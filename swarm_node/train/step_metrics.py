"""What a step's local completions cost: their length percentiles and the share of the step spent generating.

- `percentile(values, q)`: the q-th percentile (q in [0, 100]) by linear interpolation between the closest ranks
  (numpy's default method): rank q/100 x (n - 1) of the sorted values; 0.0 for no values.
- `completion_lengths(groups)`: the token count of each completion of the groups, EOS included.
- `completion_metrics(lengths, gen_s, step_s)`: metrics.jsonl's `completion_tokens_p50`, `completion_tokens_p95`
  (rounded to 2 decimals) and `gen_time_frac` (generation seconds / step seconds, rounded to 4 decimals; 0.0 when
  the step took no time). With generation overlapped on its own thread a step's seconds are the time since the
  previous step ended, so the fraction can exceed 1: generation then took longer than the step it fed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarm_node.types import ScoredGroup


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def completion_lengths(groups: Sequence[ScoredGroup]) -> list[int]:
    return [len(c.token_ids) for g in groups for c in g.completions]


def completion_metrics(lengths: Sequence[int], gen_s: float, step_s: float) -> dict[str, float]:
    return {"completion_tokens_p50": round(percentile(lengths, 50), 2),
            "completion_tokens_p95": round(percentile(lengths, 95), 2),
            "gen_time_frac": round(gen_s / step_s, 4) if step_s > 0 else 0.0}
