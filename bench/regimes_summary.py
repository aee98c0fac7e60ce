"""What `bench.sapo_regimes` reports per cell, from the cells' results and metrics rows (pure: no I/O, no runs).

Contract: a cell is one configuration over its seeds: per seed its result (simulations/runner.py: `seed`,
`cum_reward`, `final_eval_outcomes_per_node`) and its metrics.csv rows (one per node per round: `groups_total`,
`groups_used`, `external_signal`, `gen_tokens`). `summarise_cell(cells, rows, baseline)` gives exactly `CELL_KEYS`:
- `no_signal_frac`: the node's own groups without signal, over all its groups (seeds, nodes and rounds pooled);
  a dynamic-sampling node's groups are all it generated;
- `signal_groups_per_round`: groups with signal trained per node and round (its own with signal, plus the external
  ones with signal: all of them unless the zero-advantage filter is off);
- `cum_reward_mean`, `cum_reward_std`, `per_seed`: the cumulative reward as bench/sapo_mix.py defines it (per node
  the sum over rounds of the mean reward of its own completions, then the mean over nodes), over seeds;
- `heldout_acc_mean`, `heldout_ci95`: held-out accuracy, a seed's outcome per question the mean over its nodes (they
  answer the same questions), the interval from seeds, then questions, resampled (swarm_node/train/eval_stats.py);
- `heldout_vs_8_0_paired`: {diff, ci95}, against the baseline's cells (8/0) of the same seeds on the same
  questions, resampled the same way; None without a common seed;
- `local_tokens`: completion tokens the node generated over the run (mean node, mean over seeds).
A value that no finished seed supports is None. `best_ij(cells)`: the I/J configuration of larger cumulative
reward (4/4 or 2/6) and its gain over 8/0 in %.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from swarm_node.train import eval_stats

CELL_KEYS = ("no_signal_frac", "signal_groups_per_round", "cum_reward_mean", "cum_reward_std", "per_seed",
             "heldout_acc_mean", "heldout_ci95", "heldout_vs_8_0_paired", "local_tokens")
IJ_CANDIDATES = ("4/4", "2/6")  # "best I/J" is chosen among these (the ablations are no candidates)
BASELINE = "8/0"

Row = Mapping[str, Any]


def _number(row: Row, key: str) -> float:
    value = row.get(key)
    return 0.0 if value in (None, "") else float(value)


def no_signal_frac(rows: Sequence[Row]) -> float | None:
    total = sum(_number(r, "groups_total") for r in rows)
    return (total - sum(_number(r, "groups_used") for r in rows)) / total if total else None


def signal_groups_per_round(rows: Sequence[Row]) -> float | None:
    """Mean over (node, round) rows of the groups with signal the step trained."""
    if not rows:
        return None
    return statistics.fmean(_number(r, "groups_used") + _number(r, "external_signal") for r in rows)


def tokens_per_node(rows: Sequence[Row]) -> float | None:
    nodes = len({str(r["node"]) for r in rows})
    return sum(_number(r, "gen_tokens") for r in rows) / nodes if nodes else None


def seed_outcomes(result: Mapping[str, Any]) -> dict[str, float]:
    """{question: the mean over the cell's nodes of its outcome}, on the questions every node answered."""
    return eval_stats.mean_over_nodes(result.get("final_eval_outcomes_per_node") or [])


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def summarise_cell(cells: Sequence[Mapping[str, Any]], rows: Sequence[Sequence[Row]],
                   baseline: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`cells[i]`'s rows are `rows[i]`; `baseline`: the 8/0 cells of this regime (any seeds)."""
    pooled = [r for seed_rows in rows for r in seed_rows]
    cum_mean, cum_std = _mean_std([float(c["cum_reward"]) for c in cells])
    outcomes = {int(c["seed"]): o for c in cells if (o := seed_outcomes(c))}
    base = {int(c["seed"]): o for c in baseline if (o := seed_outcomes(c))}
    acc, ci, paired = None, None, None
    if outcomes:
        estimate = eval_stats.seeds_then_questions([outcomes[s] for s in sorted(outcomes)])
        acc, ci = estimate.mean, list(estimate.ci95)
    pairs = [eval_stats.paired_values(outcomes[s], base[s]) for s in sorted(outcomes) if s in base]
    if pairs:
        diff = eval_stats.seeds_then_questions(pairs)
        paired = {"diff": diff.mean, "ci95": list(diff.ci95)}
    return {"no_signal_frac": no_signal_frac(pooled), "signal_groups_per_round": signal_groups_per_round(pooled),
            "cum_reward_mean": cum_mean, "cum_reward_std": cum_std, "per_seed": [float(c["cum_reward"]) for c in cells],
            "heldout_acc_mean": acc, "heldout_ci95": ci, "heldout_vs_8_0_paired": paired,
            "local_tokens": _mean([tokens_per_node(r) for r in rows])}


def best_ij(cells: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """{"cell", "gain_vs_8_0_pct"}: the better of 4/4 and 2/6 in cumulative reward; None before 8/0 and one of them
    have finished a seed."""
    base = cells.get(BASELINE, {}).get("cum_reward_mean")
    done = [(c["cum_reward_mean"], name) for name in IJ_CANDIDATES
            if (c := cells.get(name)) is not None and c.get("cum_reward_mean") is not None]
    if not base or not done:
        return None
    reward, name = max(done)
    return {"cell": name, "gain_vs_8_0_pct": 100 * (reward / base - 1)}
